"""An OpenAI-style endpoint that refuses every request with a 401 page quoting the Authorization header it got,
as some gateways do, and remembers what it got: where a key must not land in any file, log or record."""

from __future__ import annotations

import http.server
from typing import ClassVar


class QuotingEndpoint(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[str]] = []

    def do_POST(self) -> None:  # http.server calls it by this name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        said = self.headers.get("Authorization", "")
        self.received.append(said)
        body = f"invalid credentials: Authorization: {said}".encode()
        self.send_response(401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass
