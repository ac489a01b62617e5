"""Request bodies -> validated jobs: plain functions over JSON values, with no HTTP framework in sight.

Everything here raises `ApiError` (a 4xx with an OpenAI-style body) for bad
input and nothing else, so it can be tested with dicts and a tokenizer alone.
The order is the cheap checks first (`check_request`: model, schema, features,
size in characters), then tokenizing (`tokenize`, which the app runs off the
event loop), then the checks that need the token count (`make_job`).

A prompt that cannot fit the context is refused with OpenAI's code
`context_length_exceeded` and its wording, wherever that is found: too many
token ids, too many messages, too many characters, or too many tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import jinja2

from augury.errors import AuguryError
from augury.grammar import JsonObjectConstraint
from augury.sampling import SamplingParams, is_greedy
from augury.server.schemas import (
    MAX_JSON_DEPTH,
    MAX_TOP_LOGPROBS,
    ApiError,
    Limits,
    chat_schema,
    check_unsupported,
    completion_schema,
    nested_deeper_than,
    validate,
)

Prompt = list[dict] | str | list[int]  # chat messages, text, or token ids


class ChatTokenizer(Protocol):
    """What parsing asks of a tokenizer (`augury.models.tokenizer.Tokenizer` is one)."""

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]: ...

    def encode_chat(self, messages: list[dict], *, add_generation_prompt: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class Rules:
    """What a request must satisfy on this server: the schema's limits and the sizes only parsing checks."""

    limits: Limits  # model name, max_tokens, vocabulary, longest prompt, most messages
    capacity: int  # tokens one sequence may hold, prompt and output together
    max_prompt_chars: int  # refused before tokenizing
    eos_ids: frozenset[int]  # the tokenizer's end-of-sequence ids (min_tokens holds them back)


@dataclass
class Job:
    """A validated generation request."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


def decode_json(raw: bytes) -> Any:
    """A request body's bytes as strict JSON; 400 for empty, non-UTF-8, malformed, NaN, lone surrogates, deep nesting.

    Nesting deeper than MAX_JSON_DEPTH is refused here, before anything walks
    the value recursively.
    """
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


# -- the context: one wording for every way a prompt can be too long -----------------------------------


def _prompt_param(chat: bool) -> str:
    return "messages" if chat else "prompt"


def context_exceeded(rules: Rules, chat: bool, found: str, param: str | None = None,
                     reduce: str | None = None) -> ApiError:
    """OpenAI's 400 for a request that cannot fit: code context_length_exceeded, param messages or prompt.

    found: what the request came to ("resulted in 9000 tokens"); reduce: what to shorten (default: the prompt).
    """
    what = _prompt_param(chat)
    return ApiError(
        400,
        f"This model's maximum context length is {rules.capacity} tokens, of which a prompt may take "
        f"{rules.limits.max_prompt_tokens}. However, your {what} {found}. "
        f"Please reduce the length of the {reduce or what}.",
        param=param or what, code="context_length_exceeded",
    )


def _check_length_before_schema(rules: Rules, body: Any, chat: bool) -> None:
    """Prompts longer than the context, told as such before the schema's item limits name them otherwise.

    A token id is one token, and every message takes at least one token (its
    role marker, if nothing else), so a list longer than the longest prompt
    cannot fit whatever it holds.
    """
    if not isinstance(body, dict):
        return
    longest = rules.limits.max_prompt_tokens
    items = body.get("messages" if chat else "prompt")
    if not isinstance(items, list) or len(items) <= longest:
        return
    if chat:
        raise context_exceeded(rules, chat, f"are {len(items)} messages, which take at least one token each",
                               reduce="messages (fewer of them)")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        raise context_exceeded(rules, chat, f"is {len(items)} token ids")


# -- the cheap checks -------------------------------------------------------------------------------------


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


def wants_json(body: dict) -> bool:
    """Whether a checked request asks for response_format json_object (the grammar mask)."""
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
    if wants_json(body):
        # A complete JSON object may only be followed by an end-of-sequence token: without one
        # (or with it ignored, or held back by min_tokens) nothing could end the object.
        if not eos_ids:
            raise ApiError(400, "response_format json_object needs a model with an end-of-sequence token; "
                           "this one has none", param="response_format", code="unsupported_parameter")
        for name in ("ignore_eos", "min_tokens", "stop"):
            if body.get(name):
                raise ApiError(400, f"'{name}' cannot be combined with response_format json_object: the object "
                               "ends with the end-of-sequence token", param=name, code="unsupported_parameter")


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


def check_request(rules: Rules, body: Any, chat: bool) -> Prompt:
    """The cheap checks, before any templating or tokenizing: model, length, schema, features, size; the prompt."""
    if isinstance(body, dict):
        model = body.get("model")
        served = rules.limits.model
        if isinstance(model, str) and model != served:
            raise ApiError(404, f"the model '{model}' does not exist; this server serves '{served}'",
                           param="model", code="model_not_found")
        check_unsupported(body)
    _check_length_before_schema(rules, body, chat)
    items = body.get("prompt") if isinstance(body, dict) and not chat else None
    if isinstance(items, list) and len(items) <= rules.limits.max_prompt_tokens:  # longer: the schema's words
        kinds = {type(p) for p in items}
        if str in kinds and len(kinds) > 1:
            raise ApiError(400, "'prompt' mixes text with other items: give a text, a list holding one text, or a "
                           "list of token ids", param="prompt")
    validate(body, chat_schema(rules.limits) if chat else completion_schema(rules.limits))
    check_features(body, chat, rules.eos_ids)
    prompt = _prompt(body, chat)
    characters = _characters(prompt)
    if characters > rules.max_prompt_chars:
        raise context_exceeded(rules, chat, f"came to {characters} characters, more than the "
                               f"{rules.max_prompt_chars} this server tokenizes")
    return prompt


def tokenize(tokenizer: ChatTokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a checked prompt (a second or so for megabytes: the app runs it off the event loop).

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
        return tokenizer.encode_chat(prompt)
    except jinja2.TemplateError as exc:
        raise ApiError(400, f"the model's chat template rejected these messages: {exc}", param="messages") from None


# -- the checks that need the token count ------------------------------------------------------------------


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


def make_job(rules: Rules, body: dict, chat: bool, prompt_ids: list[int],
             constraint: JsonObjectConstraint | None = None) -> Job:
    """A checked request with its prompt's ids -> Job; 400 if the prompt and max_tokens do not fit."""
    if not prompt_ids:
        raise ApiError(400, "the prompt is empty", param=_prompt_param(chat))
    tokens = len(prompt_ids)
    if tokens > rules.limits.max_prompt_tokens:
        raise context_exceeded(rules, chat, f"resulted in {tokens} tokens")
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is None:
        max_tokens = min(rules.limits.max_tokens, rules.capacity - tokens)
    elif tokens + max_tokens > rules.capacity:
        raise context_exceeded(rules, chat, f"resulted in {tokens} tokens, and {name} asks for {max_tokens} more",
                               param=name, reduce=f"{_prompt_param(chat)} or {name}")
    stream_options = body.get("stream_options") or {}
    return Job(
        prompt_ids=prompt_ids,
        params=_sampling_params(body, max_tokens, rules.eos_ids, chat, constraint),
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
    )
