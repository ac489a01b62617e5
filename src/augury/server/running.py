"""Running the app under uvicorn: bounded request reads, and a drain on SIGTERM that ends in bounded time.

uvicorn alone has neither. Its one timer is the keep-alive wait between
requests, which any byte stops, so a client may trickle a request head one
byte at a time for as long as it likes and a few such clients hold
connections forever; `BoundedH11` gives every request head a deadline (the
body's deadline is the app's, see `read_json`).
And on SIGTERM uvicorn closes its listening socket, then waits for open
connections without limit, so a long stream keeps the process alive and the
scheduler's shutdown path never runs. `DrainingServer` drains first instead:

    t0            SIGTERM (or Ctrl-C): new generation requests get 503 shutting_down, /health 503 "draining";
                  the socket stays open, so clients are told rather than refused
    until t0+T-F  running and queued requests may finish
    then          the scheduler stops: what still runs ends with an SSE error event (streams) or a 503 body
    by t0+T       connections are closed and the process exits (T = shutdown_timeout, F = min(5, T/2))

A second signal exits at once. After a SIGTERM the process ends by that
signal once the drain is done, as uvicorn's own servers do (status 143: a
clean stop to systemd, Docker and Kubernetes): interpreter teardown, which
takes seconds with a model loaded, is skipped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import sys
import time
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from augury.server.state import ServerState

HEAD_TIMEOUT_BODY = json.dumps({"error": {
    "message": "the request head did not arrive in time", "type": "invalid_request_error", "param": None,
    "code": "request_timeout"}}).encode()


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head, from the first byte it waits for."""

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self.head_timer: asyncio.TimerHandle | None = None
        self.head_started = False  # bytes of the awaited head have arrived (else the connection is merely idle)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a whole request head arrived: its body has the app's own deadline
            self._stop_timer()
        else:
            self.head_started = self.head_started or self._waiting_for_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._waiting_for_head():  # (not a pipelined request meanwhile)
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _await_head(self) -> None:
        self._stop_timer()
        self.head_started = False
        self.head_timer = self.loop.call_later(self.header_timeout, self._head_overdue, self.cycle)

    def _stop_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_overdue(self, cycle: Any) -> None:
        self.head_timer = None
        if self.cycle is not cycle or not self._waiting_for_head() or self.transport.is_closing():
            return
        if self.head_started:  # a client mid-head is told why; an idle keep-alive connection just closes
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(HEAD_TIMEOUT_BODY)}\r\n\r\n".encode() + HEAD_TIMEOUT_BODY
            )
        self.transport.close()


def uvicorn_config(app: Starlette, host: str, port: int, *, header_timeout: float = 10.0,
                   log_level: str = "info") -> uvicorn.Config:
    """uvicorn settings for augury's app: h11 with head deadlines, no websockets, the app's lifespan."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", ws="none",
                          http=functools.partial(BoundedH11, header_timeout=header_timeout))  # type: ignore[arg-type]


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains on SIGTERM / SIGINT and exits within `shutdown_timeout` s (see the module doc)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, shutdown_timeout: float = 30.0) -> None:
        super().__init__(config)
        self.state = state
        self.shutdown_timeout = shutdown_timeout
        self.signalled_at: float | None = None
        self.signal: int | None = None  # the first signal received
        self.drainer: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()  # on_tick starts the drain (a signal handler cannot await)
            self.signal = sig
        else:
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.signalled_at is not None and self.drainer is None:
            self.drainer = asyncio.create_task(self._drain(self.signalled_at))
        return await super().on_tick(counter)

    async def _drain(self, t0: float) -> None:
        total = self.shutdown_timeout
        flush = min(5.0, total / 2)
        await self.state.drain(finish_by=t0 + total - flush, end_by=t0 + total - flush / 2)
        # uvicorn then closes the socket and waits this long for connections before cutting them,
        # leaving a moment for the process itself to end (unmapping a model's memory takes about a second).
        self.config.timeout_graceful_shutdown = max(0.1, t0 + total - min(1.0, flush / 2) - time.monotonic())
        self.should_exit = True


def serve(app: Starlette, host: str, port: int, *, shutdown_timeout: float = 30.0, header_timeout: float = 10.0,
          log_level: str = "info") -> None:
    """Serve until SIGTERM or Ctrl-C, then drain and exit within shutdown_timeout seconds."""
    config = uvicorn_config(app, host, port, header_timeout=header_timeout, log_level=log_level)
    server = DrainingServer(config, app.state.augury, shutdown_timeout)
    server.run()
    if server.signal == signal.SIGTERM:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
