"""A running server's configuration and shared state: what the guard, the handlers and the runner all read.

Below the app, the guard and `running` (which drains it on SIGTERM), so none
of them imports another to reach it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from augury.grammar import JsonObjectConstraint
from augury.models.loader import Model
from augury.scheduler import Scheduler
from augury.server.parse import Rules


@dataclass
class ServerConfig:
    """Limits and identity of a running server (the scheduler has its own config)."""

    model_name: str
    api_key: str | None = None
    max_body_bytes: int = 2 * 1024 * 1024
    max_tokens_limit: int = 4096  # the largest max_tokens a request may ask for
    max_prompt_tokens: int | None = None  # None: whatever fits a sequence's KV row
    max_prompt_chars: int | None = None  # None: CHARS_PER_TOKEN_LIMIT per prompt token (see app.create_app)
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
    """One server's model, scheduler, rules and counters; lives on the app as `app.state.augury`."""

    target: Model
    scheduler: Scheduler
    config: ServerConfig
    rules: Rules  # what a request must satisfy (see augury.server.parse)
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
