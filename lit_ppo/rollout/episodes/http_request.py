"""An HTTP/1.1 request's body and the JSON in it, read as a server facing an untrusted client must: the
body as its headers delimit it (``Content-Length``, or ``Transfer-Encoding: chunked``), at most
``MAX_BODY`` bytes, and JSON nested at most ``MAX_DEPTH`` levels. Whatever the client got wrong is a
``Refused`` naming the status, the cause and what is allowed; nothing is guessed (a body with both
headers, or several lengths, is refused: the framing a proxy and this server would read differently).

``http.server`` parses the request line and the headers (and refuses their own faults); it leaves the
body to its handler, which is this.
"""

from __future__ import annotations

import json
import re
from email.message import Message
from http import HTTPStatus
from typing import Any, BinaryIO

MAX_BODY = 8 * 2**20
"""The largest request body read (bytes): a conversation of a model's whole context is far smaller."""
MAX_DEPTH = 64
"""The deepest JSON nesting taken (a tool's parameter schema is a few levels; deeper is an attack)."""
MAX_LINE = 4096
"""The longest chunk-size or trailer line read (bytes)."""
MAX_TRAILERS = 32
"""The most trailer lines after a chunked body."""
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")


class Refused(Exception):
    """A request refused before it is served: ``status``, its one-line ``message`` and the error ``code``."""

    def __init__(self, status: HTTPStatus, message: str, code: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def read_body(headers: Message, rfile: BinaryIO) -> bytes:
    """The body that ``headers`` announce, read from ``rfile``; Refused for framing the server does not
    take, a body over ``MAX_BODY`` (413), none announced (411) or one that stops short (400; 408 for a
    client that stops sending)."""
    codings = headers.get_all("Transfer-Encoding") or []
    lengths = headers.get_all("Content-Length") or []
    try:
        if codings:
            if lengths:
                raise Refused(HTTPStatus.BAD_REQUEST, "the request has both Transfer-Encoding and Content-Length: "
                              "give one of them", "invalid_framing")
            named = [c.strip().lower() for c in ",".join(codings).split(",")]
            if named != ["chunked"]:
                raise Refused(HTTPStatus.NOT_IMPLEMENTED, f"Transfer-Encoding: {', '.join(codings)} is not read: "
                              f"send the body with a Content-Length or as Transfer-Encoding: chunked",
                              "unsupported_transfer_encoding")
            return _chunked(rfile)
        if not lengths:
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "the request has no Content-Length: give the body's length in "
                          "bytes (or send it as Transfer-Encoding: chunked)", "length_required")
        return _sized(lengths, rfile)
    except TimeoutError:
        raise Refused(HTTPStatus.REQUEST_TIMEOUT, "the client stopped sending the request body", "timeout") from None


def _sized(lengths: list[str], rfile: BinaryIO) -> bytes:
    value = lengths[0].strip()
    if len(set(v.strip() for v in lengths)) > 1 or not _DIGITS.fullmatch(value):
        raise Refused(HTTPStatus.BAD_REQUEST, f"Content-Length: {', '.join(lengths)} is invalid: must be one "
                      f"number of bytes (digits only)", "invalid_content_length")
    digits = value.lstrip("0")
    if len(digits) > len(str(MAX_BODY)) or int(digits or "0") > MAX_BODY:
        raise _too_large(f"Content-Length: {value}")
    length = int(digits or "0")
    body = rfile.read(length)
    if len(body) < length:
        raise Refused(HTTPStatus.BAD_REQUEST, f"the request body ended after {len(body)} of its Content-Length "
                      f"{length} bytes", "incomplete_body")
    return body


def _chunked(rfile: BinaryIO) -> bytes:
    """A chunked body (RFC 9112 section 7.1): chunks of a hexadecimal size line, its data and CRLF, up to a
    chunk of size 0, then trailer lines up to an empty one (read and dropped)."""
    body = bytearray()
    while True:
        line = rfile.readline(MAX_LINE + 1)
        size = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\r\n") or not _HEX.fullmatch(size):
            raise Refused(HTTPStatus.BAD_REQUEST, f"the chunked body holds an invalid chunk-size line "
                          f"{line[:40]!r}: must be a hexadecimal size and CRLF", "invalid_chunk")
        if int(size, 16) == 0:
            break
        if len(body) + int(size, 16) > MAX_BODY:
            raise _too_large("the chunked body")
        chunk = rfile.read(int(size, 16))
        if len(chunk) < int(size, 16) or rfile.read(2) != b"\r\n":
            raise Refused(HTTPStatus.BAD_REQUEST, "the chunked body ended inside a chunk, or a chunk's data is not "
                          "followed by CRLF", "invalid_chunk")
        body += chunk
    for _ in range(MAX_TRAILERS + 1):
        line = rfile.readline(MAX_LINE + 1)
        if line == b"\r\n":
            return bytes(body)
        if not line.endswith(b"\r\n"):
            break
    raise Refused(HTTPStatus.BAD_REQUEST, f"the chunked body's trailer does not end in an empty line within "
                  f"{MAX_TRAILERS} lines of at most {MAX_LINE} bytes", "invalid_chunk")


def _too_large(what: str) -> Refused:
    return Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"{what} is more than the {MAX_BODY} bytes a request may "
                   f"hold", "request_too_large")


def parse_json(body: bytes) -> Any:
    """The JSON value of ``body`` (UTF-8, standard JSON: no NaN or Infinity, nested at most ``MAX_DEPTH``
    levels); Refused (400) otherwise."""
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except RecursionError:  # the decoder recurses once per level
        raise _too_deep() from None
    except ValueError as e:  # not JSON, not UTF-8, a number of more digits than int() takes
        raise Refused(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {e}", "invalid_json") from None
    if _depth(value) > MAX_DEPTH:
        raise _too_deep()
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def _too_deep() -> Refused:
    return Refused(HTTPStatus.BAD_REQUEST, f"the request body is JSON nested more than {MAX_DEPTH} levels deep",
                   "invalid_json")


def _depth(value: Any) -> int:
    """How deep ``value``'s arrays and objects nest (a scalar: 0), counted without recursion and only as
    far as one level past ``MAX_DEPTH``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
