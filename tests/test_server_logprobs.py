"""logprobs through the server (issue 16, item 10) and the sampling mode in usage (issue 17).

Two live servers over the same tiny target: one speculating with its
one-layer drafter, one plain. The target scores every committed token while
verifying, so the speculative server must report exactly the plain server's
logprobs (the same JSON floats, bit for bit, for greedy requests), whole and
streamed, chat and completions; and both must equal `Engine` plain decoding's.
"""

from __future__ import annotations

import contextlib
import json
import math

import httpx
import pytest

from augury.engine import Engine
from augury.proposers.draft_model import DraftModelProposer
from augury.sampling import SamplingParams
from tests.test_server import VOCAB, ChatCharTokenizer, encode, tiny_pair
from tests.test_server_hardening import assert_error, running, still_serving

PROMPTS = ["hello world", "The quick brown fox", "abc abc abc"]


@pytest.fixture(scope="module")
def servers():
    """(speculative client, plain client, the target both serve).

    The speculative server drafts K = 4 at every step: its adaptive planner would soon stop drafting
    for this drafter on so fast a model, and then the comparison would show little.
    """
    target, draft = tiny_pair()
    plain_target, _ = tiny_pair()
    with contextlib.ExitStack() as stack:
        spec_base, scheduler = stack.enter_context(running(target, DraftModelProposer(draft, VOCAB)))
        scheduler.planner.adaptive = False
        plain_base, _ = stack.enter_context(running(plain_target))
        spec = stack.enter_context(httpx.Client(base_url=spec_base, timeout=60))
        plain = stack.enter_context(httpx.Client(base_url=plain_base, timeout=60))
        yield spec, plain, target


def post(http: httpx.Client, path: str, body: dict) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def sse(http: httpx.Client, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed response (without the final [DONE])."""
    with http.stream("POST", path, json={**body, "stream": True,
                                         "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200, response.read()
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def joined_completion_logprobs(chunks: list[dict]) -> dict:
    """The logprobs of a streamed completion, chunk by chunk joined into one object."""
    whole: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice["logprobs"] is not None:
                for name in whole:
                    whole[name] += choice["logprobs"][name]
    return whole


def joined_chat_logprobs(chunks: list[dict]) -> list[dict]:
    return [entry for chunk in chunks for choice in chunk["choices"] if choice["logprobs"] is not None
            for entry in choice["logprobs"]["content"]]


def check_completion_logprobs(lp: dict, text: str, n: int, greedy: bool) -> None:
    """Shape and sense of a completion's logprobs: one entry per token, offsets, every logprob <= 0,
    alternatives sorted, the chosen token among them; greedy tokens are the most likely."""
    tokens = lp["tokens"]
    assert len(tokens) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert "".join(tokens) == text, "the character tokenizer's tokens spell the text"
    assert lp["text_offset"] == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    for token, logprob, top in zip(tokens, lp["token_logprobs"], lp["top_logprobs"]):
        assert logprob <= 0.0 and math.isfinite(logprob)
        values = list(top.values())
        assert values == sorted(values, reverse=True), f"alternatives not sorted: {top}"
        assert all(v <= 0.0 for v in values)
        assert top[token] == logprob, "the chosen token is in its position's dict with its own logprob"
        assert n <= len(top) <= n + 1
        if greedy:
            assert logprob == values[0], f"greedy chose {token!r} ({logprob}) but {top} has a likelier one"


def check_chat_logprobs(content: list[dict], text: str, n: int, greedy: bool) -> None:
    assert "".join(e["token"] for e in content) == text
    for entry in content:
        assert entry["bytes"] == list(entry["token"].encode("utf-8"))
        assert entry["logprob"] <= 0.0
        top = entry["top_logprobs"]
        assert len(top) == n
        assert all(t["bytes"] == list(t["token"].encode("utf-8")) and t["logprob"] <= 0.0 for t in top)
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        if greedy and n:
            assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"]), \
                "a greedy token is its position's most likely one"


# -- completions ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 3, 20])
def test_completion_logprobs_with_speculation_equal_plain_bitwise(servers, n):
    spec, plain, _ = servers
    drafted = accepted = 0
    for prompt in PROMPTS:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": n}
        got, want = post(spec, "/v1/completions", body), post(plain, "/v1/completions", body)
        choice = got["choices"][0]
        assert choice["text"] == want["choices"][0]["text"]
        assert choice["logprobs"] == want["choices"][0]["logprobs"], "speculation changed the logprobs"
        check_completion_logprobs(choice["logprobs"], choice["text"], n, greedy=True)
        assert len(choice["logprobs"]["tokens"]) == got["usage"]["completion_tokens"]
        drafted += got["usage"]["augury"]["drafted"]
        accepted += got["usage"]["augury"]["accepted"]
        assert want["usage"]["augury"]["drafted"] == 0

        chunks = sse(spec, "/v1/completions", body)
        assert joined_completion_logprobs(chunks) == choice["logprobs"], "streamed logprobs differ from whole"
        for chunk in chunks:  # without stop strings nothing is held back: each chunk's tokens spell its text
            for c in chunk["choices"]:
                assert "".join(c["logprobs"]["tokens"] if c["logprobs"] else []) == c["text"]
        assert joined_completion_logprobs(sse(plain, "/v1/completions", body)) == choice["logprobs"]
    assert drafted > 0 and accepted > 0, "the speculative server must really speculate for this to show anything"


def test_completion_logprobs_equal_the_plain_engine(servers):
    """The numbers themselves: those `Engine` plain decoding records, with each id decoded alone."""
    spec, _, target = servers
    tokenizer = ChatCharTokenizer(VOCAB)
    for prompt in PROMPTS:
        ids = encode(prompt)
        result = Engine(target).generate(ids, SamplingParams(max_tokens=20, logprobs=4))
        lp = post(spec, "/v1/completions", {"prompt": ids, "max_tokens": 20, "temperature": 0, "logprobs": 4})[
            "choices"][0]["logprobs"]
        assert lp["tokens"] == [tokenizer.decode([t]) for t in result.token_ids]
        assert lp["token_logprobs"] == [e.logprob for e in result.logprobs]
        assert lp["top_logprobs"] == [{tokenizer.decode([t]): v for t, v in e.top} for e in result.logprobs]


def test_streamed_logprobs_with_a_stop_string_cover_every_token(servers):
    """Text held back for a possible stop string: its tokens' logprobs come with a later chunk, at the
    latest with finish_reason; the whole stream's logprobs equal the non-streamed answer's."""
    spec, plain, _ = servers
    full = post(plain, "/v1/completions", {"prompt": "hello world", "max_tokens": 30, "temperature": 0})
    text = full["choices"][0]["text"]
    stop = text[10:13]
    body = {"prompt": "hello world", "max_tokens": 30, "temperature": 0, "logprobs": 2, "stop": [stop, "zz"]}
    got = post(spec, "/v1/completions", body)
    choice = got["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == text[: text.index(stop)]
    assert choice["logprobs"] == post(plain, "/v1/completions", body)["choices"][0]["logprobs"]
    tokens = choice["logprobs"]["tokens"]
    assert len(tokens) == got["usage"]["completion_tokens"], "one entry per generated token"
    assert "".join(tokens).startswith(choice["text"] + stop), "the stop string's tokens are reported too"
    finals = []
    for http in (spec, plain):
        chunks = sse(http, "/v1/completions", body)
        assert joined_completion_logprobs(chunks) == choice["logprobs"]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == choice["text"]
        finals += [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    # Plain decoding commits the stop string's last token alone, and that releases no text: its
    # logprobs (and those of the held-back tokens before it) come with the finish_reason chunk.
    assert any(finals), "the held-back tokens' logprobs were expected in a finish_reason chunk"


# -- chat -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("top", [None, 0, 5])
def test_chat_logprobs_with_speculation_equal_plain_bitwise(servers, top):
    spec, plain, _ = servers
    for prompt in PROMPTS:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 20, "temperature": 0,
                "logprobs": True, **({} if top is None else {"top_logprobs": top})}
        got, want = post(spec, "/v1/chat/completions", body), post(plain, "/v1/chat/completions", body)
        choice = got["choices"][0]
        assert choice["message"] == want["choices"][0]["message"]
        assert choice["logprobs"] == want["choices"][0]["logprobs"]
        content = choice["logprobs"]["content"]
        assert len(content) == got["usage"]["completion_tokens"]
        check_chat_logprobs(content, choice["message"]["content"], top or 0, greedy=True)
        chunks = sse(spec, "/v1/chat/completions", body)
        assert joined_chat_logprobs(chunks) == content
        assert joined_chat_logprobs(sse(plain, "/v1/chat/completions", body)) == content


def test_chat_without_logprobs_has_none(servers):
    spec, _, _ = servers
    body = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 5, "temperature": 0}
    for flag in ({}, {"logprobs": False}, {"logprobs": None, "top_logprobs": 0}):
        assert post(spec, "/v1/chat/completions", {**body, **flag})["choices"][0]["logprobs"] is None
        assert all(c["logprobs"] is None for chunk in sse(spec, "/v1/chat/completions", {**body, **flag})
                   for c in chunk["choices"])
    assert post(spec, "/v1/completions", {"prompt": "abc", "max_tokens": 3})["choices"][0]["logprobs"] is None


# -- sampled requests and the sampling mode --------------------------------------------------------------


def test_seeded_sampled_logprobs_with_speculation_equal_plain(servers):
    """Coupled sampling (the default for seeded requests) gives the same tokens with or without
    speculation, and their logprobs (under the request's temperature and penalties) are the same bits."""
    spec, plain, _ = servers
    sampled = 0
    for seed in range(4):
        for path, body in (("/v1/completions", {"prompt": PROMPTS[seed % 3], "logprobs": 3}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[seed % 3]}],
                                                     "logprobs": True, "top_logprobs": 3})):
            body = {**body, "max_tokens": 20, "temperature": 0.8, "top_p": 0.95, "presence_penalty": 0.5,
                    "seed": seed}
            got, want = post(spec, path, body), post(plain, path, body)
            assert got["usage"]["augury"]["sampling"] == want["usage"]["augury"]["sampling"] == "coupled"
            assert got["choices"][0] == want["choices"][0], f"seed {seed}: speculation changed the answer"
            logprobs = got["choices"][0]["logprobs"]
            if "content" in logprobs:
                check_chat_logprobs(logprobs["content"], got["choices"][0]["message"]["content"], 3, greedy=False)
                assert joined_chat_logprobs(sse(spec, path, body)) == logprobs["content"]
            else:
                check_completion_logprobs(logprobs, got["choices"][0]["text"], 3, greedy=False)
                sampled += any(v != max(top.values()) for v, top in zip(logprobs["token_logprobs"],
                                                                        logprobs["top_logprobs"]))
                assert joined_completion_logprobs(sse(spec, path, body)) == logprobs
    assert sampled, "some sampled token should not be the most likely one, or sampling was greedy"


def test_usage_reports_the_sampling_mode_and_coupling_is_a_request_field(servers):
    spec, plain, _ = servers
    base = {"prompt": "abc def", "max_tokens": 12}

    def mode(body: dict, http: httpx.Client = spec) -> str:
        return post(http, "/v1/completions", {**base, **body})["usage"]["augury"]["sampling"]

    assert mode({"temperature": 0}) == "greedy"
    assert mode({"temperature": 0, "seed": 1, "coupling": "rejection"}) == "greedy"
    assert mode({"temperature": 0, "coupling": "coupled"}) == "greedy", "greedy needs no seed to be reproducible"
    assert mode({"temperature": 0.7}) == "rejection", "unseeded sampling cannot be coupled"
    assert mode({"temperature": 0.7, "seed": 1}) == mode({"temperature": 0.7, "seed": 1, "coupling": "auto"}) \
        == mode({"temperature": 0.7, "seed": 1, "coupling": "coupled"}) == "coupled"
    assert mode({"temperature": 0.7, "seed": 1, "coupling": "rejection"}) == "rejection"
    streamed = sse(spec, "/v1/completions", {**base, "temperature": 0.7, "seed": 1, "coupling": "rejection"})
    assert streamed[-1]["usage"]["augury"]["sampling"] == "rejection"
    # Rejection sampling with a seed still reproduces itself on one server.
    body = {**base, "max_tokens": 24, "temperature": 1.0, "seed": 5, "coupling": "rejection"}
    assert post(spec, "/v1/completions", body)["choices"][0]["text"] == \
        post(spec, "/v1/completions", body)["choices"][0]["text"]
    chat = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 4, "temperature": 0.5, "seed": 2,
            "coupling": "coupled"}
    assert post(spec, "/v1/chat/completions", chat)["usage"]["augury"]["sampling"] == "coupled"


# -- bad values ---------------------------------------------------------------------------------------------

BAD = [
    ("/v1/chat/completions", {"logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "n": 2}, "n"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": "3"}, "logprobs"),
    ("/v1/completions", {"logprobs": 1e400}, "logprobs"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 2, "n": 3}, "n"),
    ("/v1/completions", {"coupling": "gumbel"}, "coupling"),
    ("/v1/completions", {"coupling": 1}, "coupling"),
    ("/v1/chat/completions", {"coupling": ""}, "coupling"),
    ("/v1/completions", {"coupling": "coupled", "temperature": 0.7}, "coupling"),  # coupled needs a seed
]


def test_bad_logprobs_and_coupling_values_get_400_naming_the_field(servers):
    spec, _, _ = servers
    for path, extra, param in BAD:
        base = {"messages": [{"role": "user", "content": "abc"}]} if "chat" in path else {"prompt": "abc"}
        raw = json.dumps({**base, "max_tokens": 3, **extra}).replace("Infinity", "1e400")
        response = spec.post(path, content=raw, headers={"Content-Type": "application/json"})
        error = assert_error(response, 400, param)
        assert param in error["message"], error
    still_serving(spec)
    assert 'code="5' not in spec.get("/metrics").text
