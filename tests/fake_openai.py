"""A fake OpenAI-compatible server for the endpoint tests, over real sockets on 127.0.0.1.

It lists the models it is given and streams 'one two three' as three SSE
deltas, a stop chunk, then (where given) one chunk with no choices carrying
the extras a real server sends last: OpenAI's usage, llama-server's timings
or an error event. Every request body is kept for the test to inspect.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STREAMED = ("one", " two", " three")


def handler_for(listing: dict, final_extras: dict, bodies: list) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler answering GET (any path) with `listing` and POST with the stream above."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps(listing).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in STREAMED:
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self.wfile.write(f"data: {json.dumps(end)}\n\n".encode())
            if final_extras:
                self.wfile.write(f"data: {json.dumps({'choices': [], **final_extras})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@contextmanager
def fake_openai(listing: dict, final_extras: dict | None = None, bodies: list | None = None) -> Iterator[str]:
    """Serve on an ephemeral port while the block runs; yields the base URL (http://127.0.0.1:port)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(listing, final_extras or {},
                                                                            [] if bodies is None else bodies))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
