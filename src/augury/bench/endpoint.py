"""The same prompts against any OpenAI-compatible server (vLLM, llama.cpp server, augury serve, ...).

Chat completions are streamed over server-sent events, so the client sees each
token as it leaves the server: time to first token (TTFT) is the wait for the
first content delta, and tokens/s the tokens over the time after it (time per
output token is its inverse), which is how local methods are measured too. The token count comes from the server's usage
report when it sends one (`stream_options.include_usage`) and otherwise from
the number of content deltas (one token each on the common servers).

Servers' own extensions are read where present and never required: augury's
`usage.augury` (drafted, accepted) and llama-server's `timings` (draft_n,
draft_n_accepted) give α. llama-server (its model list says owned_by
"llamacpp") reuses the KV cache of an earlier request's common prefix, which
would let the warm-up prefill the first prompt for free; it is asked not to
(`cache_prompt: false`), since the other contenders prefill every prompt.

Only the standard library is used (urllib), so this needs no extra install.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

from augury.bench.records import Messages, Outcome
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.sampling import SamplingParams

TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 10.0


def api_base(url: str) -> str:
    """The /v1 base of an endpoint given as host, .../v1 or .../v1/chat/completions."""
    base = url.rstrip("/")
    base = base.removesuffix("/chat/completions")
    if not url.startswith(("http://", "https://")):
        raise AuguryError(f"endpoint '{url}' must start with http:// or https://")
    parts = urllib.parse.urlsplit(base)
    try:
        port = parts.port  # a ValueError for a port out of range or not a number
    except ValueError:
        raise AuguryError(f"endpoint '{url}' has a port that is not a number in 1..65535") from None
    if not parts.hostname or port == 0:
        raise AuguryError(f"endpoint '{url}' names no host" if not parts.hostname else f"endpoint '{url}' has port 0")
    return base if base.endswith("/v1") else base + "/v1"


class EndpointContender:
    """A remote OpenAI-compatible chat completions endpoint as one more method."""

    kind = "endpoint"
    lossless = False
    counterpart = None
    k = 0

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, method: str = "endpoint"):
        self.base = api_base(url)
        self.api_key = api_key
        self.model = model
        self.method = method
        self.llama_server = False  # set by check() from the model list

    def _request(self, path: str, body: dict | None = None, timeout: float = TIMEOUT_S):
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if body else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, headers=headers, method="POST" if body else "GET")
        return urllib.request.urlopen(request, timeout=timeout)

    def check(self) -> str:
        """Fail early, with one line, if the server cannot be reached; return the model name to use."""
        status = None  # the HTTP error GET /models answered, if any
        try:
            with self._request("/models", timeout=CONNECT_TIMEOUT_S) as response:
                listing = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise AuguryError(
                    f"endpoint {self.base} refused the request (HTTP {exc.code}); check --api-key"
                ) from None
            listing, status = {}, exc.code  # reachable; some servers do not list models
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AuguryError(f"cannot reach endpoint {self.base}: {reason}") from None
        entries = [m for m in listing.get("data") or [] if isinstance(m, dict) and m.get("id")]
        if self.model is None:
            if not entries:
                answer = f" (GET /models answered HTTP {status})" if status is not None else ""
                raise AuguryError(f"endpoint {self.base} lists no models{answer}; name one with --served-model")
            self.model = entries[0]["id"]
        self.llama_server = any(m.get("owned_by") == "llamacpp" for m in entries)
        return self.model

    def _events(self, response) -> Iterator[dict]:
        """The JSON payloads of an SSE stream, until [DONE]."""
        for raw in response:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                return
            try:
                yield json.loads(payload)
            except json.JSONDecodeError:
                raise AuguryError(f"endpoint {self.base} sent a malformed event: {payload[:80]}") from None

    def generate(self, messages: Messages, prompt_ids: list[int] | None, params: SamplingParams) -> Outcome:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        if self.llama_server:
            body["cache_prompt"] = False
        text, deltas, usage_tokens, prompt_tokens, reason = [], 0, None, 0, "length"
        drafted = accepted = 0
        first = None
        t0 = time.perf_counter()
        try:
            with self._request("/chat/completions", body) as response:
                for event in self._events(response):
                    if event.get("error"):
                        raise AuguryError(f"endpoint {self.base} reported an error: {_message(event['error'])}")
                    usage = event.get("usage")
                    if isinstance(usage, dict):
                        usage_tokens = usage.get("completion_tokens", usage_tokens)
                        prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                        drafted, accepted = _drafts(usage.get("augury"), "drafted", "accepted", drafted, accepted)
                    drafted, accepted = _drafts(event.get("timings"), "draft_n", "draft_n_accepted", drafted, accepted)
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            if first is None:
                                first = time.perf_counter()
                            text.append(piece)
                            deltas += 1
                        if choice.get("finish_reason"):
                            reason = choice["finish_reason"]
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode("utf-8", errors="replace")
            raise AuguryError(f"endpoint {self.base} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise AuguryError(f"endpoint {self.base} failed: {getattr(exc, 'reason', exc)}") from None
        total = time.perf_counter() - t0
        tokens = usage_tokens if usage_tokens is not None else deltas
        stats = SpecStats(
            prompt_tokens=prompt_tokens, generated_tokens=tokens, prefill_s=(first or t0 + total) - t0, total_s=total,
            drafted=drafted, accepted=accepted,
        )
        return Outcome([], "".join(text), stats, reason)


def _drafts(extension, drafted_key: str, accepted_key: str, drafted: int, accepted: int) -> tuple[int, int]:
    """Drafted and accepted counts from a server's extension object, when it sends them."""
    if not isinstance(extension, dict):
        return drafted, accepted
    return int(extension.get(drafted_key) or drafted), int(extension.get(accepted_key) or accepted)


def _message(error) -> str:
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)
