"""A loopback OpenAI-compatible server playing an LLM judge, for the tests of ``judge`` rewards."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "judge-model"
"""The model the fake serves by default."""


def grade(messages: list[dict]) -> str:
    """A judge that knows the default template: correct where the answer to grade is the reference."""
    reference, graded = re.search(r"Reference answer:\n(.*?)\n\nAnswer to grade:\n(.*?)\n\n",
                                  messages[-1]["content"], re.S).groups()
    return f"The answer is {graded}. VERDICT: {'correct' if graded.strip() == reference.strip() else 'incorrect'}"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("retry-after-ms", "10")  # the client's retries come at once
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a timeout test)
            pass

    def do_GET(self):
        fake = self.server.fake
        if fake.key is not None and self.headers.get("Authorization") != f"Bearer {fake.key}":
            return self._send(401, {"error": {"message": "bad key", "type": "auth"}})
        self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "me"}
                                                    for m in fake.models]})

    def do_POST(self):
        fake = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fake.requests.append((self.headers.get("Authorization"), body))
        time.sleep(fake.delay)
        if fake.status != 200:
            return self._send(fake.status, {"error": {"message": "server broke", "type": "internal"}})
        self._send(200, {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop", "message": {
                             "role": "assistant", "content": fake.reply(body["messages"])}}]})


class Server(ThreadingHTTPServer):
    request_queue_size = 64  # concurrent connects must not wait for the listen backlog


class FakeJudge:
    """A loopback OpenAI-compatible server: ``GET /v1/models`` lists ``models`` (HTTP 401 unless the Bearer key
    is ``key``, where set); ``POST /v1/chat/completions`` is recorded in ``requests`` and answered
    ``reply(messages)`` after ``delay`` seconds, or HTTP ``status``."""

    def __init__(self):
        self.models, self.reply, self.delay, self.status, self.key = [MODEL], grade, 0.0, 200, None
        self.requests: list[tuple[str, dict]] = []
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.fake = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
