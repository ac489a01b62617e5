"""The OpenAI-compatible HTTP API over the batching scheduler (Starlette): the handlers and the app factory.

Handlers run on the event loop and never touch a model: they read the body,
have it checked and tokenized (`augury.server.parse`), hand it to the
scheduler's engine thread and relay the events it sends back (through
`Channel`, which crosses from that thread into the loop) in OpenAI's format
(`augury.server.replies`). A client that goes away is noticed while it waits
in the queue, while a non-streaming answer is generated, and while streaming;
its request is cancelled so its row is free for the next one.

Every refusal is an OpenAI-style error body {"error": {message, type, param,
code}} with a 4xx status; a 5xx means a bug in the server, never bad input.
Cheap checks (size, nesting, schema, counts) run on the event loop and refuse
oversized requests before any work; templating and tokenizing, which take a
second for a few megabytes, run on a small thread pool so that the loop keeps
answering everyone else. `augury.server.guard.Guard` checks every request's
framing, Host, Origin, API key and Content-Type before a handler sees it, and
refuses new work while the server drains (see `augury.server.running`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive

from augury.errors import AuguryError, NoChatTemplateError
from augury.models.loader import Model
from augury.scheduler import Admitted, Event, Failed, Finished, QueueFull, Scheduler, TextDelta, Ticket
from augury.server.guard import Guard, error_response
from augury.server.parse import Job, Rules, check_request, decode_json, make_job, tokenize, wants_json
from augury.server.prometheus import render
from augury.server.replies import Reply, failure, shutting_down, sse
from augury.server.schemas import ApiError, Limits, openapi
from augury.server.state import ServerConfig, ServerState

CHARS_PER_TOKEN_LIMIT = 32  # default character limit per prompt token: far above any tokenizer's average


class ClientGone(Exception):
    """The client disconnected before its answer was complete."""


# -- engine thread -> event loop ------------------------------------------------------------------


class Channel:
    """Events from the engine thread, delivered into an asyncio queue on the request's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def put(self, event: Event) -> None:
        """Called from the engine thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self) -> Event:
        return await self.queue.get()

    def drain_text(self) -> tuple[TextDelta, Event | None]:
        """Text deltas already queued, joined (text and logprobs), and the first non-text event after them."""
        parts: list[TextDelta] = []
        after = None
        while not self.queue.empty():
            event = self.queue.get_nowait()
            if not isinstance(event, TextDelta):
                after = event
                break
            parts.append(event)
        joined = TextDelta("".join(d.text for d in parts), tuple(lp for d in parts for lp in d.logprobs))
        return joined, after


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the body has been read, so nothing else arrives)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(awaitable: Awaitable[Any], watcher: asyncio.Task) -> Any:
    """Await something, raising ClientGone if the client disconnects first."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone


# -- request in ------------------------------------------------------------------------------------------


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytes:
    """The request body's bytes; 413 past `limit` bytes, 408 if it takes over `timeout` s, 499 if the client left."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="request_too_large")
    chunks: list[bytes] = []

    async def receive_all() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(receive_all(), timeout)
    except ClientDisconnect:
        raise ApiError(499, "the client closed the connection while sending the body") from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g}s", code="request_timeout",
                       headers={"Connection": "close"}) from None
    return b"".join(chunks)


async def parse_job(state: ServerState, body: Any, chat: bool) -> Job:
    """Check a request body and turn it into prompt ids and sampling parameters (ApiError if invalid).

    The cheap checks run here on the loop; tokenizing runs on the server's pool.
    """
    prompt = check_request(state.rules, body, chat)
    loop = asyncio.get_running_loop()
    try:
        ids = await loop.run_in_executor(state.tokenize_pool, tokenize, state.target.tokenizer, prompt)
    except NoChatTemplateError:  # its own words name the CLI's flag
        raise ApiError(400, "this model has no chat template: send a plain prompt to /v1/completions instead",
                       param="messages", code="unsupported_model_feature") from None
    except AuguryError as exc:
        raise ApiError(400, str(exc), param="messages" if chat else "prompt") from None
    constraint = await state.json_constraint() if wants_json(body) else None
    return make_job(state.rules, body, chat, ids, constraint)


# -- answer out ------------------------------------------------------------------------------------------


async def _stream(state: ServerState, ticket: Ticket, channel: Channel, job: Job, reply: Reply) -> AsyncIterator[str]:
    """Server-sent events until the result; cancels the request if the client goes away first."""
    ended = False
    sent = 0  # tokens whose logprobs have been sent
    try:
        if reply.chat:
            yield sse(reply.chunk(None, role=True))
        while True:
            event = await channel.get()
            if isinstance(event, TextDelta):
                more, after = channel.drain_text()
                logprobs = (*event.logprobs, *more.logprobs)
                sent += len(logprobs)
                yield sse(reply.chunk(event.text + more.text, logprobs=logprobs))
                if after is None:
                    continue
                event = after
            if isinstance(event, Finished):
                ended = True
                rest = (event.result.logprobs or [])[sent:]
                yield sse(reply.chunk(None, event.result.finish_reason, logprobs=rest))
                if job.include_usage:
                    yield sse(reply.usage_chunk(event.result))
                yield sse("[DONE]")
                return
            if isinstance(event, Failed):
                ended = True
                yield sse(failure(event).body())
                yield sse("[DONE]")
                return
    finally:
        if not ended:
            state.scheduler.cancel(ticket)


async def _admission(state: ServerState, channel: Channel, ticket: Ticket) -> Event:
    """The first event of a queued request; 429 if no slot frees up within the queue timeout.

    Timed here rather than in the engine thread, which may be busy with a long
    prefill exactly when the deadline passes.
    """
    timeout = state.config.queue_timeout
    try:
        return await asyncio.wait_for(channel.get(), timeout)
    except asyncio.TimeoutError:
        if state.scheduler.withdraw(ticket):
            raise ApiError(429, f"waited {timeout:g}s for a free slot; try again later", type="rate_limit_error",
                           code="queue_timeout", headers={"Retry-After": "1"}) from None
        return await channel.get()  # a slot took it meanwhile


async def _collect(channel: Channel) -> Finished | Failed:
    while True:
        event = await channel.get()
        if isinstance(event, (Finished, Failed)):
            return event


# -- handlers -----------------------------------------------------------------------------------------


def _state(request: Request) -> ServerState:
    return request.app.state.augury


async def _generate(request: Request, chat: bool) -> Response:
    state = _state(request)
    raw = await read_body(request, state.config.max_body_bytes, state.config.body_timeout)
    job = await parse_job(state, decode_json(raw), chat)
    if state.draining:  # it began while this request was being tokenized
        raise shutting_down()
    channel = Channel(asyncio.get_running_loop())
    try:
        ticket = state.scheduler.submit(job.prompt_ids, job.params, channel.put)
    except QueueFull as exc:
        if state.draining:  # the scheduler has stopped
            raise shutting_down() from None
        raise ApiError(429, str(exc), type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": "1"}) from None
    except AuguryError as exc:
        raise ApiError(400, str(exc), param="max_tokens", code="context_length_exceeded") from None
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    handed_over = False
    try:
        event = await _unless_disconnected(_admission(state, channel, ticket), watcher)
        if isinstance(event, Failed):
            raise failure(event)
        assert isinstance(event, Admitted)
        reply = Reply(state.config.model_name, chat, job.params, state.token_text)
        if job.stream:
            # From here StreamingResponse watches the connection itself.
            watcher.cancel()
            handed_over = True
            return StreamingResponse(
                _stream(state, ticket, channel, job, reply),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        event = await _unless_disconnected(_collect(channel), watcher)
        if isinstance(event, Failed):
            raise failure(event)
        return JSONResponse(reply.whole(event.result))
    except ClientGone:
        return Response(status_code=499)  # nobody reads this; nginx's "client closed request"
    finally:
        watcher.cancel()
        if not handed_over:
            state.scheduler.cancel(ticket)  # a no-op once the request has ended


async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def models(request: Request) -> Response:
    state = _state(request)
    entry = {"id": state.config.model_name, "object": "model", "created": state.started, "owned_by": "augury"}
    return JSONResponse({"object": "list", "data": [entry]})


async def health(request: Request) -> Response:
    """Liveness; 503 while draining, so that a load balancer stops sending requests here."""
    state = _state(request)
    scheduler = state.scheduler
    body = {"status": "draining" if state.draining else "ok", "running": scheduler.running,
            "queued": scheduler.queue_length}
    return JSONResponse(body, status_code=503 if state.draining else 200)


async def metrics(request: Request) -> Response:
    state = _state(request)
    text = render(state.scheduler, state.responses)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def openapi_json(request: Request) -> Response:
    state = _state(request)
    return JSONResponse(openapi(state.rules.limits, auth=state.config.api_key is not None))


# -- errors ---------------------------------------------------------------------------------------------


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    return error_response(ApiError(exc.status_code, message.get(exc.status_code, str(exc.detail)), code=kind,
                                   headers=exc.headers))


async def _on_crash(request: Request, exc: Exception) -> Response:
    return error_response(ApiError(500, "internal server error", type="server_error", code="internal_error"))


# -- the app --------------------------------------------------------------------------------------------


def rules_for(target: Model, capacity: int, config: ServerConfig) -> Rules:
    """What requests must satisfy on a server of this config over a sequence of `capacity` tokens."""
    longest_prompt = capacity - 1 if config.max_prompt_tokens is None else min(config.max_prompt_tokens, capacity - 1)
    limits = Limits(
        model=config.model_name,
        max_tokens=max(1, min(config.max_tokens_limit, capacity - 1)),
        vocab_size=target.config.vocab_size,
        max_prompt_tokens=longest_prompt,
        max_messages=config.max_messages,
    )
    chars = config.max_prompt_chars or CHARS_PER_TOKEN_LIMIT * longest_prompt
    return Rules(limits, capacity, chars, frozenset(target.tokenizer.eos_ids))


def create_app(target: Model, scheduler: Scheduler, config: ServerConfig) -> Starlette:
    """The ASGI app. Its lifespan starts and stops the scheduler's engine thread."""
    pool = ThreadPoolExecutor(max_workers=config.tokenizer_threads, thread_name_prefix="augury-tokenize")
    state = ServerState(target, scheduler, config, rules_for(target, scheduler.capacity, config), pool)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()
            pool.shutdown(wait=False, cancel_futures=True)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    handlers: dict[Any, Callable] = {ApiError: _on_api_error, HTTPException: _on_http_exception, Exception: _on_crash}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan,
                    middleware=[Middleware(Guard, state=state)])
    # A path with a trailing slash is a 404 like any unknown path: Starlette's default 307 to the path without
    # it has an empty body, which a client that does not follow redirects reads as an empty answer.
    app.router.redirect_slashes = False
    app.state.augury = state
    return app
