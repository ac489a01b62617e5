"""Model-based drafters beyond the same-tokenizer draft model: cross-tokenizer, layer-skip, quantized.

Greedy equivalence on tiny fp32 models for every method and K, the text <->
token conversion of cross-tokenizer drafting on boundary cases, gemma's
sliding-window pattern under layer skipping, the calibration file and bad
--skip-layers input; one real-model test of cross drafting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from augury.engine import Engine
from augury.errors import AuguryError
from augury.models.decoder import Decoder, ModelConfig, Weights
from augury.models.loader import Model
from augury.proposers import build_proposer
from augury.proposers import cross_tokenizer
from augury.proposers.cross_tokenizer import (
    CrossTokenizerProposer,
    TextTracker,
    decode_after,
    draft_text_to_target,
    word_start_before,
)
from augury.proposers.skipped_layers import (
    calibration_path,
    parse_skip_layers,
    read_calibration,
    skip_layers,
    write_calibration,
)
from augury.models.low_bit import Int8Weight, quantize_decoder
from augury.sampling import SamplingParams
from tests.tiny import random_decoder, tiny_model

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 10, 11, 7, 7, 8], [0, 5, 10, 15, 20, 5, 10]]


class PieceTokenizer:
    """A fake tokenizer over a list of string pieces: greedy longest-match encoding, decode by joining.

    Two of these with different piece lists give different ids for the same
    text, which is what cross-tokenizer drafting has to bridge.
    strip_leading_space imitates sentencepiece, whose decode drops the space
    that starts the first token.
    """

    def __init__(self, pieces: list[str], eos: str | None = None, strip_leading_space: bool = False) -> None:
        self.pieces = pieces
        self.vocab = {p: i for i, p in enumerate(pieces)}
        self.vocab_size = len(pieces)
        self.eos_ids = frozenset({self.vocab[eos]}) if eos else frozenset()
        self.bos_id = None
        self.strip_leading_space = strip_leading_space
        self.longest = max(len(p) for p in pieces)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for n in range(min(self.longest, len(text) - i), 0, -1):
                if text[i : i + n] in self.vocab:
                    ids.append(self.vocab[text[i : i + n]])
                    i += n
                    break
            else:
                raise KeyError(text[i])
        return ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        text = "".join(self.pieces[i] for i in ids if not (skip_special and i in self.eos_ids))
        return text[1:] if self.strip_leading_space and text.startswith(" ") else text


class ByteTokenizer:
    """UTF-8 bytes as tokens: a character may take several tokens, as in byte-level BPE."""

    eos_ids = frozenset()

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


ALPHABET = "abcdefgh ."  # 10 characters; every piece list below covers each of them
TARGET_PIECES = list(ALPHABET) + ["ab", "ba", " a", "cd", "<e>"]  # 15 pieces
DRAFT_PIECES = list(reversed(ALPHABET)) + ["ha", "ge", " b", "fed", "dc", "<e>"]  # another order, other merges


def pieces_model(pieces: list[str], seed: int, eos: str | None = None, layers: int = 2) -> Model:
    decoder = random_decoder(vocab=len(pieces), seed=seed, layers=layers, hidden=32)
    return Model(name=f"pieces-{seed}", decoder=decoder, tokenizer=PieceTokenizer(pieces, eos), source=Path("."))


# -- cross-tokenizer: text <-> tokens ------------------------------------------------------


def test_decode_after_keeps_the_leading_space_a_sentencepiece_decode_drops():
    tok = PieceTokenizer(["a", "b", " a", " b"], strip_leading_space=True)
    ids = tok.encode("a b a")  # a, " b", " a"
    assert tok.decode(ids[1:]) == "b a"  # the space before b is lost on its own
    assert decode_after(tok, ids, 1) == " b a"


def test_text_tracker_holds_back_a_split_character():
    tracker = TextTracker(ByteTokenizer())
    ids = list("aé".encode())  # a, then é as two bytes
    assert tracker.update(ids[:1]) is True
    assert tracker.update(ids[:2]) is False  # ends inside é
    assert tracker.text == "a"
    assert tracker.update(ids) is True
    assert tracker.text == "aé"


def test_draft_text_aligned_with_the_committed_tokens():
    tok = PieceTokenizer(TARGET_PIECES)
    committed = tok.encode("ab ab")  # ab, " a", b
    # "cd" then "e": the last token may be cut mid-word, so it is dropped
    assert draft_text_to_target(tok, committed, "cde", complete=False) == tok.encode("cd")
    assert draft_text_to_target(tok, committed, "cde", complete=True) == tok.encode("cde")


def test_draft_text_that_merges_with_the_last_committed_token_is_encoded_alone():
    tok = PieceTokenizer(TARGET_PIECES)
    committed = [tok.vocab["a"]]  # "a" committed as its own token
    # "a" + "bcd" would re-encode as "ab", "cd": that changes a committed token,
    # so the draft is split on its own: "b", "cd"
    assert draft_text_to_target(tok, committed, "bcd", complete=True) == [tok.vocab["b"], tok.vocab["cd"]]


def test_draft_text_re_split_across_the_boundary_follows_the_target_tokenizer():
    tok = PieceTokenizer(TARGET_PIECES)
    committed = tok.encode("cd")
    # the drafter's own pieces for " ab" would be " ", "a", "b"; the target reads " a", "b", then "."
    assert draft_text_to_target(tok, committed, " ab.", complete=True) == [tok.vocab[" a"], tok.vocab["b"],
                                                                         tok.vocab["."]]
    assert draft_text_to_target(tok, committed, "", complete=False) == []


def test_word_start_before_cuts_before_a_whitespace_run():
    text = "ab  cd ef"
    assert word_start_before(text, 0, 8) == 6  # the space before "ef"
    assert word_start_before(text, 0, 5) == 2  # the run "  " starts at 2, not 3
    assert word_start_before("abcdef", 0, 4) == 4  # no whitespace: cut at hi


def test_drafter_end_of_turn_bridges_to_the_targets_end_token():
    target = pieces_model(TARGET_PIECES, seed=1, eos="<e>")
    draft = pieces_model(DRAFT_PIECES, seed=2, eos="<e>")
    proposer = CrossTokenizerProposer(draft, target)
    assert proposer.eos_text == {draft.tokenizer.vocab["<e>"]: "<e>"}


# -- cross-tokenizer: whole runs -------------------------------------------------------------


def _text_prompts(tok) -> list[list[int]]:
    return [tok.encode(t) for t in ("ab cd. ", "hgf ab ba ", "abcdefgh")]


@pytest.mark.parametrize("window", [256, 3], ids=["window256", "window3"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_cross_greedy_equals_plain(k, window, monkeypatch):
    """window3 freezes older text into drafter tokens every few characters, exercising that path."""
    monkeypatch.setattr(cross_tokenizer, "WINDOW_CHARS", window)
    target = pieces_model(TARGET_PIECES, seed=3)
    draft = pieces_model(DRAFT_PIECES, seed=4)
    params = SamplingParams(max_tokens=30)
    proposer = CrossTokenizerProposer(draft, target)
    for prompt in _text_prompts(target.tokenizer):
        plain = Engine(target).generate(prompt, params)
        spec = Engine(target, proposer, k=k).generate(prompt, params)
        assert spec.token_ids == plain.token_ids, f"K={k}: cross-tokenizer greedy output differs from plain"
        assert spec.stats.drafted > 0
    assert proposer.states == {}, "finished sequences must free their drafter state"


def test_cross_drafter_cache_equals_a_fresh_prefill_of_its_tokens(monkeypatch):
    """Reusing the longest common prefix and truncating must leave exactly the cache a fresh prefill builds."""
    monkeypatch.setattr(cross_tokenizer, "WINDOW_CHARS", 3)
    target = pieces_model(TARGET_PIECES, seed=3)
    draft = pieces_model(DRAFT_PIECES, seed=4)
    proposer = CrossTokenizerProposer(draft, target)
    sync = proposer._sync
    seen = []

    def checked_sync(state, wanted):
        logits = sync(state, wanted)
        n = len(wanted)
        assert state.ids == wanted and state.cache.lengths == [n]
        fresh = draft.decoder.new_cache(1, n + 8)
        ref = draft.decoder.forward(torch.tensor([wanted]), fresh, logits_rows=slice(-1, None))
        torch.testing.assert_close(logits, ref[0, -1], rtol=1e-4, atol=1e-4)
        for layer in range(draft.config.num_layers):
            torch.testing.assert_close(state.cache.keys[layer][:, :, :n], fresh.keys[layer][:, :, :n],
                                       rtol=1e-4, atol=1e-4)
        seen.append(state.frozen_chars)
        return logits

    monkeypatch.setattr(proposer, "_sync", checked_sync)
    Engine(target, proposer, k=3).generate(target.tokenizer.encode("ab cd. "), SamplingParams(max_tokens=40))
    assert len(seen) > 5 and max(seen) > 0, "the frozen-prefix path was not exercised"


def _relabelled(model: Model, pieces: list[str]) -> Model:
    """The same network behind another tokenizer: embedding and lm_head rows permuted to the new ids."""
    old = model.tokenizer.vocab
    order = torch.tensor([old[p] for p in pieces])  # new id -> old id
    w = model.decoder.weights
    weights = Weights(embed=w.embed[order], final_norm=w.final_norm, lm_head=w.lm_head[order], layers=w.layers)
    return Model(name="relabelled", decoder=Decoder(model.config, weights), tokenizer=PieceTokenizer(pieces),
                 source=Path("."))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_cross_with_the_target_behind_another_tokenizer_accepts_its_drafts(k):
    """Same network, ids permuted: every converted draft token must be the target's own choice."""
    target = pieces_model(list(ALPHABET), seed=5)
    draft = _relabelled(target, list(reversed(ALPHABET)))
    params = SamplingParams(max_tokens=31)
    result = Engine(target, CrossTokenizerProposer(draft, target), k=k).generate(target.tokenizer.encode("ab c"),
                                                                                  params)
    plain = Engine(target).generate(target.tokenizer.encode("ab c"), params)
    assert result.token_ids == plain.token_ids
    assert result.stats.alpha == 1.0, f"a relabelled copy of the target had drafts rejected: {result.stats}"
    assert result.stats.tau == k + 1


def test_cross_drafter_stops_at_a_doubted_token():
    """A drafter that doubts everything (confidence 0.999 on a tiny random model) makes one forward
    per step, the catch-up that yields its first guess, and drafts no further; output stays plain's."""
    target = pieces_model(TARGET_PIECES, seed=3)
    draft = pieces_model(DRAFT_PIECES, seed=4)
    params = SamplingParams(max_tokens=30)
    prompt = target.tokenizer.encode("hgf ab ba ")
    plain = Engine(target).generate(prompt, params)
    runs = {c: Engine(target, CrossTokenizerProposer(draft, target, confidence=c), k=4).generate(prompt, params)
            for c in (0.0, 0.999)}
    for result in runs.values():
        assert result.token_ids == plain.token_ids
    eager, doubting = runs[0.0].stats, runs[0.999].stats
    assert doubting.draft_forwards == doubting.steps
    assert eager.draft_forwards > 2 * eager.steps
    with pytest.raises(AuguryError, match="confidence"):
        CrossTokenizerProposer(draft, target, confidence=1.0)


# -- layer skip ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deep_target() -> Model:
    return tiny_model(vocab=24, seed=3, hidden=32, layers=4)


@pytest.mark.parametrize("method,options", [("layerskip", {"skip_layers": "1,2"}), ("quantized", {})])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_self_drafters_greedy_equal_plain(method, options, k, deep_target):
    params = SamplingParams(max_tokens=30)
    proposer = build_proposer(method, deep_target, **options)
    for prompt in PROMPTS:
        plain = Engine(deep_target).generate(prompt, params)
        spec = Engine(deep_target, proposer, k=k).generate(prompt, params)
        assert spec.token_ids == plain.token_ids, f"{method} K={k}: speculative greedy output differs from plain"
        assert spec.stats.accepted > 0, f"{method} drafts from the target's own weights were never accepted"


def test_layer_skip_shares_the_targets_tensors(deep_target):
    skipped = skip_layers(deep_target.decoder, [1, 2])
    assert skipped.config.num_layers == 2
    assert skipped.weights.layers[0] is deep_target.decoder.weights.layers[0]
    assert skipped.weights.layers[1] is deep_target.decoder.weights.layers[3]
    assert skipped.weights.lm_head is deep_target.decoder.weights.lm_head


def test_layer_skip_keeps_gemmas_sliding_pattern():
    decoder = random_decoder(vocab=16, layers=6, arch="gemma3")
    config = ModelConfig(**{**decoder.config.to_dict(), "sliding_window": 4, "sliding_pattern": 3})
    decoder = Decoder(config, decoder.weights)
    original = [config.is_sliding(i) for i in range(6)]  # layers 2 and 5 are global
    assert original == [True, True, False, True, True, False]
    skipped = skip_layers(decoder, [1, 3])  # keeps 0, 2, 4, 5
    assert [skipped.config.is_sliding(i) for i in range(4)] == [True, False, True, False]
    again = skip_layers(skipped, [0])  # keeps original 2, 4, 5
    assert [again.config.is_sliding(i) for i in range(3)] == [False, True, False]


def test_layer_skip_without_skipping_equals_the_target_exactly(deep_target):
    """A skipped view with every layer kept must reproduce the target's logits (fp32)."""
    skipped = skip_layers(deep_target.decoder, [])
    tokens = torch.tensor([PROMPTS[0]])
    ref = deep_target.decoder.forward(tokens, deep_target.decoder.new_cache(1, 32))
    ours = skipped.forward(tokens, skipped.new_cache(1, 32))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_calibration_file_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    write_calibration(path, "tiny", 8, [5, 3, 3], k=4, tau=2.5)
    assert json.loads(path.read_text())["tau"] == 2.5
    assert read_calibration(path, 8) == [3, 5]
    assert parse_skip_layers(str(path), 8, "tiny") == [3, 5]
    # without --skip-layers, the model's saved calibration is used
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path))
    assert parse_skip_layers(None, 8, "tiny") == [3, 5]  # no calibration yet: the default
    write_calibration(calibration_path("tiny"), "tiny", 8, [2, 6])
    assert calibration_path("tiny") == tmp_path / "calibration" / "tiny-layerskip.json"
    assert parse_skip_layers(None, 8, "tiny") == [2, 6]


@pytest.mark.parametrize(
    "spec,message",
    [("a,b", "neither a comma list"), ("3,9", "out of range"), ("", "neither"), ("0,1,2,3,4,5,6,7", "all 8")],
)
def test_bad_skip_layers_are_refused(spec, message):
    with pytest.raises(AuguryError, match=message):
        parse_skip_layers(spec, 8, "tiny")


def test_calibration_file_for_another_model_is_refused(tmp_path):
    path = tmp_path / "cal.json"
    write_calibration(path, "other", 12, [3])
    with pytest.raises(AuguryError, match="12 layers"):
        read_calibration(path, 8)
    path.write_text("{not json")
    with pytest.raises(AuguryError, match="cannot read"):
        read_calibration(path, 8)


# -- quantized -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False])
def test_int8_weight_matmul_matches_its_dequantized_weight(fused):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=gen)
    packed = Int8Weight(weight, fused=fused)
    assert packed.values.dtype == torch.int8
    assert (packed.dense() - weight).abs().max() <= weight.abs().amax(1).max() / 127 / 2 + 1e-6
    x = torch.randn(3, 5, 32, generator=gen)
    bias = torch.randn(48, generator=gen)
    torch.testing.assert_close(packed.linear(x, bias), x @ packed.dense().T + bias, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_int4_weight_matmul_matches_its_dequantized_weight(dtype):
    """4-bit groups of 32: every weight within half a step of its group's grid, the kernel's matmul
    equal to a matmul with the dequantized weight, row slices (a truncated head) equal to slicing."""
    from augury.models.low_bit import Int4Weight

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 64, generator=gen).to(dtype)  # not a multiple of the kernel's 16-row blocks
    packed = Int4Weight(weight, keep_original=False)
    groups = weight.float().reshape(40, 2, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    error = (packed.dense().float() - weight.float()).reshape(40, 2, 32).abs().amax(-1)
    assert (error <= step / 2 + 0.02 * step + 1e-3).all()
    x = torch.randn(3, 5, 64, generator=gen).to(dtype)
    bias = torch.randn(40, generator=gen).to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    ref = x.float() @ packed.dense().float().T + bias.float()
    torch.testing.assert_close(packed.linear(x, bias).float(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(packed[:20].dense(), packed.dense()[:20], rtol=tol, atol=tol)


def test_quantized_drafter_is_close_to_the_target(deep_target):
    before = [t.clone() for t in (deep_target.decoder.weights.lm_head, deep_target.decoder.weights.layers[0].wqkv)]
    quantized = quantize_decoder(deep_target.decoder)
    after = (deep_target.decoder.weights.lm_head, deep_target.decoder.weights.layers[0].wqkv)
    assert all(torch.equal(b, a) for b, a in zip(before, after)), "quantizing must not touch the target's weights"
    tokens = torch.tensor([PROMPTS[1]])
    ref = deep_target.decoder.forward(tokens, deep_target.decoder.new_cache(1, 32))
    ours = quantized.forward(tokens, quantized.new_cache(1, 32))
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8
    assert not torch.equal(ours, ref), "the drafter should really compute with int8 weights"


def test_unknown_quant_format_is_refused(deep_target):
    with pytest.raises(AuguryError, match="unknown --draft-quant 'int3'"):
        build_proposer("quantized", deep_target, draft_quant="int3")


# -- real models -------------------------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.slow
def test_real_cross_drafting_equals_plain_greedy():
    from augury.models.tokenizer import build_prompt_ids
    from augury.models.loader import load_model

    target = load_model("qwen2.5-coder-1.5b-instruct", dtype="fp32")
    draft = load_model("smollm2-135m-instruct", dtype="fp32", exact=False)
    proposer = CrossTokenizerProposer(draft, target)
    params = SamplingParams(max_tokens=24)
    for text in ("Write a Python function that adds two numbers.", "What is the capital of France?"):
        ids = build_prompt_ids(target.tokenizer, text, chat=True)
        plain = Engine(target).generate(ids, params)
        spec = Engine(target, proposer, k=4).generate(ids, params)
        assert spec.token_ids == plain.token_ids, f"cross drafting changed the output for {text!r}"
        assert spec.stats.accepted > 0, f"smollm2's drafts were never accepted for {text!r}"


# -- calibration ---------------------------------------------------------------------------------------


def test_replay_counts_steps_like_greedy_speculative_decoding():
    from augury.commands.calibrate import replay

    # token 0 from prefill; step 1 accepts 2 (tokens 1, 2) + the target's token 3;
    # step 2 rejects at once (token 4); step 3 accepts token 5 and ends with the last one
    assert replay([True, True, True, False, False, True, True], k=2) == (3, 5, 3)
    assert replay([True] * 11, k=4) == (2, 8, 8)  # 1 + 5 + 5 tokens, 4 then 4 drafted


def test_calibration_search_on_a_tiny_model(deep_target):
    from augury.commands.calibrate import calibrate, replay, teacher_forced_matches

    logs: list[str] = []
    result = calibrate(deep_target, PROMPTS[:2], max_tokens=12, k=2, candidates=1, pool="all", log=logs.append)
    assert set(result["skip_layers"]) <= {1, 2}, "the first and last layers must be kept"
    assert result["trials"] and any(line.startswith("round 1") for line in logs)
    if result["skip_layers"]:
        assert result["measured"]["identical_to_plain"] is True
    # the replayed acceptance equals what decoding with that skip set really accepts
    skip = [1]
    output = Engine(deep_target).generate(PROMPTS[0], SamplingParams(max_tokens=12)).token_ids
    steps, drafted, accepted = replay(teacher_forced_matches(skip_layers(deep_target.decoder, skip), PROMPTS[0],
                                                             output), k=2)
    proposer = build_proposer("layerskip", deep_target, skip_layers="1")
    stats = Engine(deep_target, proposer, k=2).generate(PROMPTS[0], SamplingParams(max_tokens=12)).stats
    assert (stats.steps, stats.drafted, stats.accepted) == (steps, drafted, accepted)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_drafting_equals_drafting_one_sequence_at_a_time(temperature):
    """One drafter forward per position for several sequences (ragged catch-ups, early stops,
    different lengths) gives each sequence the draft it gets alone."""
    from augury.proposers.base import Sequence
    from augury.proposers.draft_model import DraftModelProposer
    from augury.verify import VerifyResult

    draft = tiny_model(vocab=40, seed=5, layers=2, hidden=64)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18]]
    ks = [4, 2, 0, 3]

    def run(batched: bool):
        proposer = DraftModelProposer(draft, 40, confidence=0.05 if temperature == 0 else 0.0)
        seqs = []
        for i, prompt in enumerate(prompts):
            params = SamplingParams(temperature=temperature, seed=i, max_tokens=20, coupling="rejection")
            seq = Sequence(list(prompt), params, generator=torch.Generator().manual_seed(i))
            proposer.start(seq)
            seqs.append(seq)
        rounds = []
        for step in range(4):
            if batched:
                drafts = proposer.propose_batch(seqs, ks)
            else:
                drafts = [proposer.propose(seq, k) for seq, k in zip(seqs, ks)]
            rounds.append(drafts)
            for i, (seq, d) in enumerate(zip(seqs, drafts)):
                # Accept a varying prefix (sometimes all: the drafter then has two tokens to catch up
                # on, the others one), then one token of the target's.
                accepted = min(len(d), (step + i) % 3 + 1)
                seq.tokens += d.tokens[:accepted] + [(step * 7 + i) % 40]
                proposer.on_step(seq, VerifyResult(len(d), accepted, d.tokens[:accepted] + [seq.tokens[-1]]), None)
        return rounds, proposer.forwards

    alone, forwards_alone = run(False)
    together, forwards_together = run(True)
    for drafts_alone, drafts_together in zip(alone, together):
        for a, b in zip(drafts_alone, drafts_together):
            assert a.tokens == b.tokens
            if temperature:
                torch.testing.assert_close(a.q_draft, b.q_draft)
    assert any(len(d) > 1 for step in together for d in step)
    assert forwards_together < forwards_alone


@pytest.mark.parametrize("mode", ["greedy", "coupled", "rejection"])
@pytest.mark.parametrize("group", [1, 2])
def test_guesses_checked_in_each_drafting_forward_leave_every_draft_as_it_was(mode, group):
    """Guessed continuations (a hybrid's matcher's) checked in each drafting forward: right guesses (the
    drafter's own next tokens), half-right and wrong ones give every sequence the draft it gets without
    guesses, step after step (the cache keeps only the guesses the drafter picked), drafting alone or
    two at a time; right guesses take fewer drafter forwards, and no forward holds more than GUESS_ROWS
    rows for them. A request sampled by rejection ignores guesses (its generator must draw as it would
    without them)."""
    from augury.proposers.base import Sequence
    from augury.proposers.draft_model import GUESS_ROWS, DraftModelProposer
    from augury.verify import VerifyResult

    draft = tiny_model(vocab=40, seed=7, layers=2, hidden=64)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17, 18]]
    ks = [4, 3, 1, 4]
    temperature = 0.0 if mode == "greedy" else 0.9
    widths = []  # rows of every forward while drafting

    def run(guessing: str):
        proposer = DraftModelProposer(draft, 40, confidence=0.02 if mode == "greedy" else 0.0)
        oracle = DraftModelProposer(draft, 40, confidence=proposer.confidence)  # the drafter's own next tokens
        seqs, twins = [], []
        for i, prompt in enumerate(prompts):
            params = SamplingParams(temperature=temperature, seed=i, max_tokens=30, coupling=mode if temperature else "auto")
            seqs.append(Sequence(list(prompt), params, generator=torch.Generator().manual_seed(i)))
            twins.append(Sequence(list(prompt), params, generator=torch.Generator().manual_seed(i)))
            proposer.start(seqs[-1])
            oracle.start(twins[-1])
        def counted(seqs, ks, *guesser):  # the rows of the proposer's forwards while it drafts
            decoder = proposer.decoder  # shared with the oracle's (the same tiny model)
            forward = decoder.forward
            decoder.forward = lambda tokens, cache, **kw: widths.append(tokens.numel()) or forward(tokens, cache, **kw)
            try:
                return propose(seqs, ks, *guesser)
            finally:
                del decoder.forward

        propose, proposer.propose_batch = proposer.propose_batch, counted
        rounds = []
        for step in range(5):
            drafts = []
            for at in range(0, len(seqs), group):
                part, part_ks = seqs[at : at + group], ks[at : at + group]
                if guessing == "none":
                    drafts += proposer.propose_batch(part, part_ks)
                    continue
                own = {seq.id: d.tokens for seq, d in zip(part, oracle.propose_batch(twins[at : at + group], part_ks))}

                def guess(seq, drafted, n):
                    ahead = own[seq.id][len(drafted) : len(drafted) + n]
                    if own[seq.id][: len(drafted)] != drafted:  # the oracle knows its own draft only
                        return []
                    if guessing == "half":  # right, then one wrong token, then right again
                        return ahead[:1] + [(t + 1) % 40 for t in ahead[1:2]] + ahead[2:]
                    return [(t + 3) % 40 for t in ahead] if guessing == "wrong" else ahead

                drafts += proposer.propose_batch(part, part_ks, guess)
            rounds.append(drafts)
            for i, (seq, twin, d) in enumerate(zip(seqs, twins, drafts)):
                accepted = min(len(d), (step + i) % 3 + 1)
                target_token = (step * 7 + i) % 40
                result = VerifyResult(len(d), accepted, d.tokens[:accepted] + [target_token])
                seq.tokens += result.tokens
                proposer.on_step(seq, result, None)
                if guessing != "none":
                    twin.tokens += result.tokens
                    oracle.on_step(twin, result, None)
        return rounds, proposer.forwards

    plain, forwards_plain = run("none")
    assert any(len(d) > 2 for step in plain for d in step)
    most_without = max(widths)  # the catch-ups' own rows
    for guessing in ("right", "half", "wrong"):
        rounds, forwards = run(guessing)
        for drafts_plain, drafts in zip(plain, rounds):
            for a, b in zip(drafts_plain, drafts):
                assert a.tokens == b.tokens, guessing
                if mode == "rejection":
                    torch.testing.assert_close(a.q_draft, b.q_draft)
        if guessing == "right" and mode != "rejection":
            assert forwards < forwards_plain, (forwards, forwards_plain)
        if mode == "rejection":
            assert forwards == forwards_plain
    assert max(widths) <= max(GUESS_ROWS, most_without), widths


def test_the_guess_plan_prices_rows_against_the_forwards_guesses_save():
    """GuessPlan: rows not yet measured are tried; measured, a guess row is carried only where the
    forwards it is expected to save (seconds of one row times the chance the guesses before it and it
    agree) outweigh what it adds to the forward."""
    from augury.proposers.guess_plan import GuessPlan

    def plan(extra_row: float, checked: list[int], agreed: list[int]) -> GuessPlan:
        p = GuessPlan(max_rows=4)
        for rows in range(1, 5):
            for _ in range(3):
                p.observe_forward(rows, 0.010 + extra_row * (rows - 1))
        p.checked, p.agreed = checked, agreed
        return p

    fresh = GuessPlan(max_rows=4)
    for _ in range(3):
        fresh.observe_forward(1, 0.010)
    assert fresh.guesses(1, 3) == 3, "unmeasured rows cost nothing more: every guess is tried"
    assert GuessPlan(max_rows=4).guesses(1, 3) == 0, "nothing measured yet: no saving is counted"
    # An AVX-512 drafter (a row +0.6 ms on 10 ms) with the probe's agreement: all three.
    assert plan(0.0006, [100, 50, 35], [48, 33, 26]).guesses(1, 3) == 3
    # An AVX2 one (+2.6 ms a row, about the 0.5B's 23% there): the first guess pays at 48%, the second
    # (reached 0.48 * 0.65 of the time) too, the third (0.48 * 0.65 * 0.73 = 0.23 of 10 ms, 2.3 ms
    # saved against 2.6 ms) no longer.
    assert plan(0.0026, [100, 50, 35], [48, 33, 26]).guesses(1, 3) == 2
    assert plan(0.0026, [100, 50, 35], [10, 5, 3]).guesses(1, 3) == 0, "rarely agreeing guesses are not carried"
    assert plan(0.0006, [100, 50, 35], [48, 33, 26]).guesses(2, 3) == 2, "a 2-row catch-up leaves room for 2"
    assert plan(0.0006, [100, 50, 35], [48, 33, 26]).guesses(1, 1) == 1, "no more than the draft has room for"

    counted = GuessPlan(max_rows=4)
    counted.observe_guesses(checked=2, agreed=1)
    counted.observe_guesses(checked=1, agreed=1)
    assert (counted.checked, counted.agreed) == ([2, 1, 0, 0], [2, 0, 0, 0])


# -- a head on some token ids only (--draft-vocab) -----------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_subset_head_drafts_only_its_ids_with_a_q_draft_that_sums_to_one(temperature):
    """The drafter projecting onto two thirds of the ids: every drafted token is one of them, and a
    sampled draft's q_draft is zero outside them and sums to one (so rejection sampling stays exact:
    the batteries of test_lossless.py run this case too)."""
    from augury.engine import Engine
    from augury.sampling import SamplingParams
    from tests.proposer_cases import PROPOSER_CASES, make_proposer, subset_ids
    from tests.test_lossless import DraftRecorder

    vocab = 12
    target = tiny_model(vocab=vocab, seed=5, hidden=32, layers=2)
    case = next(c for c in PROPOSER_CASES if c.name == "model-subset")
    recorder = DraftRecorder(make_proposer(case, target, seed=6))
    kept = subset_ids(vocab)
    outside = torch.tensor([i for i in range(vocab) if i not in set(kept.tolist())])
    engine = Engine(target, recorder, k=3)
    for seed in range(6):
        engine.generate([1, 2, 3, 4, 5][: 3 + seed % 3], SamplingParams(temperature=temperature, seed=seed,
                                                                         coupling="rejection", max_tokens=16))
    drafts = [draft for draft, _, _ in recorder.records if len(draft)]
    assert drafts, "the subset drafter never drafted"
    assert all(t in set(kept.tolist()) for d in drafts for t in d.tokens)
    for draft in drafts:
        if temperature == 0:
            assert draft.q_draft is None
            continue
        q = draft.q_draft.double()
        assert torch.allclose(q.sum(-1), torch.ones(len(draft), dtype=torch.float64), atol=1e-6)
        assert not q[:, outside].any()


def test_the_corpus_ranks_a_drafters_ids_by_frequency_then_id(monkeypatch):
    """ranked_ids over a stand-in corpus: the most frequent ids first, the unseen by id, special tokens
    always kept; "id" is the first N; bad orders and sizes are one clear error."""
    from augury.proposers import draft_vocab
    from augury.train import stdlib_corpus

    class Letters:  # a tokenizer of single letters: a=0 ... z=25, then two specials
        vocab = {chr(97 + i): i for i in range(26)} | {"<end>": 26, "<pad>": 27}
        special_texts = ("<end>", "<pad>")
        eos_ids = frozenset({26})

        def encode(self, text, add_bos=False, special=False):
            return [ord(c) - 97 for c in text if "a" <= c <= "z"]

    corpus = [stdlib_corpus.Sample("zz", "zzz yyy x", "m1"), stdlib_corpus.Sample("y", "q", "m2")]
    monkeypatch.setattr(stdlib_corpus, "samples", lambda *a, **k: iter(corpus))
    counts = draft_vocab.corpus_counts(Letters(), 28)
    assert counts[25] == 5 and counts[24] == 4 and counts[23] == 1 and counts[16] == 1 and counts[0] == 0
    ids = draft_vocab.ranked_ids(Letters(), 28, 7)
    # specials 26, 27; z (5), y (4); x and q (1 each, by id: q=16 before x=23); then a (0), by id
    assert ids.tolist() == [0, 16, 23, 24, 25, 26, 27]
    assert draft_vocab.ranked_ids(Letters(), 28, 3, "id").tolist() == [0, 1, 2]
    with pytest.raises(AuguryError, match="unknown draft vocabulary order"):
        draft_vocab.ranked_ids(Letters(), 28, 3, "alphabetical")
    with pytest.raises(AuguryError, match="between 1 and"):
        draft_vocab.ranked_ids(Letters(), 28, 0)


# -- a drafter reading the last N tokens of a prompt (--draft-context) ------------------------------------


@pytest.mark.parametrize("batched_start", [True, False])
def test_a_context_window_drafts_as_a_drafter_given_only_the_prompts_last_tokens(batched_start):
    """With context N the drafter's cache starts at the prompt's last N tokens (before its last one, which
    drafting feeds): every draft, across steps and rollbacks, is the one a drafter gets whose sequence is
    those tokens alone; and a request not yet started owes a catch-up of N + 1 tokens, not the prompt."""
    from augury.proposers.base import Sequence
    from augury.proposers.draft_model import DraftModelProposer
    from augury.request import Request
    from augury.verify import VerifyResult

    draft = tiny_model(vocab=40, seed=5, layers=2, hidden=64)
    prompt = [(7 * i + 3) % 40 for i in range(23)]
    context = 6
    windowed = DraftModelProposer(draft, 40, context=context)
    fresh = DraftModelProposer(draft, 40)
    long_seq = Sequence(list(prompt), SamplingParams(max_tokens=30))
    short_seq = Sequence(prompt[-context - 1 :], SamplingParams(max_tokens=30))
    if batched_start:
        windowed.start_batch([long_seq])
    else:
        windowed.prefill_batch([long_seq], [100])
    fresh.start(short_seq)
    state = windowed.states[long_seq.id]
    assert (state.offset, state.fed, state.cache.lengths) == (len(prompt) - 1 - context, len(prompt) - 1, [context])
    for step in range(5):
        got, want = windowed.propose(long_seq, 3), fresh.propose(short_seq, 3)
        assert got.tokens == want.tokens, f"step {step}"
        accepted = step % 3
        tokens = got.tokens[:accepted] + [(step * 11 + 1) % 40]
        for seq, proposer in ((long_seq, windowed), (short_seq, fresh)):
            seq.tokens += tokens
            proposer.on_step(seq, VerifyResult(len(got), accepted, tokens), None)
    assert state.cache.lengths == [state.fed - state.offset]

    target = tiny_model(vocab=40, seed=6, layers=2, hidden=64)
    request = Request(target, prompt, SamplingParams(max_tokens=30), DraftModelProposer(draft, 40, context=context))
    assert request.catch_up() == context + 1


def test_a_negative_draft_context_is_refused():
    from augury.proposers.draft_model import DraftModelProposer

    with pytest.raises(AuguryError, match="draft context must be >= 0"):
        DraftModelProposer(tiny_model(vocab=40, seed=5, layers=2, hidden=64), 40, context=-1)
