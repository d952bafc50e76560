"""An OpenAI-style server that answers only requests carrying its key, as vLLM does when started with one: run
as a program (``python keyed_endpoint.py PORT HOST KEY_VARIABLE``), it reads its key from the environment
variable named KEY_VARIABLE, answers GET /health without a key (vLLM's /health needs none), refuses a POST
without ``Authorization: Bearer <key>`` with 401, and streams ``max_tokens`` words (t1 t2 ...) as chat chunks
to one with it. Without a key in its environment it refuses to start: the test is about a server that has one.
"""

from __future__ import annotations

import http.server
import json
import os
import sys


class KeyedEndpoint(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    key = ""

    def do_GET(self) -> None:  # http.server calls it by this name
        status = 200 if self.path == "/health" else 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:  # http.server calls it by this name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            page = b'{"error": "Unauthorized"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        count = int(body.get("max_tokens", 1))
        for index in range(1, count + 1):
            event = {"choices": [{"index": 0, "delta": {"content": f"{' ' if index > 1 else ''}t{index}"},
                                  "finish_reason": "length" if index == count else None}]}
            self._chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    port, host, variable = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    KeyedEndpoint.key = os.environ.get(variable, "")
    if not KeyedEndpoint.key:
        sys.exit(f"keyed_endpoint: {variable} is not set; this server needs a key")
    server = http.server.ThreadingHTTPServer((host, port), KeyedEndpoint)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
