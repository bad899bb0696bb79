"""A local HTTP endpoint speaking the OpenAI chat protocol, for agents in other processes or frameworks:
``POST /v1/chat/completions`` and ``GET /v1/models`` on the loopback interface only, each request served by
the ``EngineChatClient`` of its episode.

An episode is named by its key, which the agent gives as its API key (``openai.OpenAI(base_url=url,
api_key=key)``; the SDK sends it as ``Authorization: Bearer <key>``), so an unchanged OpenAI client is
attributed to its episode. A request without a key, for an unknown key or for an episode that has ended
is refused (401 / 404), and a request the client cannot honour gets 400 with its one-line reason, in the
error shape of the OpenAI API. ``close()`` stops serving and frees the port.
"""

from __future__ import annotations

import json
import secrets
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lit_ppo.rollout.episodes.chat_client import EngineChatClient

LOOPBACK = "127.0.0.1"
"""The only interface the endpoint listens on: agents run on the trainer's machine."""
MAX_BODY = 64 * 2**20
"""The largest request body read (bytes)."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every episode in flight may connect at once (the default backlog of 5 resets them)


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

        def log_message(self, format: str, *args: Any) -> None:  # the trainer's output is not an access log
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                return self._error(HTTPStatus.NOT_FOUND, f"no route {self.path}: the endpoint serves POST "
                                   f"/v1/chat/completions and GET /v1/models", "not_found")
            self._send(HTTPStatus.OK, {"object": "list", "data": [
                {"id": endpoint.model, "object": "model", "created": 0, "owned_by": "lit_ppo"}]})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._error(HTTPStatus.NOT_FOUND, f"no route {self.path}: the endpoint serves POST "
                                   f"/v1/chat/completions and GET /v1/models", "not_found")
            key = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not key:
                return self._error(HTTPStatus.UNAUTHORIZED, "no episode key: give the episode's key as the "
                                   "client's api_key", "invalid_api_key")
            client = endpoint.client(key)
            if client is None:
                return self._error(HTTPStatus.NOT_FOUND, f"episode {key[:12]}... is unknown or has ended: each "
                                   f"episode's requests need its own key while it runs", "episode_not_found")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request holds {length} bytes, more "
                                   f"than {MAX_BODY}", "request_too_large")
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError as e:
                return self._error(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {e}", "invalid_json")
            if not isinstance(request, dict):
                return self._error(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object", "invalid_json")
            try:
                completion = client.create(**request)
            except ValueError as e:
                return self._error(HTTPStatus.BAD_REQUEST, str(e), "invalid_request_error")
            except Exception as e:  # the engine failed: the agent hears it, the rollout's own error follows
                return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"the rollout engine failed: "
                                   f"{type(e).__name__}: {e}", "engine_error")
            self._send(HTTPStatus.OK, completion.model_dump(exclude_none=True))

        def _error(self, status: HTTPStatus, message: str, code: str) -> None:
            kind = "invalid_request_error" if status == HTTPStatus.BAD_REQUEST else code
            self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})

        def _send(self, status: HTTPStatus, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
