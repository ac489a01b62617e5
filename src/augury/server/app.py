"""The OpenAI-compatible HTTP API over the batching scheduler (Starlette).

Handlers run on the event loop and never touch a model: they validate the
request, tokenize it, hand it to the scheduler's engine thread and relay the
events it sends back (through `Channel`, which crosses from that thread into
the loop). A client that goes away is noticed while it waits in the queue,
while a non-streaming answer is generated, and while streaming; its request is
cancelled so its row is free for the next one.

Every refusal is an OpenAI-style error body {"error": {message, type, param,
code}} with a 4xx status; a 5xx means a bug in the server, never bad input.
Cheap checks (size, nesting, schema, counts) run on the event loop and refuse
oversized requests before any work; templating and tokenizing, which take a
second for a few megabytes, run on a small thread pool so that the loop keeps
answering everyone else. `Guard` checks every request's Host, Origin, API key
and Content-Type before a handler sees it, and refuses new work while the
server drains (see `augury.server.running`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from augury.grammar import JsonObjectConstraint
from augury.models.loader import Model
from augury.models.tokenizer import Tokenizer
from augury.sampling import SamplingParams, is_greedy
from augury.scheduler import Admitted, Event, Failed, Finished, QueueFull, Scheduler, TextDelta, Ticket
from augury.server import prometheus
from augury.server.schemas import (
    MAX_JSON_DEPTH,
    MAX_TOP_LOGPROBS,
    ApiError,
    Limits,
    chat_schema,
    check_unsupported,
    completion_schema,
    nested_deeper_than,
    openapi,
    validate,
)
from augury.request import GenerationResult, TokenLogprob

log = logging.getLogger("augury.server")

PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
CHARS_PER_TOKEN_LIMIT = 32  # default character limit per prompt token: far above any tokenizer's average
# The lowest log-probability reported (JSON has no -inf; OpenAI's value). A chosen token's is
# clamped to it; alternatives below it are left out: the request's transform rules them out (a
# grammar mask, min_tokens' end-token mask) or as good as (a probability under e^-9999).
LOWEST_LOGPROB = -9999.0


@dataclass
class ServerConfig:
    """Limits and identity of a running server (the scheduler has its own config)."""

    model_name: str
    api_key: str | None = None
    max_body_bytes: int = 2 * 1024 * 1024
    max_tokens_limit: int = 4096  # the largest max_tokens a request may ask for
    max_prompt_tokens: int | None = None  # None: whatever fits a sequence's KV row
    max_prompt_chars: int | None = None  # None: CHARS_PER_TOKEN_LIMIT per prompt token
    max_messages: int = 2048
    queue_timeout: float | None = None  # seconds a request may wait for a slot before 429 (None: no limit)
    body_timeout: float = 30.0  # seconds a client may take to send a request body before 408
    # Host header names accepted besides loopback (NAME: any port, NAME:PORT: that one; "*": any Host).
    allowed_hosts: tuple[str, ...] = ()
    # Browser origins (scheme://host[:port]) that may call the API, with CORS headers ("*": any).
    allowed_origins: tuple[str, ...] = ()
    tokenizer_threads: int = 2


@dataclass
class ServerState:
    target: Model
    scheduler: Scheduler
    config: ServerConfig
    limits: Limits
    max_prompt_tokens: int
    max_prompt_chars: int
    tokenize_pool: ThreadPoolExecutor
    started: int = field(default_factory=lambda: int(time.time()))
    responses: Counter = field(default_factory=Counter)  # HTTP status -> count
    draining: bool = False  # shutting down: new requests get 503, running ones may finish
    in_flight: int = 0  # generation requests between arrival and their last byte
    json_object: JsonObjectConstraint | None = None  # built by the first json_object request, then shared
    json_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    token_texts: dict[int, str] = field(default_factory=dict)  # token id -> its text, for logprobs

    async def json_constraint(self) -> JsonObjectConstraint:
        """The response_format json_object mask, built once and off the event loop.

        Building it decodes the whole vocabulary (about a second for 150k
        tokens); its per-state masks are cached inside it, so every request
        shares one. Only the engine thread uses it after that.
        """
        async with self.json_lock:
            if self.json_object is None:
                tokenizer = self.target.tokenizer
                vocab = self.target.config.vocab_size
                vocab = min(vocab, getattr(tokenizer, "vocab_size", vocab))  # ids past it are never allowed
                loop = asyncio.get_running_loop()
                self.json_object = await loop.run_in_executor(
                    self.tokenize_pool, JsonObjectConstraint.for_tokenizer, tokenizer, vocab)
            return self.json_object

    def token_text(self, token: int) -> str:
        """A token's text for logprobs: the tokenizer's decoding of that id alone (special tokens too)."""
        text = self.token_texts.get(token)
        if text is None:
            text = self.token_texts[token] = self.target.tokenizer.decode([token], skip_special=False)
        return text

    async def drain(self, finish_by: float, end_by: float) -> None:
        """Refuse new requests; let running ones finish until `finish_by`, end the rest, wait for them until `end_by`.

        Times are time.monotonic() deadlines. Ended requests get what the
        scheduler sends on shutdown: a streamed error event, or a 503 body.
        Each wait returns early once no generation request is in flight.
        """
        self.draining = True
        await self._until_idle(finish_by)
        try:
            await asyncio.wait_for(asyncio.to_thread(self.scheduler.stop), max(0.0, end_by - time.monotonic()))
        except asyncio.TimeoutError:  # the engine is inside a long step; its thread stops after it
            pass
        await self._until_idle(end_by)

    async def _until_idle(self, deadline: float) -> None:
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


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


# -- request parsing -------------------------------------------------------------------------------


async def read_json(request: Request, limit: int, timeout: float | None = None) -> Any:
    """The request body as JSON; 413 past `limit` bytes, 408 if it takes over `timeout` s, 400 unless strict JSON.

    Nesting deeper than MAX_JSON_DEPTH is refused here, before anything walks
    the value recursively.
    """
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
    if nested_deeper_than(body, MAX_JSON_DEPTH):
        raise ApiError(400, f"the request body nests more than {MAX_JSON_DEPTH} levels deep")
    return body


def _number(body: dict, name: str, default: float) -> float:
    """A numeric parameter as a float; a 400 if it does not fit one (the schema bounds them, this is the backstop)."""
    value = body.get(name)
    if value is None:
        return default
    try:
        return float(value)
    except OverflowError:
        raise ApiError(400, f"'{name}' is too large", param=name) from None


def _top_logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives per token a request asks for; None: no logprobs (checked by `check_features`)."""
    if chat:
        return (body.get("top_logprobs") or 0) if body.get("logprobs") else None
    return body.get("logprobs")


def _wants_json(body: dict) -> bool:
    fmt = body.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") == "json_object"


def check_features(body: dict, chat: bool, eos_ids: frozenset[int]) -> None:
    """What the schema cannot say: fields that only make sense together, or never together."""
    if chat and body.get("top_logprobs") and not body.get("logprobs"):
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if not chat and body.get("top_logprobs") is not None:
        raise ApiError(400, "'top_logprobs' is a chat completions field; /v1/completions takes 'logprobs': N "
                       f"(0 to {MAX_TOP_LOGPROBS} alternatives)", param="top_logprobs")
    sampled = not is_greedy(_number(body, "temperature", 1.0))
    if body.get("coupling") == "coupled" and sampled and body.get("seed") is None:
        raise ApiError(400, "'coupling': 'coupled' needs a 'seed' (it fixes the noise each token is drawn with)",
                       param="coupling")
    if _wants_json(body):
        # A complete JSON object may only be followed by an end-of-sequence token: without one
        # (or with it ignored, or held back by min_tokens) nothing could end the object.
        if not eos_ids:
            raise ApiError(400, "response_format json_object needs a model with an end-of-sequence token; "
                           "this one has none", param="response_format", code="unsupported_parameter")
        for name in ("ignore_eos", "min_tokens"):
            if body.get(name):
                raise ApiError(400, f"'{name}' cannot be combined with response_format json_object: the object "
                               "ends with the end-of-sequence token", param=name, code="unsupported_parameter")


def _sampling_params(body: dict, max_tokens: int, eos_ids: frozenset[int], chat: bool,
                     constraint: JsonObjectConstraint | None = None) -> SamplingParams:
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)
    top_k = body.get("top_k")
    ignore_eos = bool(body.get("ignore_eos"))
    min_tokens = body.get("min_tokens") or 0
    if min_tokens > max_tokens:
        raise ApiError(400, f"'min_tokens' ({min_tokens}) is more than max_tokens ({max_tokens})", param="min_tokens")
    try:
        return SamplingParams(
            temperature=_number(body, "temperature", 1.0),
            top_k=0 if top_k is None or top_k < 0 else top_k,
            top_p=_number(body, "top_p", 1.0),
            min_p=_number(body, "min_p", 0.0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0),
            presence_penalty=_number(body, "presence_penalty", 0.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            max_tokens=max_tokens,
            stop=stop,
            seed=body.get("seed"),
            ignore_eos=ignore_eos,
            min_tokens=min_tokens,
            eos_ids=frozenset() if ignore_eos or not min_tokens else eos_ids,
            logprobs=_top_logprobs(body, chat),
            constraint=constraint,
            coupling=body.get("coupling") or "auto",
        )
    except AuguryError as exc:
        raise ApiError(400, str(exc)) from None


Prompt = list[dict] | str | list[int]  # chat messages, text, or token ids


def _prompt(body: dict, chat: bool) -> Prompt:
    """The prompt of a valid request. Messages keep only role and text: nothing else reaches the template."""
    if chat:
        return [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
                 else "".join(part["text"] for part in m["content"])} for m in body["messages"]]
    prompt = body["prompt"]
    if isinstance(prompt, list):
        return list(prompt) if isinstance(prompt[0], int) else prompt[0]
    return prompt


def _characters(prompt: Prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m["content"]) for m in prompt if isinstance(m, dict))


def check_request(state: ServerState, body: Any, chat: bool) -> Prompt:
    """The cheap checks, before any templating or tokenizing: model, features, schema, size; the prompt."""
    if isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str) and model != state.config.model_name:
            raise ApiError(404, f"the model '{model}' does not exist; this server serves "
                           f"'{state.config.model_name}'", param="model", code="model_not_found")
        check_unsupported(body)
    validate(body, chat_schema(state.limits) if chat else completion_schema(state.limits))
    check_features(body, chat, frozenset(state.target.tokenizer.eos_ids))
    prompt = _prompt(body, chat)
    if _characters(prompt) > state.max_prompt_chars:
        raise ApiError(400, f"the prompt is {_characters(prompt)} characters; this server accepts at most "
                       f"{state.max_prompt_chars}", param="messages" if chat else "prompt",
                       code="context_length_exceeded")
    return prompt


def tokenize(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a checked prompt (a second or so for megabytes: runs off the event loop).

    Chat messages go through the model's template with their text read as
    plain text, so a message cannot forge turns with special-token text. A
    raw completion prompt is the client's own token stream: its special-token
    text stays special (documented), and token ids are taken as given.
    """
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if not isinstance(prompt[0], dict):
        return list(prompt)
    try:
        if isinstance(tokenizer, Tokenizer):
            return tokenizer.encode_chat(prompt)
        # Other tokenizers (the tests' character tokenizers) have no special tokens.
        return tokenizer.encode(tokenizer.apply_chat_template(prompt), add_bos=False)
    except jinja2.TemplateError as exc:
        raise ApiError(400, f"the model's chat template rejected these messages: {exc}", param="messages") from None


async def parse_job(state: ServerState, body: Any, chat: bool) -> Job:
    """Validate a request body and turn it into prompt ids and sampling parameters (ApiError if invalid)."""
    prompt = check_request(state, body, chat)
    loop = asyncio.get_running_loop()
    try:
        ids = await loop.run_in_executor(state.tokenize_pool, tokenize, state.target.tokenizer, prompt)
    except AuguryError as exc:
        raise ApiError(400, str(exc), param="messages" if chat else "prompt") from None
    constraint = await state.json_constraint() if _wants_json(body) else None
    return make_job(state, body, chat, ids, constraint)


def make_job(state: ServerState, body: dict, chat: bool, prompt_ids: list[int],
             constraint: JsonObjectConstraint | None = None) -> Job:
    """A checked request with its prompt's ids -> Job; 400 if the prompt and max_tokens do not fit."""
    param = "messages" if chat else "prompt"
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
        params=_sampling_params(body, max_tokens, state.target.tokenizer.eos_ids, chat, constraint),
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
    )


# -- responses ---------------------------------------------------------------------------------------


def _usage(result: GenerationResult, params: SamplingParams) -> dict:
    s = result.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "augury": {"drafted": s.drafted, "accepted": s.accepted, "tau": round(s.tau, 4), "sampling": params.mode},
    }


def _shutting_down(message: str = "the server is shutting down; retry on another instance") -> ApiError:
    return ApiError(503, message, type="server_error", code="shutting_down",
                    headers={"Connection": "close", "Retry-After": "1"})


def _failure(event: Failed) -> ApiError:
    if event.kind == "invalid":
        return ApiError(400, event.message)
    if event.kind == "shutdown":
        return _shutting_down(event.message)
    return ApiError(500, event.message, type="server_error", code="internal_error")


def _finite(logprob: float) -> float:
    return logprob if logprob > LOWEST_LOGPROB else LOWEST_LOGPROB  # (-inf and NaN too)


class Reply:
    """Builds the JSON objects of one response, completion or chat, whole or streamed.

    Logprobs come as OpenAI defines them: chat choices carry
    {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]},
    completion choices {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
    (each position's alternatives plus the chosen token). A token's text is its
    id decoded alone; alternatives the request's transform rules out (a
    grammar mask) are left out (see LOWEST_LOGPROB). A streamed chunk carries
    the logprobs of the tokens committed since the previous chunk; tokens whose
    text was still held back (a possible stop string) come with a later chunk,
    at the latest with the one that has finish_reason.
    """

    def __init__(self, state: ServerState, chat: bool, params: SamplingParams) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.model = state.config.model_name
        self.created = int(time.time())
        self.params = params
        self.token_text = state.token_text
        self.text_offset = 0  # completions: where the next token's text starts in the output

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def logprobs(self, entries: Sequence[TokenLogprob], *, empty_is_none: bool = False) -> dict | None:
        """The choice's logprobs object for these tokens (None if the request did not ask)."""
        if self.params.logprobs is None or (empty_is_none and not entries):
            return None
        text = self.token_text
        if self.chat:
            def entry(token: int, logprob: float) -> dict:
                token_text = text(token)
                return {"token": token_text, "logprob": _finite(logprob), "bytes": list(token_text.encode("utf-8"))}

            return {"content": [{**entry(e.token, e.logprob),
                                 "top_logprobs": [entry(t, lp) for t, lp in e.top if lp >= LOWEST_LOGPROB]}
                                for e in entries]}
        tokens, offsets, tops = [], [], []
        for e in entries:
            token_text = text(e.token)
            tokens.append(token_text)
            offsets.append(self.text_offset)
            self.text_offset += len(token_text)
            top = {text(t): lp for t, lp in e.top if lp >= LOWEST_LOGPROB}
            top.setdefault(token_text, _finite(e.logprob))
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [_finite(e.logprob) for e in entries], "top_logprobs": tops,
                "text_offset": offsets}

    def whole(self, result: GenerationResult) -> dict:
        logprobs = self.logprobs(result.logprobs or [])
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": logprobs, "finish_reason": result.finish_reason}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": result.text, "logprobs": logprobs, "finish_reason": result.finish_reason}
            body = self._envelope("text_completion", [choice])
        body["usage"] = _usage(result, self.params)
        return body

    def chunk(self, text: str | None, finish_reason: str | None = None, *, role: bool = False,
              logprobs: Sequence[TokenLogprob] = ()) -> dict:
        lp = self.logprobs(logprobs, empty_is_none=True)
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, result: GenerationResult) -> dict:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = _usage(result, self.params)
        return body


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(state: ServerState, ticket: Ticket, channel: Channel, job: Job, reply: Reply) -> AsyncIterator[str]:
    """Server-sent events until the result; cancels the request if the client goes away first."""
    ended = False
    sent = 0  # tokens whose logprobs have been sent
    try:
        if reply.chat:
            yield _sse(reply.chunk(None, role=True))
        while True:
            event = await channel.get()
            if isinstance(event, TextDelta):
                more, after = channel.drain_text()
                logprobs = (*event.logprobs, *more.logprobs)
                sent += len(logprobs)
                yield _sse(reply.chunk(event.text + more.text, logprobs=logprobs))
                if after is None:
                    continue
                event = after
            if isinstance(event, Finished):
                ended = True
                rest = (event.result.logprobs or [])[sent:]
                yield _sse(reply.chunk(None, event.result.finish_reason, logprobs=rest))
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
    body = await read_json(request, state.config.max_body_bytes, state.config.body_timeout)
    job = await parse_job(state, body, chat)
    if state.draining:  # it began while this request was being tokenized
        raise _shutting_down()
    channel = Channel(asyncio.get_running_loop())
    try:
        ticket = state.scheduler.submit(job.prompt_ids, job.params, channel.put)
    except QueueFull as exc:
        if state.draining:  # the scheduler has stopped
            raise _shutting_down() from None
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
        reply = Reply(state, chat, job.params)
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
    """Liveness; 503 while draining, so that a load balancer stops sending requests here."""
    state = _state(request)
    scheduler = state.scheduler
    body = {"status": "draining" if state.draining else "ok", "running": scheduler.running,
            "queued": scheduler.queue_length}
    return JSONResponse(body, status_code=503 if state.draining else 200)


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


def _split_host(value: str) -> tuple[str, int | None]:
    """'Name:port' (or '[::1]:port', or without a port) -> (lowercased name, port or None)."""
    value = value.strip().lower()
    if value.count(":") > 1 and not value.startswith("["):  # a bare IPv6 address
        return value, None
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, colon, port = value.rpartition(":")
        if not colon or not port.isdigit():
            name, port = value, ""
    return name, int(port) if port.isdigit() else None


class Guard:
    """ASGI middleware in front of every route: who may call, and what the server still accepts.

    In order: the Host header must name this server (loopback, or an allowed
    name: a page that rebinds its own DNS name to 127.0.0.1 still sends that
    name); a browser's Origin must be this server's or an allowed one (other
    pages could otherwise post to a server without an API key); while
    draining, generation requests get 503; the API key when set; and POST
    bodies must say application/json (a form or text/plain post is what a
    page can send cross-origin without asking first). It also counts
    responses for /metrics and generation requests in flight for draining.
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        key = state.config.api_key
        self.expected = f"Bearer {key}".encode() if key else None
        self.any_host = "*" in state.config.allowed_hosts
        self.hosts = {_split_host(h) for h in state.config.allowed_hosts if h != "*"}
        self.any_origin = "*" in state.config.allowed_origins
        self.origins = {o.strip().lower().rstrip("/") for o in state.config.allowed_origins if o != "*"}

    def host_allowed(self, host: str | None, server_port: int | None) -> bool:
        if host is None or self.any_host:  # only HTTP/1.0 clients omit Host; browsers never do
            return True
        name, port = _split_host(host)
        if name in LOOPBACK_HOSTS and port in (None, server_port):
            return True
        return (name, None) in self.hosts or (name, port) in self.hosts

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().lower()
        if self.any_origin or origin in self.origins:
            return True
        return host is not None and origin in (f"http://{host.lower()}", f"https://{host.lower()}")  # same origin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        origin = headers.get("origin")
        cors = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"} if origin else {}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.state.responses[message["status"]] += 1
                if cors:
                    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cors.items()]
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        async def refuse(error: ApiError) -> None:
            await _error_response(error)(scope, receive, counting_send)

        host = headers.get("host")
        server = scope.get("server")
        if not self.host_allowed(host, server[1] if server else None):
            return await refuse(ApiError(403, f"the Host header '{host[:100]}' is not one this server answers to "
                                         "(start it with --allow-host NAME to accept it)", code="host_not_allowed"))
        if origin is not None and not self.origin_allowed(origin, host):
            cors = {}
            return await refuse(ApiError(403, f"requests from the web origin '{origin[:100]}' are not allowed "
                                         "(start the server with --allow-origin ORIGIN to allow it)",
                                         code="origin_not_allowed"))
        path, method = scope["path"], scope["method"]
        if origin is not None and method == "OPTIONS" and "access-control-request-method" in headers:
            preflight = {**cors, "Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "600",
                         "Access-Control-Allow-Headers": headers.get("access-control-request-headers",
                                                                     "authorization, content-type")}
            cors = {}
            return await Response(status_code=204, headers=preflight)(scope, receive, counting_send)
        generation = path in GENERATION_PATHS
        if generation and self.state.draining:
            return await refuse(_shutting_down())
        if self.expected is not None and path not in PUBLIC_PATHS:
            given = headers.get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(given, self.expected):
                return await refuse(ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                                             type="authentication_error", code="invalid_api_key",
                                             headers={"WWW-Authenticate": "Bearer"}))
        if generation and method == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return await refuse(ApiError(415, "the request body must be sent as 'Content-Type: application/json'"
                                             f" (got '{media[:100] or 'none'}')", code="unsupported_media_type"))
        if not generation:
            return await self.app(scope, receive, counting_send)
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.state.in_flight -= 1


def create_app(target: Model, scheduler: Scheduler, config: ServerConfig) -> Starlette:
    """The ASGI app. Its lifespan starts and stops the scheduler's engine thread."""
    capacity = scheduler.capacity
    longest_prompt = capacity - 1 if config.max_prompt_tokens is None else min(config.max_prompt_tokens, capacity - 1)
    limits = Limits(
        model=config.model_name,
        max_tokens=max(1, min(config.max_tokens_limit, capacity - 1)),
        vocab_size=target.config.vocab_size,
        max_prompt_tokens=longest_prompt,
        max_messages=config.max_messages,
    )
    chars = config.max_prompt_chars or CHARS_PER_TOKEN_LIMIT * longest_prompt
    pool = ThreadPoolExecutor(max_workers=config.tokenizer_threads, thread_name_prefix="augury-tokenize")
    state = ServerState(target, scheduler, config, limits, longest_prompt, chars, pool)

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
    app.state.augury = state
    return app
