"""Request schemas: one description that both validates request bodies and is served as OpenAPI.

The JSON-Schema subset used here (type, minimum/maximum/exclusiveMinimum,
minLength/maxLength, items/minItems/maxItems, properties/required, enum,
anyOf) is checked by `check`, which names the offending parameter in
OpenAI's style ("messages[0].content"). Keeping validation and documentation
in one table means the schema a fuzzer reads is exactly what the server enforces.
Limits that depend on the served model (max_tokens) are filled in by `Limits`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from augury.sampling import GREEDY_BELOW

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TEMPERATURE = 100.0  # far past where sampling is uniform in all but name; OpenAI stops at 2
MAX_CONTENT_PARTS = 1024  # text parts in one message
MAX_JSON_DEPTH = 32  # the deepest valid request nests 5 levels (messages[i].content[j].text)
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI allows 20 in chat, 5 in completions)
IGNORED = "accepted and ignored"


class ApiError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body with this status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What the running server accepts; fills the model-dependent bounds of the schema."""

    model: str
    max_tokens: int  # largest max_tokens a request may ask for
    vocab_size: int
    max_prompt_tokens: int  # longest prompt, so a list of token ids is refused by its length before its items
    max_messages: int = 2048


# -- the schemas ---------------------------------------------------------------------------------


def sampling_properties(limits: Limits) -> dict[str, dict]:
    """Parameters shared by /v1/completions and /v1/chat/completions."""
    return {
        "model": {"type": ["string", "null"], "enum": [limits.model, None],
                  "description": "the served model (see /v1/models)"},
        "max_tokens": {
            "type": ["integer", "null"], "minimum": 1, "maximum": limits.max_tokens,
            "description": "tokens to generate at most; default: as many as fit the context, up to the server limit",
        },
        "temperature": {
            "type": ["number", "null"], "minimum": 0, "maximum": MAX_TEMPERATURE,
            "description": f"0 = greedy; values below {GREEDY_BELOW:g} are treated as greedy",
        },
        "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": ["integer", "null"], "minimum": -1, "maximum": 2**31 - 1, "description": "0 or -1 = off"},
        "min_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "presence_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
        "frequency_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
        "repetition_penalty": {"type": ["number", "null"], "minimum": 0.01, "maximum": 100},
        "seed": {"type": ["integer", "null"], "minimum": INT64_MIN, "maximum": INT64_MAX},
        "stop": {
            "anyOf": [
                {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH},
                {
                    "type": "array", "maxItems": MAX_STOP_STRINGS,
                    "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH},
                },
                {"type": "null"},
            ],
            "description": "generation stops before the first occurrence of any of these strings",
        },
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {
            "type": ["object", "null"],
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1, "description": "only 1 is supported"},
        "ignore_eos": {"type": ["boolean", "null"]},
        "min_tokens": {
            "type": ["integer", "null"], "minimum": 0, "maximum": limits.max_tokens,
            "description": "neither end-of-sequence tokens nor stop strings end the output before this many tokens",
        },
        "response_format": {
            "type": ["object", "null"], "required": ["type"],
            "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}},
            "description": "json_object: the output is a JSON object (cut short only by max_tokens); "
            "json_schema is not supported yet",
        },
        "coupling": {
            "type": ["string", "null"], "enum": ["auto", "coupled", "rejection", None],
            "description": "augury: how a seeded sampled request draws tokens; auto = coupled (the same text "
            "with or without speculation); the mode used is in usage.augury.sampling",
        },
        "user": {"type": ["string", "null"], "description": IGNORED},
        "store": {"type": ["boolean", "null"], "description": IGNORED},
        "metadata": {"type": ["object", "null"], "description": IGNORED},
        "service_tier": {"type": ["string", "null"], "description": IGNORED},
    }


def completion_schema(limits: Limits) -> dict:
    return {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "prompt": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string"}},
                    {
                        "type": "array", "minItems": 1, "maxItems": limits.max_prompt_tokens,
                        "items": {"type": "integer", "minimum": 0, "maximum": limits.vocab_size - 1},
                    },
                ],
                "description": "text, a list holding one text, or token ids",
            },
            **sampling_properties(limits),
            "echo": {"type": ["boolean", "null"], "enum": [False, None], "description": "not supported"},
            "logprobs": {
                "type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                "description": "report each token's log-probability and this many most likely alternatives",
            },
            "best_of": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
        },
    }


TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}


def chat_schema(limits: Limits) -> dict:
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {"anyOf": [{"type": "string"},
                                  {"type": "array", "maxItems": MAX_CONTENT_PARTS, "items": TEXT_PART}]},
            "name": {"type": "string"},
        },
    }
    return {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "maxItems": limits.max_messages, "items": message},
            **sampling_properties(limits),
            "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": limits.max_tokens},
            "parallel_tool_calls": {"type": ["boolean", "null"], "description": IGNORED},
            "logprobs": {"type": ["boolean", "null"], "description": "report each token's log-probability"},
            "top_logprobs": {
                "type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                "description": "this many most likely alternatives per token (needs logprobs: true)",
            },
        },
    }


# Parameters of the OpenAI API this server does not implement: using one is a
# clear 400, never silently ignored. name -> value that means "not used".
UNSUPPORTED_UNLESS = {
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "function_call": (None, "none"),
    "tool_choice": (None, "none"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
# Message fields of tool use, which this server does not implement either (a message keeps only its text).
UNSUPPORTED_IN_MESSAGES = ("tool_calls", "function_call", "tool_call_id")


def check_unsupported(body: dict) -> None:
    """Refuse, with a message saying so, OpenAI features this server does not implement."""
    for name, what in (("n", "choices"), ("best_of", "candidates")):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise ApiError(400, f"'{name}' > 1 is not supported: this server returns one {what[:-1]} per request; "
                           "send separate requests instead", param=name, code="unsupported_parameter")
    if body.get("echo") is True:
        raise ApiError(400, "'echo' is not supported by this server", param="echo", code="unsupported_parameter")
    for name, unused in UNSUPPORTED_UNLESS.items():
        value = body.get(name)
        if not any(value == u and type(value) is type(u) for u in unused):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        for name in UNSUPPORTED_IN_MESSAGES:
            if isinstance(message, dict) and message.get(name) not in (None, [], ""):
                raise ApiError(400, f"messages[{i}].'{name}': tool calls are not supported by this server",
                               param=f"messages[{i}].{name}", code="unsupported_parameter")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        raise ApiError(400, "response_format 'json_schema' is not supported yet; use {'type': 'json_object'}",
                       param="response_format", code="unsupported_parameter")


# -- validation --------------------------------------------------------------------------------------

_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _describe(value: Any) -> str:
    """A short description of a JSON value; never the whole of a huge or deeply nested one."""
    if isinstance(value, list):
        return f"an array of {len(value)} item(s)"
    if isinstance(value, dict):
        return f"an object with {len(value)} key(s)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value[:40] if isinstance(value, str) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (checked without recursion)."""
    level = [value]
    for _ in range(limit + 1):
        inner: list = []
        for v in level:
            if isinstance(v, dict):
                inner.extend(v.values())
            elif isinstance(v, list):
                inner.extend(v)
        if not inner:
            return False
        level = inner
    return True


@dataclass(frozen=True)
class Problem:
    param: str  # where, e.g. "messages[0].content"
    message: str
    wrong_type: bool  # the value there has the wrong JSON type (a weaker explanation inside anyOf)


def errors(value: Any, schema: dict, path: str) -> Problem | None:
    """The first problem of value against schema; None if valid."""
    if "anyOf" in schema:
        problems = [errors(value, option, path) for option in schema["anyOf"]]
        if not all(problems):
            return None
        # The best explanation comes from an option that had the right type all
        # the way down and failed on a value; else from the one option of the
        # right type at this level; else name the expected types.
        typed = [p for p, o in zip(problems, schema["anyOf"]) if _type_ok(value, o)]
        specific = [p for p in typed if not p.wrong_type]
        if specific:
            return specific[0]
        if len(typed) == 1:
            return typed[0]
        kinds = " or ".join(_kind(option) for option in schema["anyOf"])
        return Problem(path, f"'{path}' must be {kinds}, got {_describe(value)}", True)
    if not _type_ok(value, schema):
        return Problem(path, f"'{path}' must be {_kind(schema)}, got {_describe(value)}", True)
    problem = _own_problem(value, schema, path)
    if problem:
        return Problem(path, problem, False)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found = errors(item, schema["items"], f"{path}[{i}]")
            if found:
                return found
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                found = errors(value[name], sub, _join(path, name))
                if found:
                    return found
        for name in schema.get("required", ()):
            if name not in value:
                return Problem(_join(path, name), f"'{_join(path, name)}' is required", False)
    return None


def _own_problem(value: Any, schema: dict, path: str) -> str | None:
    """Enum, range and size checks of one value of the right type (not its items or properties)."""
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        choices = ", ".join(repr(e) for e in schema["enum"])
        return f"'{path}' must be one of {choices}, got {_describe(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):  # 1e999 parses as inf
            return f"'{path}' must be a finite number, got {value}"
        if "minimum" in schema and value < schema["minimum"]:
            return f"'{path}' must be >= {schema['minimum']}, got {_describe(value)}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"'{path}' must be > {schema['exclusiveMinimum']}, got {_describe(value)}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"'{path}' must be <= {schema['maximum']}, got {_describe(value)}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return f"'{path}' must not be empty" if schema["minLength"] == 1 else f"'{path}' is too short"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"'{path}' must be at most {schema['maxLength']} characters"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return f"'{path}' must have at least {schema['minItems']} item(s)"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"'{path}' must have at most {schema['maxItems']} item(s)"
    return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _type_ok(value: Any, schema: dict) -> bool:
    types = schema.get("type")
    if types is None:
        return True
    types = [types] if isinstance(types, str) else types
    return any(_JSON_TYPES[t](value) for t in types)


def _kind(schema: dict) -> str:
    types = schema.get("type")
    if types is None:
        return "a value"
    types = [types] if isinstance(types, str) else types
    names = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
             "array": "an array", "object": "an object", "null": "null"}
    plural = {"string": "strings", "integer": "integers", "number": "numbers", "object": "objects"}
    item_type = schema.get("items", {}).get("type")
    if isinstance(item_type, str) and item_type in plural:
        names["array"] = f"an array of {plural[item_type]}"
    return " or ".join(names[t] for t in types)


def validate(body: Any, schema: dict) -> dict:
    """Raise ApiError 400 naming the first invalid parameter of a request body."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    found = errors(body, schema, "")
    if found:
        raise ApiError(400, found.message, param=found.param)
    return body


# -- OpenAPI -------------------------------------------------------------------------------------------


def _error_response(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def openapi(limits: Limits, *, auth: bool) -> dict:
    """The OpenAPI 3.1 document for this server."""
    errors_4xx = {
        "400": _error_response("invalid request"),
        "401": _error_response("missing or wrong API key"),
        "404": _error_response("unknown model"),
        "413": _error_response("request body too large"),
        "429": _error_response("queue full or queue wait timed out"),
    }

    def generation(summary: str, schema_name: str) -> dict:
        return {
            "post": {
                "summary": summary,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}},
                },
                "responses": {
                    "200": {
                        "description": "the completion (JSON), or with stream=true server-sent events ending "
                        "with 'data: [DONE]'",
                        "content": {"application/json": {"schema": {"type": "object"}},
                                    "text/event-stream": {"schema": {"type": "string"}}},
                    },
                    **errors_4xx,
                },
                **({"security": [{"bearer": []}]} if auth else {}),
            }
        }

    def simple(summary: str, media: str = "application/json", secured: bool = True) -> dict:
        return {
            "get": {
                "summary": summary,
                "responses": {"200": {"description": "OK", "content": {media: {"schema": {"type": "object"}
                                                                              if media.endswith("json")
                                                                              else {"type": "string"}}}}},
                **({"security": [{"bearer": []}]} if auth and secured else {}),
            }
        }

    doc = {
        "openapi": "3.1.0",
        "info": {"title": "augury", "version": "1", "description": "OpenAI-compatible API with lossless speculative "
                 "decoding and continuous batching"},
        "paths": {
            "/v1/completions": generation("text completion", "CompletionRequest"),
            "/v1/chat/completions": generation("chat completion", "ChatCompletionRequest"),
            "/v1/models": simple("the served model"),
            "/health": simple("liveness", secured=False),
            "/metrics": simple("Prometheus metrics", media="text/plain"),
        },
        "components": {
            "schemas": {
                "CompletionRequest": completion_schema(limits),
                "ChatCompletionRequest": chat_schema(limits),
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "object", "properties": {
                        "message": {"type": "string"}, "type": {"type": "string"},
                        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]},
                    }}},
                },
            },
        },
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
