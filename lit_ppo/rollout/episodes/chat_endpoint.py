"""A local HTTP endpoint speaking the OpenAI chat protocol, for agents in other processes or frameworks:
``POST /v1/chat/completions`` and ``GET /v1/models`` on the loopback interface only, each request served by
the ``EngineChatClient`` of its episode.

An episode is named by its key, which the agent gives as its API key (``openai.OpenAI(base_url=url,
api_key=key)``; the SDK sends it as ``Authorization: Bearer <key>``), so an unchanged OpenAI client is
attributed to its episode. A request without a key, for an unknown key or for an episode that has ended
is refused (401 / 404).

Every refusal is in the error shape of the OpenAI API, ``{"error": {"message", "type", "param", "code"}}``:
what the client got wrong is a 4xx of type ``invalid_request_error`` whose one-line message names the
parameter (also in ``param``) and what is allowed; a 5xx of type ``server_error`` is the trainer's own
failure. ``http.server`` parses the request line and the headers and refuses their faults (in this shape
too); the body is read as ``lit_ppo.rollout.episodes.http_request`` reads it (Content-Length or chunked, at
most 8 MiB, JSON nested at most 64 levels); a client that stops sending for ``READ_TIMEOUT_S`` is answered
408 and disconnected. No client's request makes the trainer print anything, and the endpoint serves the
next request after any of them. ``close()`` stops serving and frees the port.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lit_ppo.rollout.episodes.chat_client import EngineChatClient, InvalidRequest
from lit_ppo.rollout.episodes.http_request import Refused, parse_json, read_body

LOOPBACK = "127.0.0.1"
"""The only interface the endpoint listens on: agents run on the trainer's machine."""
READ_TIMEOUT_S = 60.0
"""How long a connection may be silent while a request is read (or between requests) before it is closed."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every episode in flight may connect at once (the default backlog of 5 resets them)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A connection that the client reset or let time out is the client's business, not the trainer's.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class ChatEndpoint:
    """The endpoint: ``open(client)`` an episode, hand its ``key`` and ``url`` to the agent, ``close_episode``
    when the episode ends; ``close()`` when the rollout ends (also on leaving a ``with`` block).

    Args:
        model: the model name ``GET /v1/models`` lists and the completions report.
        port: the port to listen on; 0 (the default) takes a free one.
    """

    def __init__(self, model: str = "lit_ppo-policy", port: int = 0):
        self.model = model
        self._episodes: dict[str, EngineChatClient] = {}
        self._lock = threading.Lock()
        self._server = _Server((LOOPBACK, port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="lit_ppo-chat-endpoint", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes: ``http://127.0.0.1:<port>/v1``."""
        return f"http://{LOOPBACK}:{self._server.server_address[1]}/v1"

    def open(self, client: EngineChatClient) -> str:
        """Serve the episode of ``client``; its key (the agent's API key)."""
        key = "ep-" + secrets.token_hex(12)
        with self._lock:
            self._episodes[key] = client
        return key

    def close_episode(self, key: str) -> None:
        """The episode ``key`` has ended: its requests are refused from now on."""
        with self._lock:
            self._episodes.pop(key, None)

    def client(self, key: str) -> EngineChatClient | None:
        """The client of the open episode ``key``, or None."""
        with self._lock:
            return self._episodes.get(key)

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> ChatEndpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _handler(endpoint: ChatEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S

        def log_message(self, format: str, *args: Any) -> None:  # the trainer's output is not an access log
            pass

        def do_GET(self) -> None:
            self._body_read = False
            if self.path.rstrip("/") != "/v1/models":
                return self._no_route()
            self._send(HTTPStatus.OK, {"object": "list", "data": [
                {"id": endpoint.model, "object": "model", "created": 0, "owned_by": "lit_ppo"}]})

        def do_POST(self) -> None:
            self._body_read = False
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._no_route()
            key = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not key:
                return self._error(HTTPStatus.UNAUTHORIZED, "no episode key: give the episode's key as the "
                                   "client's api_key", "invalid_api_key")
            client = endpoint.client(key)
            if client is None:
                return self._error(HTTPStatus.NOT_FOUND, f"episode {key[:12]}... is unknown or has ended: each "
                                   f"episode's requests need its own key while it runs", "episode_not_found")
            try:
                body = read_body(self.headers, self.rfile)
                self._body_read = True
                request = parse_json(body)
            except Refused as e:
                self.close_connection = not self._body_read  # where its body ends is unknown
                return self._error(e.status, e.message, e.code)
            if not isinstance(request, dict):
                return self._error(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object of the "
                                   "request's parameters", "invalid_json")
            try:
                completion = client.create(**request)
            except InvalidRequest as e:
                return self._error(HTTPStatus.BAD_REQUEST, str(e), e.code, e.param)
            except Exception as e:  # the trainer's own failure: the agent hears it, the rollout's own error follows
                return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"the trainer failed to serve the request: "
                                   f"{type(e).__name__}: {e}", "server_error")
            self._send(HTTPStatus.OK, completion.model_dump(exclude_none=True))

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            # What http.server refuses itself (a malformed request line or header, a method it has no
            # handler for, ...), in the API's shape rather than its HTML page.
            status = HTTPStatus(code)
            self.close_connection = True
            if self.request_version == "HTTP/0.9":  # a request line it could not parse: answer with a status line
                self.request_version = self.protocol_version
            self._error(status, f"{message or status.phrase}: {explain or status.description}",
                        status.phrase.lower().replace(" ", "_").replace("-", "_"))

        def _no_route(self) -> None:
            self._error(HTTPStatus.NOT_FOUND, f"no route {self.command} {self.path}: the endpoint serves POST "
                        f"/v1/chat/completions and GET /v1/models", "not_found")

        def _error(self, status: HTTPStatus, message: str, code: str, param: str | None = None) -> None:
            kind = "server_error" if status >= 500 else "invalid_request_error"
            self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": code}})

        def _send(self, status: HTTPStatus, body: dict) -> None:
            if not self.close_connection and not self._body_read and (
                    "Transfer-Encoding" in self.headers or self.headers.get("Content-Length", "0").strip() != "0"):
                self.close_connection = True  # its unread body must not be taken for the next request
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

    return Handler
