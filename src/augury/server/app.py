"""The OpenAI-compatible HTTP API over the batching scheduler (Starlette).

Handlers run on the event loop and never touch a model: they validate the
request, tokenize it, hand it to the scheduler's engine thread and relay the
events it sends back (through `Channel`, which crosses from that thread into
the loop). A client that goes away is noticed while it waits in the queue,
while a non-streaming answer is generated, and while streaming; its request is
cancelled so its row is free for the next one.

Every refusal is an OpenAI-style error body {"error": {message, type, param,
code}} with a 4xx status; a 5xx means a bug in the server, never bad input.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.sampling import SamplingParams
from augury.scheduler import Admitted, Event, Failed, Finished, QueueFull, Scheduler, TextDelta, Ticket
from augury.server import prometheus
from augury.server.schemas import (
    ApiError,
    Limits,
    chat_schema,
    check_unsupported,
    completion_schema,
    openapi,
    validate,
)

log = logging.getLogger("augury.server")

GREEDY_BELOW = 1e-5  # temperatures this small are argmax in all but name; dividing by them overflows
PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})


@dataclass
class ServerConfig:
    """Limits and identity of a running server (the scheduler has its own config)."""

    model_name: str
    api_key: str | None = None
    max_body_bytes: int = 2 * 1024 * 1024
    max_tokens_limit: int = 4096  # the largest max_tokens a request may ask for
    max_prompt_tokens: int | None = None  # None: whatever fits a sequence's KV row
    queue_timeout: float | None = None  # seconds a request may wait for a slot before 429 (None: no limit)


@dataclass
class ServerState:
    target: Model
    scheduler: Scheduler
    config: ServerConfig
    limits: Limits
    max_prompt_tokens: int
    started: int = field(default_factory=lambda: int(time.time()))
    responses: Counter = field(default_factory=Counter)  # HTTP status -> count


@dataclass
class Job:
    """A validated generation request."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


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

    def drain_text(self) -> tuple[str, Event | None]:
        """Text deltas already queued, joined, and the first non-text event after them (if queued)."""
        parts = []
        while not self.queue.empty():
            event = self.queue.get_nowait()
            if not isinstance(event, TextDelta):
                return "".join(parts), event
            parts.append(event.text)
        return "".join(parts), None


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


# -- request parsing -------------------------------------------------------------------------------


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON; 413 past `limit` bytes, 400 for anything that is not strict JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="request_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(499, "the client closed the connection while sending the body") from None
    raw = b"".join(chunks)
    if not raw:
        raise ApiError(400, "the request body is empty; send a JSON object")

    def no_constants(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    except ValueError as exc:
        raise ApiError(400, f"malformed JSON in the request body: {exc}") from None
    try:
        # JSON may spell an unpaired UTF-16 surrogate ("\ud800"), which is no
        # text at all: tokenizers reject it, so refuse it here, for every field.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the request body contains an unpaired UTF-16 surrogate (\\ud800-\\udfff)") from None
    return body


def _sampling_params(body: dict, max_tokens: int) -> SamplingParams:
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else float(temperature)
    if temperature < GREEDY_BELOW:
        temperature = 0.0
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)
    top_k = body.get("top_k")

    def value(name: str, default: Any) -> Any:
        found = body.get(name)
        return default if found is None else found

    try:
        return SamplingParams(
            temperature=temperature,
            top_k=0 if top_k is None or top_k < 0 else top_k,
            top_p=float(value("top_p", 1.0)),
            min_p=float(value("min_p", 0.0)),
            repetition_penalty=float(value("repetition_penalty", 1.0)),
            presence_penalty=float(value("presence_penalty", 0.0)),
            frequency_penalty=float(value("frequency_penalty", 0.0)),
            max_tokens=max_tokens,
            stop=stop,
            seed=body.get("seed"),
            ignore_eos=bool(value("ignore_eos", False)),
        )
    except AuguryError as exc:
        raise ApiError(400, str(exc)) from None


def _prompt_ids(state: ServerState, body: dict, chat: bool) -> list[int]:
    """Token ids of the prompt: chat messages through the model's own template, text as is, or given ids."""
    tokenizer = state.target.tokenizer
    if chat:
        messages = [
            {"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
             else "".join(part["text"] for part in m["content"])}
            for m in body["messages"]
        ]
        try:
            text = tokenizer.apply_chat_template(messages)
        except jinja2.TemplateError as exc:
            raise ApiError(400, f"the model's chat template rejected these messages: {exc}", param="messages") from None
        return tokenizer.encode(text, add_bos=False)
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return list(prompt)
    return tokenizer.encode(prompt[0] if isinstance(prompt, list) else prompt)


def parse_job(state: ServerState, body: Any, chat: bool) -> Job:
    """Validate a request body and turn it into prompt ids and sampling parameters (ApiError if invalid)."""
    if isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str) and model != state.config.model_name:
            raise ApiError(404, f"the model '{model}' does not exist; this server serves "
                           f"'{state.config.model_name}'", param="model", code="model_not_found")
        check_unsupported(body)
    validate(body, chat_schema(state.limits) if chat else completion_schema(state.limits))
    param = "messages" if chat else "prompt"
    try:
        prompt_ids = _prompt_ids(state, body, chat)
    except AuguryError as exc:
        raise ApiError(400, str(exc), param=param) from None
    if not prompt_ids:
        raise ApiError(400, "the prompt is empty", param=param)
    longest = state.max_prompt_tokens
    if len(prompt_ids) > longest:
        raise ApiError(400, f"the prompt is {len(prompt_ids)} tokens; this server accepts at most {longest}",
                       param=param, code="context_length_exceeded")
    capacity = state.scheduler.capacity
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is None:
        max_tokens = min(state.config.max_tokens_limit, capacity - len(prompt_ids))
    elif len(prompt_ids) + max_tokens > capacity:
        raise ApiError(
            400,
            f"the prompt ({len(prompt_ids)} tokens) plus {name} ({max_tokens}) is more than the "
            f"{capacity} tokens a sequence may hold; lower {name} or shorten the prompt",
            param=name, code="context_length_exceeded",
        )
    stream_options = body.get("stream_options") or {}
    return Job(
        prompt_ids=prompt_ids,
        params=_sampling_params(body, max_tokens),
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
    )


# -- responses ---------------------------------------------------------------------------------------


def _usage(result) -> dict:
    s = result.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "augury": {"drafted": s.drafted, "accepted": s.accepted, "tau": round(s.tau, 4)},
    }


def _failure(event: Failed) -> ApiError:
    if event.kind == "invalid":
        return ApiError(400, event.message)
    if event.kind == "shutdown":
        return ApiError(503, event.message, type="server_error", code="shutting_down")
    return ApiError(500, event.message, type="server_error", code="internal_error")


class Reply:
    """Builds the JSON objects of one response, completion or chat, whole or streamed."""

    def __init__(self, model: str, chat: bool) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.model = model
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, result) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": None, "finish_reason": result.finish_reason}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
            body = self._envelope("text_completion", [choice])
        body["usage"] = _usage(result)
        return body

    def chunk(self, text: str | None, finish_reason: str | None = None, *, role: bool = False) -> dict:
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, result) -> dict:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = _usage(result)
        return body


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(state: ServerState, ticket: Ticket, channel: Channel, job: Job, reply: Reply) -> AsyncIterator[str]:
    """Server-sent events until the result; cancels the request if the client goes away first."""
    ended = False
    try:
        if reply.chat:
            yield _sse(reply.chunk(None, role=True))
        while True:
            event = await channel.get()
            if isinstance(event, TextDelta):
                more, after = channel.drain_text()
                yield _sse(reply.chunk(event.text + more))
                if after is None:
                    continue
                event = after
            if isinstance(event, Finished):
                ended = True
                yield _sse(reply.chunk(None, event.result.finish_reason))
                if job.include_usage:
                    yield _sse(reply.usage_chunk(event.result))
                yield _sse("[DONE]")
                return
            if isinstance(event, Failed):
                ended = True
                yield _sse(_failure(event).body())
                yield _sse("[DONE]")
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
    job = parse_job(state, await read_json(request, state.config.max_body_bytes), chat)
    channel = Channel(asyncio.get_running_loop())
    try:
        ticket = state.scheduler.submit(job.prompt_ids, job.params, channel.put)
    except QueueFull as exc:
        raise ApiError(429, str(exc), type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"}) from None
    except AuguryError as exc:
        raise ApiError(400, str(exc), param="max_tokens", code="context_length_exceeded") from None
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    handed_over = False
    try:
        event = await _unless_disconnected(_admission(state, channel, ticket), watcher)
        if isinstance(event, Failed):
            raise _failure(event)
        assert isinstance(event, Admitted)
        reply = Reply(state.config.model_name, chat)
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
            raise _failure(event)
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
    scheduler = _state(request).scheduler
    return JSONResponse({"status": "ok", "running": scheduler.running, "queued": scheduler.queue_length})


async def metrics(request: Request) -> Response:
    state = _state(request)
    text = prometheus.render(state.scheduler, state.responses)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def openapi_json(request: Request) -> Response:
    state = _state(request)
    return JSONResponse(openapi(state.limits, auth=state.config.api_key is not None))


# -- errors, auth, accounting -------------------------------------------------------------------------


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error_response(exc)


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    return _error_response(ApiError(exc.status_code, message.get(exc.status_code, str(exc.detail)), code=kind,
                                    headers=exc.headers))


async def _on_crash(request: Request, exc: Exception) -> Response:
    return _error_response(ApiError(500, "internal server error", type="server_error", code="internal_error"))


class Guard:
    """ASGI middleware: bearer-token check (when an API key is set) and response counting for /metrics."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        key = state.config.api_key
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.state.responses[message["status"]] += 1
            await send(message)

        if self.expected is not None and scope["path"] not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                                 type="authentication_error", code="invalid_api_key",
                                 headers={"WWW-Authenticate": "Bearer"})
                await _error_response(error)(scope, receive, counting_send)
                return
        await self.app(scope, receive, counting_send)


def create_app(target: Model, scheduler: Scheduler, config: ServerConfig) -> Starlette:
    """The ASGI app. Its lifespan starts and stops the scheduler's engine thread."""
    capacity = scheduler.capacity
    limits = Limits(
        model=config.model_name,
        max_tokens=max(1, min(config.max_tokens_limit, capacity - 1)),
        vocab_size=target.config.vocab_size,
    )
    longest_prompt = capacity - 1 if config.max_prompt_tokens is None else min(config.max_prompt_tokens, capacity - 1)
    state = ServerState(target, scheduler, config, limits, longest_prompt)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()

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
    app.state.augury = state
    return app
