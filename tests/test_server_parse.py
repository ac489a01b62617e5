"""Request parsing and the guard's header rules as plain functions: dicts and bytes in, jobs or ApiError out.

No server runs here; test_server_hardening.py sends the same edges over sockets.
"""

from __future__ import annotations

import pytest

from augury.sampling import GREEDY_BELOW, SamplingParams, is_greedy
from augury.server.guard import bearer_token, framing_error
from augury.server.parse import Rules, check_request, decode_json, make_job, tokenize
from augury.server.schemas import ApiError, Limits
from tests.test_server import MODEL, VOCAB, ChatCharTokenizer

RULES = Rules(Limits(model=MODEL, max_tokens=64, vocab_size=VOCAB, max_prompt_tokens=511), capacity=512,
              max_prompt_chars=32 * 511, eos_ids=frozenset())


def job_for(body: dict, chat: bool = False):
    """What the server does with a body, minus the event loop: check, tokenize, make the job."""
    prompt = check_request(RULES, body, chat)
    return make_job(RULES, body, chat, tokenize(ChatCharTokenizer(VOCAB), prompt))


def refusal(body: dict, chat: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        job_for(body, chat)
    return caught.value


@pytest.mark.parametrize("body, chat, param", [
    ({"messages": [{"role": "user", "content": "a"}] * 55_000}, True, "messages"),
    ({"messages": [{"role": "user", "content": "a"}] * 600}, True, "messages"),
    ({"prompt": [1] * 100_000}, False, "prompt"),
    ({"prompt": "a" * 600}, False, "prompt"),
    ({"prompt": "a" * (32 * 511 + 1)}, False, "prompt"),  # past the character limit: never tokenized
    ({"prompt": "a" * 500, "max_tokens": 20}, False, "max_tokens"),
])
def test_every_prompt_too_long_for_the_context_is_context_length_exceeded(body, chat, param):
    error = refusal(body, chat)
    assert (error.status, error.type, error.param, error.code) == (
        400, "invalid_request_error", param, "context_length_exceeded"), error.body()
    assert error.message.startswith("This model's maximum context length is 512 tokens"), error.message


def test_a_list_of_many_non_ids_is_left_to_the_schema():
    error = refusal({"prompt": ["a"] * 600})
    assert (error.status, error.param, error.code) == (400, "prompt", None), error.body()


def test_the_longest_prompt_fits():
    job = job_for({"prompt": [1] * 511, "max_tokens": 1})
    assert len(job.prompt_ids) == 511 and job.params.max_tokens == 1
    assert job_for({"prompt": [1] * 500}).params.max_tokens == 12  # the default: what is left of the context


def test_chat_prompts_go_through_the_tokenizers_chat_interface():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tokenize(ChatCharTokenizer(VOCAB), messages) == ChatCharTokenizer(VOCAB).encode_chat(messages)


def test_one_temperature_rule_for_the_server_and_the_cli():
    below, at = GREEDY_BELOW / 10, GREEDY_BELOW
    assert is_greedy(0.0) and is_greedy(below) and not is_greedy(at)
    assert SamplingParams(temperature=below).greedy and not SamplingParams(temperature=at).greedy  # the CLI's
    assert job_for({"prompt": "ab", "temperature": below}).params.mode == "greedy"  # the server's
    assert job_for({"prompt": "ab", "temperature": at, "seed": 1}).params.mode == "coupled"
    # coupled sampling needs a seed only where it samples
    assert job_for({"prompt": "ab", "temperature": below, "coupling": "coupled"}).params.greedy
    assert refusal({"prompt": "ab", "temperature": at, "coupling": "coupled"}).param == "coupling"


@pytest.mark.parametrize("raw, says", [
    (b"", "empty"), (b"\xff", "UTF-8"), (b"{", "malformed"), (b'{"a": NaN}', "NaN"),
    (b'"\\ud800"', "surrogate"), (b"[" * 40 + b"]" * 40, "nests"),
])
def test_bad_bodies_are_one_line_400s(raw, says):
    with pytest.raises(ApiError) as caught:
        decode_json(raw)
    assert caught.value.status == 400 and says in caught.value.message and "\n" not in caught.value.message


@pytest.mark.parametrize("value, token", [
    (b"Bearer k", b"k"), (b"bearer k", b"k"), (b"BEARER k", b"k"), (b"Bearer   k", b"k"), (b"Bearer k k", b"k k"),
    (b"Basic k", None), (b"Bearerk", None), (b"Bearer", None), (b"k", None), (b"", None),
])
def test_the_bearer_scheme_is_case_insensitive(value, token):
    assert bearer_token(value) == token


def test_framing_by_both_length_and_chunks_is_refused():
    both = [(b"content-length", b"4"), (b"transfer-encoding", b"chunked")]
    error = framing_error(both)
    assert error is not None and (error.status, error.code) == (400, "ambiguous_framing")
    assert error.headers == {"Connection": "close"}
    assert framing_error(both[:1]) is None and framing_error(both[1:]) is None


@pytest.mark.parametrize("field, value", [
    ("prediction", {"type": "content", "content": "x"}), ("reasoning_effort", "high"), ("web_search_options", {}),
])
def test_openai_fields_this_server_does_not_implement_are_400s_not_ignored(field, value):
    error = refusal({"messages": [{"role": "user", "content": "a"}], field: value}, chat=True)
    assert (error.status, error.param, error.code) == (400, field, "unsupported_parameter")
    assert job_for({"messages": [{"role": "user", "content": "a"}], field: None}, chat=True)  # null: not used


def test_tool_calls_in_messages_are_refused_not_dropped():
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": call}]
    error = refusal({"messages": messages}, chat=True)
    assert (error.status, error.param, error.code) == (400, "messages[1].tool_calls", "unsupported_parameter")
    tool = [{"role": "tool", "content": "42", "tool_call_id": "c1"}]
    assert refusal({"messages": tool}, chat=True).param == "messages[0].tool_call_id"
    messages[1]["tool_calls"] = []  # an empty list asks for nothing
    assert job_for({"messages": messages}, chat=True)


def test_json_object_output_cannot_be_cut_by_stop_strings():
    rules = Rules(RULES.limits, capacity=RULES.capacity, max_prompt_chars=RULES.max_prompt_chars, eos_ids=frozenset({1}))
    body = {"prompt": "ab", "response_format": {"type": "json_object"}}
    check_request(rules, body, chat=False)  # alone: accepted
    for stop in ('"', ["}", "x"]):
        with pytest.raises(ApiError) as caught:
            check_request(rules, {**body, "stop": stop}, chat=False)
        assert (caught.value.status, caught.value.param) == (400, "stop")
    check_request(rules, {**body, "stop": []}, chat=False)  # no stop strings: accepted


def test_a_null_model_means_the_served_one_and_a_mixed_prompt_is_named():
    assert job_for({"prompt": "ab", "model": None}).prompt_ids == job_for({"prompt": "ab"}).prompt_ids
    error = refusal({"prompt": [1, "a"]})
    assert error.param == "prompt" and "mixes text" in error.message
    error = refusal({"prompt": ["a", "b"]})  # two texts: the schema's own words (one text at most)
    assert error.param == "prompt" and "mixes" not in error.message
