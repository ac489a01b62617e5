"""The OpenAI reply format: completion and chat objects, whole or as stream chunks, and the errors in between.

Plain dicts and strings, built from a `GenerationResult` or the engine's
events; sending them is the app's business. Kept apart so the wire format can
be read (and checked against OpenAI's) in one place.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence

from augury.request import GenerationResult, TokenLogprob
from augury.sampling import SamplingParams
from augury.scheduler import Failed
from augury.server.schemas import ApiError

# The lowest log-probability reported (JSON has no -inf; OpenAI's value). A chosen token's is
# clamped to it; alternatives below it are left out: the request's transform rules them out (a
# grammar mask, min_tokens' end-token mask) or as good as (a probability under e^-9999).
LOWEST_LOGPROB = -9999.0


def shutting_down(message: str = "the server is shutting down; retry on another instance") -> ApiError:
    """The 503 of a draining server: closes the connection, so a client retries elsewhere."""
    return ApiError(503, message, type="server_error", code="shutting_down",
                    headers={"Connection": "close", "Retry-After": "1"})


def failure(event: Failed) -> ApiError:
    """The error the engine reported for a request: its own 400, a shutdown's 503, else a bug's 500."""
    if event.kind == "invalid":
        return ApiError(400, event.message)
    if event.kind == "shutdown":
        return shutting_down(event.message)
    return ApiError(500, event.message, type="server_error", code="internal_error")


def sse(data: dict | str) -> str:
    """One server-sent event: a JSON object, or a bare string such as [DONE]."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def _usage(result: GenerationResult, params: SamplingParams) -> dict:
    s = result.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "augury": {"drafted": s.drafted, "accepted": s.accepted, "tau": round(s.tau, 4), "sampling": params.mode},
    }


def _finite(logprob: float) -> float:
    return logprob if logprob > LOWEST_LOGPROB else LOWEST_LOGPROB  # (-inf and NaN too)


class Reply:
    """Builds the JSON objects of one response, completion or chat, whole or streamed.

    Logprobs come as OpenAI defines them: chat choices carry
    {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]},
    completion choices {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
    (each position's alternatives plus the chosen token). A token's text is its
    id decoded alone (`token_text`); alternatives the request's transform rules
    out (a grammar mask) are left out (see LOWEST_LOGPROB). A streamed chunk
    carries the logprobs of the tokens committed since the previous chunk;
    tokens whose text was still held back (a possible stop string) come with a
    later chunk, at the latest with the one that has finish_reason.
    """

    def __init__(self, model: str, chat: bool, params: SamplingParams, token_text: Callable[[int], str]) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.model = model
        self.created = int(time.time())
        self.params = params
        self.token_text = token_text
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
        """The whole answer of a non-streamed request, usage included."""
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
        """One streamed chunk: new text and its tokens' logprobs; the first chat chunk names the role."""
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
        """The last chunk of a stream that asked for include_usage: no choices, the usage."""
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = _usage(result, self.params)
        return body
