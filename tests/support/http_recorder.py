"""A loopback HTTP forwarder that records every POST and the answer it got: what a client
delivered to a real service, in order (Alertmanager keeps no history of what it was sent).
While the service is down the client gets the connection error as a 503."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

__all__ = ["HttpRecorder", "Post"]


@dataclass(frozen=True)
class Post:
    at: float  # wall time the answer came back
    path: str
    status: int  # the service's answer, 503 when it could not be reached
    body: Any  # the JSON posted


class HttpRecorder:
    """Listens on 127.0.0.1 (random port) and forwards to ``target`` (a base URL)."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.posts: list[Post] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    r = requests.post(
                        recorder.target + self.path,
                        data=raw,
                        headers={"Content-Type": self.headers.get("Content-Type") or "application/json"},
                        timeout=10,
                    )
                    status, answer = r.status_code, r.content
                except requests.RequestException:
                    status, answer = 503, b"unreachable"
                with recorder._lock:
                    recorder.posts.append(Post(time.time(), self.path, status, json.loads(raw or b"null")))
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def accepted(self) -> list[Post]:
        with self._lock:
            return [p for p in self.posts if p.status < 300]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HttpRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
