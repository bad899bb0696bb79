"""The agents' chat endpoint (lit_ppo.rollout.episodes.chat_endpoint) under a hostile client: raw bytes on a
real socket. Every malformed request gets a response in the OpenAI API's error shape, 4xx naming the
parameter at fault and what is allowed; the trainer prints nothing; the next request is served."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from lit_ppo.rollout.episodes import chat_endpoint
from lit_ppo.rollout.episodes.chat_endpoint import ChatEndpoint
from lit_ppo.rollout.episodes.http_request import MAX_BODY
from tests.unit.rollout.episodes.test_chat_client import TOOLS_CHATML, client_of

GOOD = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
READ_TIMEOUT_S = 0.5
"""The endpoint's read timeout in these tests (60 s in a run)."""


@pytest.fixture(scope="module")
def served():
    """An endpoint on a fake engine that answers ``ok`` to every request, and an open episode's key."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chat_endpoint, "READ_TIMEOUT_S", READ_TIMEOUT_S)
        client, engine, _ = client_of(TOOLS_CHATML, *["ok"] * 200)
        with ChatEndpoint(model="policy") as endpoint:
            endpoint.key = endpoint.open(client)
            endpoint.engine = engine
            yield endpoint


def port_of(endpoint: ChatEndpoint) -> int:
    return endpoint._server.server_address[1]


def post(endpoint: ChatEndpoint, body: bytes, *headers: str, length: str | None = None) -> bytes:
    """A raw POST /v1/chat/completions with the episode's key; ``length`` replaces the true Content-Length
    (None: the body's length; "" for none)."""
    length = str(len(body)) if length is None else length
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {endpoint.key}",
             "Content-Type: application/json", *([f"Content-Length: {length}"] if length else []), *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(endpoint: ChatEndpoint, raw: bytes) -> tuple[socket.socket, http.client.HTTPResponse, dict]:
    """Send ``raw`` on a new connection; the connection, the response and its JSON body."""
    sock = socket.create_connection(("127.0.0.1", port_of(endpoint)), timeout=10)
    sock.sendall(raw)
    response = http.client.HTTPResponse(sock)
    response.begin()
    return sock, response, json.loads(response.read())


def answered(endpoint: ChatEndpoint, sock: socket.socket) -> bool:
    """Whether a good request on the open connection ``sock`` is answered 200 with the completion."""
    sock.sendall(post(endpoint, GOOD))
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status == 200 and json.loads(response.read())["choices"][0]["message"]["content"] == "ok"


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    return sock.recv(1) == b""


def error(message: str, param: str | None, code: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def assert_served_next_and_quiet(endpoint: ChatEndpoint, capfd) -> None:
    """A good request on a new connection is served, and the trainer's process printed nothing."""
    with socket.create_connection(("127.0.0.1", port_of(endpoint)), timeout=10) as sock:
        assert answered(endpoint, sock)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


PREFIX = "chat.completions.create: "
CALL = {"type": "function", "function": {"name": "calc", "arguments": "{}"}}


@pytest.mark.parametrize("request_, expected", [
    ({"messages": 5}, error(PREFIX + "messages is an integer: must be an array of message objects", "messages",
                            "invalid_type")),
    ({"messages": [{"role": "user", "content": 5}]},
     error(PREFIX + "messages[0].content is an integer: must be a string or an array of text parts",
           "messages[0].content", "invalid_type")),
    ({"messages": [{"role": "user", "content": "12*7?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                   {"role": "tool", "tool_call_id": "call_0", "content": "84"}]},
     error(PREFIX + "messages[1].tool_calls[0].id is missing: it is required", "messages[1].tool_calls[0].id",
           "missing_required_parameter")),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
     error(PREFIX + "temperature='hot' cannot be honoured: the rollout samples at temperature=1.0, under which the "
           "trainer recomputes the log-probs; leave it out or give 1.0", "temperature", "invalid_type")),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": [7]},
     error(PREFIX + "stop=[7] is invalid: must be a string or an array of strings", "stop", "invalid_type")),
    ({"messages": [{"role": "user", "content": "hi"}], "seed": "x"},
     error(PREFIX + "seed='x' is invalid: must be a non-negative integer", "seed", "invalid_type")),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     error(PREFIX + "messages[0].content[0].text is an integer: must be a string", "messages[0].content[0].text",
           "invalid_type")),
])
def test_a_request_of_the_wrong_shape_is_a_400_naming_the_parameter(served, capfd, request_, expected):
    body = json.dumps({"model": "policy", **request_}).encode()
    prompts = len(served.engine.prompts)
    sock, response, answer = exchange(served, post(served, body))
    with sock:
        assert response.status == 400 and answer == expected
        assert answered(served, sock)  # the same connection serves the next request
    assert len(served.engine.prompts) == prompts + 1  # only the good one was sampled
    assert_served_next_and_quiet(served, capfd)


@pytest.mark.parametrize("body, message", [
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "the request body is JSON nested more than 64 levels "
                                                                  "deep"),
    (b'{"messages": ' + b"[" * 65 + b"]" * 65 + b"}", "the request body is JSON nested more than 64 levels deep"),
    (b'{"messages": [', "the request body is not JSON: Expecting value: line 1 column 15 (char 14)"),
    (b'{"temperature": NaN}', "the request body is not JSON: NaN is not a JSON value"),
    (b'{"model": "\xff"}', "the request body is not JSON: 'utf-8' codec can't decode byte 0xff in position 11: "
                           "invalid start byte"),
    (b"[]", "the request body must be a JSON object of the request's parameters"),
])
def test_a_body_that_is_not_a_json_object_is_a_400(served, capfd, body, message):
    sock, response, answer = exchange(served, post(served, body))
    with sock:
        assert response.status == 400 and answer == error(message, None, "invalid_json")
        assert answered(served, sock)
    assert_served_next_and_quiet(served, capfd)


@pytest.mark.parametrize("length, headers, status, expected", [
    ("abc", [], 400, error("Content-Length: abc is invalid: must be one number of bytes (digits only)", None,
                           "invalid_content_length")),
    ("-1", [], 400, error("Content-Length: -1 is invalid: must be one number of bytes (digits only)", None,
                          "invalid_content_length")),
    (None, ["Content-Length: 3"], 400, error(f"Content-Length: {len(GOOD)}, 3 is invalid: must be one number of "
                                             f"bytes (digits only)", None, "invalid_content_length")),
    (str(MAX_BODY + 1), [], 413, error(f"Content-Length: {MAX_BODY + 1} is more than the {MAX_BODY} bytes a "
                                       f"request may hold", None, "request_too_large")),
    ("9" * 5000, [], 413, error(f"Content-Length: {'9' * 5000} is more than the {MAX_BODY} bytes a request may hold",
                                None, "request_too_large")),
    ("", [], 411, error("the request has no Content-Length: give the body's length in bytes (or send it as "
                        "Transfer-Encoding: chunked)", None, "length_required")),
    (None, ["Transfer-Encoding: chunked"], 400, error("the request has both Transfer-Encoding and Content-Length: "
                                                      "give one of them", None, "invalid_framing")),
    ("", ["Transfer-Encoding: gzip, chunked"], 501, error(
        "Transfer-Encoding: gzip, chunked is not read: send the body with a Content-Length or as Transfer-Encoding: "
        "chunked", None, "unsupported_transfer_encoding", "server_error")),
])
def test_a_body_framed_wrong_is_refused_and_the_connection_closed(served, capfd, length, headers, status, expected):
    sock, response, answer = exchange(served, post(served, GOOD, *headers, length=length))
    with sock:
        assert response.status == status and answer == expected
        assert response.getheader("Connection") == "close" and closed_by_server(sock)
    assert_served_next_and_quiet(served, capfd)


def chunked(*chunks: bytes, end: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + end


def test_a_chunked_body_is_read(served, capfd):
    prompts = len(served.engine.prompts)
    half = len(GOOD) // 2
    raw = post(served, chunked(GOOD[:half], GOOD[half:], end=b"0\r\nX-Trailer: 1\r\n\r\n"),
               "Transfer-Encoding: chunked", length="")
    sock, response, answer = exchange(served, raw)
    with sock:
        assert response.status == 200 and answer["choices"][0]["message"]["content"] == "ok"
        assert answered(served, sock)
    assert len(served.engine.prompts) == prompts + 2
    assert_served_next_and_quiet(served, capfd)


@pytest.mark.parametrize("body, status, expected", [
    (b"zz\r\n" + GOOD + b"\r\n0\r\n\r\n", 400, error(
        "the chunked body holds an invalid chunk-size line b'zz\\r\\n': must be a hexadecimal size and CRLF", None,
        "invalid_chunk")),
    (b"%x\r\n%sXX0\r\n\r\n" % (len(GOOD), GOOD), 400, error(
        "the chunked body ended inside a chunk, or a chunk's data is not followed by CRLF", None, "invalid_chunk")),
    (b"%x\r\n" % (MAX_BODY + 1), 413, error(f"the chunked body is more than the {MAX_BODY} bytes a request may hold",
                                            None, "request_too_large")),
    (chunked(GOOD, end=b"0\r\n" + b"X: 1\r\n" * 40 + b"\r\n"), 400, error(
        "the chunked body's trailer does not end in an empty line within 32 lines of at most 4096 bytes", None,
        "invalid_chunk")),
])
def test_a_malformed_chunked_body_is_refused(served, capfd, body, status, expected):
    sock, response, answer = exchange(served, post(served, body, "Transfer-Encoding: chunked", length=""))
    with sock:
        assert response.status == status and answer == expected and closed_by_server(sock)
    assert_served_next_and_quiet(served, capfd)


def test_a_client_that_stops_sending_is_answered_408_and_one_that_hangs_up_is_forgotten(served, capfd):
    raw = post(served, GOOD)
    started = time.monotonic()
    sock, response, answer = exchange(served, raw[:-5])  # the body's last 5 bytes never come
    with sock:
        assert response.status == 408 and answer == error("the client stopped sending the request body", None,
                                                          "timeout")
        assert closed_by_server(sock) and time.monotonic() - started < READ_TIMEOUT_S + 5
    for cut in (raw[:-5], raw[:20]):  # hung up inside the body, inside the request line
        with socket.create_connection(("127.0.0.1", port_of(served)), timeout=10) as gone:
            gone.sendall(cut)
    time.sleep(READ_TIMEOUT_S)
    assert_served_next_and_quiet(served, capfd)


@pytest.mark.parametrize("raw, status, expected", [
    (b"PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 501,
     error("Unsupported method ('PUT'): Server does not support this operation", None, "not_implemented",
           "server_error")),
    (b"GARBAGE\r\n\r\n", 400, error("Bad request syntax ('GARBAGE'): Bad request syntax or unsupported method", None,
                                    "bad_request")),
    (b"GET /v1/models HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431, error(
        "Too many headers: got more than 100 headers", None, "request_header_fields_too_large")),
    (b"GET /v1/" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, error(
        "Request-URI Too Long: URI is too long", None, "request_uri_too_long")),
])
def test_what_the_http_library_refuses_is_in_the_api_error_shape(served, capfd, raw, status, expected):
    sock, response, answer = exchange(served, raw)
    with sock:
        assert response.status == status and answer == expected and closed_by_server(sock)
    assert_served_next_and_quiet(served, capfd)


def test_a_failure_of_the_trainer_is_a_500_that_blames_no_one_else(served, capfd, monkeypatch):
    def fails(prompts, params):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(served.engine, "generate", fails)
    sock, response, answer = exchange(served, post(served, GOOD))
    with sock:
        assert response.status == 500 and answer == error(
            "the trainer failed to serve the request: RuntimeError: CUDA out of memory", None, "server_error",
            "server_error")
    monkeypatch.undo()
    assert_served_next_and_quiet(served, capfd)
