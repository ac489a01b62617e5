"""response_format json_object through the server (issue 16, item 11).

A tiny target over the full 96-character alphabet (so it can write JSON) with
an end-of-sequence id, served twice: speculating with its one-layer drafter,
and plain. The grammar mask is applied to p_target and q_draft alike, so
constrained speculation is lossless: greedy and seeded (coupled) outputs are
identical with and without speculation and equal `Engine` plain constrained
decoding. Every output is a prefix of a JSON object, and parses whenever
finish_reason is "stop".
"""

from __future__ import annotations

import contextlib
import json
import math
import threading

import httpx
import pytest

from augury.engine import Engine
from augury.grammar import START, JsonMachine, JsonObjectConstraint
from augury.proposers.draft_model import DraftModelProposer
from augury.sampling import SamplingParams
from tests.test_server import ChatCharTokenizer
from tests.test_server_hardening import assert_error, running, still_serving, tiny_server
from tests.test_server_logprobs import post, sse
from tests.tiny import CharTokenizer, tiny_model

JSON_VOCAB = 96  # the whole alphabet: { } " : , [ ] digits and letters
EOS = CharTokenizer.ALPHABET.index("~")
JSON = {"type": "json_object"}
PROMPTS = ["U {x}.", "a: 1", "give json", "hello world", "abc"]


def json_model(layers: int) -> object:
    model = tiny_model(vocab=JSON_VOCAB, seed=1, layers=layers, eos_id=EOS)
    model.tokenizer = ChatCharTokenizer(JSON_VOCAB, eos_id=EOS)
    return model


@pytest.fixture(scope="module")
def servers():
    """(speculative client, plain client, the target), the speculative one drafting K = 4 every step."""
    target = json_model(2)
    with contextlib.ExitStack() as stack:
        spec_base, scheduler = stack.enter_context(running(target, DraftModelProposer(json_model(1), JSON_VOCAB)))
        scheduler.planner.adaptive = False
        plain_base, _ = stack.enter_context(running(json_model(2)))
        spec = stack.enter_context(httpx.Client(base_url=spec_base, timeout=60))
        plain = stack.enter_context(httpx.Client(base_url=plain_base, timeout=60))
        yield spec, plain, target


def check_json(text: str, finish_reason: str) -> bool:
    """The output is a JSON-object prefix, and a whole object when it stopped; True if it stopped."""
    assert JsonMachine.feed(START, text) is not None, f"not a prefix of a JSON object: {text!r}"
    if finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
        return True
    assert finish_reason == "length"
    return False


def output(reply: dict) -> tuple[str, str]:
    choice = reply["choices"][0]
    return (choice["message"]["content"] if "message" in choice else choice["text"]), choice["finish_reason"]


def streamed(http: httpx.Client, path: str, body: dict) -> tuple[str, str]:
    chunks = [c["choices"][0] for c in sse(http, path, body) if c["choices"]]
    text = "".join(c["delta"].get("content") or "" if "delta" in c else c["text"] for c in chunks)
    return text, chunks[-1]["finish_reason"]


def test_greedy_json_with_speculation_equals_plain_constrained_decoding(servers):
    spec, plain, target = servers
    constraint = JsonObjectConstraint.for_tokenizer(target.tokenizer, JSON_VOCAB)
    stopped = drafted = accepted = 0
    for prompt in PROMPTS:
        for path, body in (("/v1/completions", {"prompt": prompt}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})):
            body = {**body, "max_tokens": 48, "temperature": 0, "response_format": JSON}
            got = post(spec, path, body)
            text, finish = output(got)
            assert (text, finish) == output(post(plain, path, body)), f"{prompt!r}: speculation changed the output"
            assert streamed(spec, path, body) == (text, finish) == streamed(plain, path, body)
            ids = target.tokenizer.encode(prompt if "prompt" in body else
                                          target.tokenizer.apply_chat_template(body["messages"]))
            engine = Engine(target).generate(ids, SamplingParams(max_tokens=48, constraint=constraint))
            assert (text, finish) == (engine.text, engine.finish_reason), "the server differs from plain decoding"
            stopped += check_json(text, finish)
            drafted += got["usage"]["augury"]["drafted"]
            accepted += got["usage"]["augury"]["accepted"]
    assert stopped >= 2 and stopped < 2 * len(PROMPTS), "the prompts should give both whole objects and cut ones"
    assert drafted > 0 and accepted > 0


def test_sampled_json_is_always_valid_and_seeded_output_is_lossless(servers):
    spec, plain, _ = servers
    stopped = 0
    for seed in range(12):
        path, body = (("/v1/completions", {"prompt": PROMPTS[seed % 5]}) if seed % 2 else
                      ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[seed % 5]}]}))
        body = {**body, "max_tokens": 40, "temperature": 1.0, "seed": seed, "response_format": JSON,
                **({"top_k": 30, "top_p": 0.9} if seed % 3 == 0 else {})}
        got = post(spec, path, body)
        assert got["usage"]["augury"]["sampling"] == "coupled"
        text, finish = output(got)
        assert (text, finish) == output(post(plain, path, body)), f"seed {seed}: speculation changed the sample"
        stopped += check_json(text, finish)
    for seed in range(8):  # rejection sampling, and unseeded: other texts, the same guarantee
        body = {"prompt": PROMPTS[seed % 5], "max_tokens": 40, "temperature": 1.0, "response_format": JSON,
                **({"seed": seed, "coupling": "rejection"} if seed % 2 else {})}
        got = post(spec, "/v1/completions", body)
        assert got["usage"]["augury"]["sampling"] == "rejection"
        stopped += check_json(*output(got))
        stopped += check_json(*streamed(spec, "/v1/completions", body))
    assert stopped >= 5, "too few samples ended: 'always parses when it stops' was hardly tested"


def test_logprobs_under_the_grammar_list_only_allowed_tokens(servers):
    """The reported distribution is the masked one: at the first position only '{' and whitespace may
    come, so the top alternatives are at most those, and their probabilities sum to 1."""
    spec, plain, _ = servers
    body = {"prompt": "abc", "max_tokens": 12, "temperature": 0, "response_format": JSON, "logprobs": 20}
    got = post(spec, "/v1/completions", body)
    assert got["choices"][0]["logprobs"] == post(plain, "/v1/completions", body)["choices"][0]["logprobs"]
    first = got["choices"][0]["logprobs"]["top_logprobs"][0]
    assert set(first) <= {"{", " ", "\n"} and "{" in first, first
    assert math.fsum(math.exp(v) for v in first.values()) == pytest.approx(1.0, abs=1e-5)
    chat = post(spec, "/v1/chat/completions", {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 6,
                                               "temperature": 0, "response_format": JSON, "logprobs": True,
                                               "top_logprobs": 20})
    top = chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert {t["token"] for t in top} <= {"{", " ", "\n"} and all(t["logprob"] > -1e4 for t in top)


def test_response_format_values(servers):
    spec, _, _ = servers
    base = {"prompt": "abc", "max_tokens": 8, "temperature": 0}
    plain_text = post(spec, "/v1/completions", base)["choices"][0]["text"]
    for fmt in ({"type": "text"}, None):
        assert post(spec, "/v1/completions", {**base, "response_format": fmt})["choices"][0]["text"] == plain_text
    error = assert_error(spec.post("/v1/completions", json={**base, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}), 400,
        "response_format", "unsupported_parameter")
    assert "json_schema" in error["message"] and "not supported yet" in error["message"]
    for fmt, param in (({"type": "xml"}, "response_format.type"), ({}, "response_format.type"),
                       ("json", "response_format"), ({"type": 1}, "response_format.type")):
        assert_error(spec.post("/v1/completions", json={**base, "response_format": fmt}), 400, param)
    for name, value in (("ignore_eos", True), ("min_tokens", 3)):
        assert_error(spec.post("/v1/completions", json={**base, "response_format": JSON, name: value}), 400, name,
                     "unsupported_parameter")
        assert_error(spec.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "abc"}],
                                                             "response_format": JSON, name: value}), 400, name)
    assert post(spec, "/v1/completions", {**base, "response_format": JSON, "ignore_eos": False, "min_tokens": 0})


def test_a_model_without_an_end_token_refuses_json_object():
    """Only an end-of-sequence token may follow a complete object; without one nothing could end it."""
    with tiny_server() as (base, _), httpx.Client(base_url=base, timeout=30) as http:
        error = assert_error(http.post("/v1/completions", json={"prompt": "abc", "response_format": JSON}), 400,
                             "response_format")
        assert "end-of-sequence" in error["message"]
        still_serving(http)


def test_the_mask_is_built_once_per_server_even_under_concurrent_first_requests(monkeypatch):
    built = []
    original = JsonObjectConstraint.for_tokenizer.__func__

    def counting(cls, tokenizer, vocab_size):
        built.append(vocab_size)
        return original(cls, tokenizer, vocab_size)

    monkeypatch.setattr(JsonObjectConstraint, "for_tokenizer", classmethod(counting))
    with running(json_model(2)) as (base, _):
        replies: list[httpx.Response] = []

        def ask(prompt: str) -> None:
            replies.append(httpx.post(f"{base}/v1/completions", timeout=60, json={
                "prompt": prompt, "max_tokens": 16, "temperature": 0, "response_format": JSON}))

        threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ask("abc")
        assert [r.status_code for r in replies] == [200] * (len(PROMPTS) + 1)
        for r in replies:
            check_json(*output(r.json()))
    assert built == [JSON_VOCAB], f"the mask was built {len(built)} times"
