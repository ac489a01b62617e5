"""Head drafters (mtp, eagle, parallel): lossless, fed the target's own states, rolled back, files checked.

Heads are tried both untrained (random guesses, mostly rejected) and briefly
trained on the tiny target's own greedy text, so that drafts are accepted in
runs of several tokens and every rollback path is taken.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

import augury.models.head as head_net
import augury.models.head_file as head_file
import augury.proposers.heads as heads
import tests.test_exact as exact
from augury import files
from augury.engine import Engine
from augury.errors import AuguryError
from augury.models.head import KINDS, HeadConfig
from augury.models.loader import Model
from augury.proposers import METHODS
from augury.proposers.base import Sequence
from augury.proposers.heads import HeadProposer, make_proposer, untrained_proposer
from augury.sampling import SamplingParams
from augury.scheduler import Failed, Finished, Scheduler, SchedulerConfig
from tests.proposer_cases import ProposerCase
from tests.tiny import greedy_equivalence, tiny_model

VOCAB = 24
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 10, 11, 7, 7, 8], [0, 5, 10]]


@pytest.fixture(scope="module")
def target() -> Model:
    return tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=3)


def train_tiny(target: Model, kind: str, folder: Path, steps: int = 120, **overrides):
    """(config, own weights, vocab) of a head trained for `steps` on the target's own greedy continuations."""
    from augury.models.head import init_own_weights, target_parts
    from augury.train import features
    from augury.train.trainer import TrainableHead, TrainPlan, choose_vocab, fit, new_optimizer

    gen = torch.Generator().manual_seed(5)
    vocab_size = target.config.vocab_size
    prompts = [torch.randint(0, vocab_size, (int(torch.randint(2, 9, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(24)]
    sequences = [p + Engine(target).generate(p, SamplingParams(max_tokens=40)).token_ids for p in prompts]
    config = HeadConfig.for_kind(kind, **overrides)
    writer = features.ShardWriter(folder)
    features.collect(target, sequences, config, writer)
    data = features.load(writer.flush())
    vocab, _ = choose_vocab(data, list(range(data.num_sequences)), vocab_size)
    trainable = TrainableHead(config, target.config, init_own_weights(config, target), target_parts(target), vocab,
                              torch.device("cpu"))
    # no regularization: 120 steps on a tiny corpus need a head that drafts, not one that generalizes
    plan = TrainPlan(seq_len=64, batch=4, lr=3e-3, max_steps=steps, warmup=10, noise=0.0, dropout=0.0, weight_decay=0.0)
    fit(trainable, new_optimizer(trainable, plan), data, list(range(data.num_sequences)), plan,
        deadline=time.monotonic() + 300)
    return config, trainable.own(), vocab


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory) -> dict:
    """kind -> (config, own, vocab) of a briefly trained head for the module's target.

    One thread, as conftest gives each test: a module fixture runs before that setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {kind: train_tiny(target, kind, tmp_path_factory.mktemp(kind)) for kind in KINDS}
    finally:
        torch.set_num_threads(before)


def trained_proposer(trained, kind: str, target: Model) -> HeadProposer:
    config, own, vocab = trained[kind]
    return make_proposer(config, own, vocab, target)


# -- greedy equivalence ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_head_drafting_equals_plain_through_the_engine(kind, k, target, trained):
    proposer = trained_proposer(trained, kind, target)
    stats = greedy_equivalence(target, proposer, PROMPTS, SamplingParams(max_tokens=40), k, f"{kind} K={k}")
    assert sum(s.accepted for s in stats) > 0, f"the trained {kind} head never had a draft accepted: the check proved little"


@pytest.mark.parametrize("kind", KINDS)
def test_untrained_head_with_a_vocabulary_subset_is_lossless_too(kind, target):
    subset = torch.arange(0, VOCAB, 3)
    proposer = untrained_proposer(kind, target, vocab=subset, seed=2)
    stats = greedy_equivalence(target, proposer, PROMPTS, SamplingParams(max_tokens=30), 4, f"{kind} subset")
    assert all(s.drafted > 0 for s in stats)


@pytest.mark.parametrize("k", [4, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_scheduler_with_ragged_batches_equals_plain(kind, k, target, trained):
    """Sequences of different lengths share steps, join and leave; drafts of different lengths."""
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 10, 11, 7, 7, 8], [0, 5, 10], [2, 2, 2, 2, 2, 2], [9]]
    lengths = [24, 9, 17, 30, 5]
    params = [SamplingParams(max_tokens=n) for n in lengths]
    want = [Engine(target).generate(p, sp).token_ids for p, sp in zip(prompts, params)]
    scheduler = Scheduler(target, trained_proposer(trained, kind, target),
                          SchedulerConfig(max_batch=3, k=k, adaptive_k=False))
    results, done = {}, threading.Semaphore(0)

    def handler(i):
        def on_event(event):
            if isinstance(event, (Finished, Failed)):
                results[i] = event
                done.release()
        return on_event

    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        scheduler.submit(prompt, sp, handler(i))
    scheduler.start()
    try:
        for _ in prompts:
            assert done.acquire(timeout=120)
    finally:
        scheduler.stop()
    for i in range(len(prompts)):
        assert isinstance(results[i], Finished), results[i]
        assert results[i].result.token_ids == want[i], f"{kind} K={k}: request {i} differs from plain"
    assert scheduler.stats.accepted > 0, f"{kind}: nothing accepted in the batch: the check proved little"


def test_batched_drafting_equals_drafting_one_sequence_at_a_time(target, trained):
    """propose_batch over several sequences (one CacheGroup forward per position) drafts what each alone would."""
    for kind in KINDS:
        together, alone = trained_proposer(trained, kind, target), trained_proposer(trained, kind, target)
        seqs_a, seqs_b = [], []
        for prompt in PROMPTS:
            for proposer, seqs in ((together, seqs_a), (alone, seqs_b)):
                seq = Sequence(list(prompt), SamplingParams(max_tokens=20))
                proposer.start(seq, _fresh_hidden(target, prompt[:-1], proposer.hidden_layers))
                seqs.append(seq)
        batch = together.propose_batch(seqs_a, [4, 2, 3])
        single = [alone.propose(seq, k) for seq, k in zip(seqs_b, [4, 2, 3])]
        assert [d.tokens for d in batch] == [d.tokens for d in single], kind


# -- exact losslessness for sampled and greedy drafts -----------------------------------------------

EXACT_PARAMS = ["t1", "t0.6-topk3", "t1.2-topp0.75", "repetition1.6", "everything", "greedy", "greedy-penalties"]


def _head_case(kind: str) -> ProposerCase:
    """An untrained head over tokens {0, 1, 3, 4} of the 5-token target: q_draft is zero at token 2."""
    return ProposerCase(kind, lambda model, seed: untrained_proposer(kind, model, vocab=torch.tensor([0, 1, 3, 4]),
                                                                     seed=seed))


def enumerate_head_drafts(case, target, context, k, params):
    """tests.test_exact's enumeration for a head: started with the context's states, its `sample` scripted."""
    drafts = []

    def run(choices: list[int]) -> None:
        asked = []

        def scripted(probs, generator):  # probs: [1, V]
            asked.append(probs)
            i = len(asked) - 1
            return torch.tensor([choices[i] if i < len(choices) else int(probs[0].nonzero()[0])])

        proposer = case.build(target.model, 1)
        seq = Sequence(list(context), params, prompt_len=len(exact.PROMPT), generator=torch.Generator().manual_seed(0))
        with mock.patch.object(heads, "sample", scripted):
            proposer.start(seq, _fresh_hidden(target.model, list(context[:-1]), proposer.hidden_layers))
            draft = proposer.propose(seq, k)
            proposer.finish(seq)
        if not asked:
            drafts.append((list(draft.tokens), None if draft.q_draft is None else exact.normalized(draft.q_draft), 1.0))
            return
        assert draft.q_draft is not None and len(asked) == len(draft.tokens)
        q_draft = exact.normalized(draft.q_draft)
        if len(asked) > len(choices):
            for token in range(exact.VOCAB):
                if q_draft[len(choices), token] > 0:
                    run(choices + [token])
            return
        assert draft.tokens == choices
        drafts.append((list(draft.tokens), q_draft, math.prod(float(q_draft[i, t]) for i, t in enumerate(choices))))

    run([])
    return drafts


@pytest.fixture(scope="module")
def exact_target():
    return exact.Target()


@pytest.mark.parametrize("params_name", EXACT_PARAMS)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_first_two_committed_tokens_follow_p_target_exactly(kind, k, params_name, exact_target, monkeypatch):
    """Every draft and verifier branch enumerated (tests/test_exact.py), drafts from the real head."""
    monkeypatch.setattr(exact, "enumerate_drafts", enumerate_head_drafts)
    worst, drafted = exact.deviation(_head_case(kind), exact_target, k, exact.PARAMS[params_name])
    assert drafted > 0, f"{kind} drafted nothing: the check would be vacuous"
    assert worst < exact.TOLERANCE, (
        f"{kind}, K={k}, {params_name}: the first committed tokens differ from p_target by {worst:.3e}")


@pytest.mark.slow
@pytest.mark.parametrize("coupling", ["rejection", "coupled"])
@pytest.mark.parametrize("kind", KINDS)
def test_sampled_head_output_matches_plain_sampling_chi_square(kind, coupling):
    """Whole continuations through the engine against the enumerated plain distribution (tests/test_lossless.py's
    battery and its stated power), by rejection sampling and by coupled sampling."""
    import tests.test_lossless as lossless

    setting = "t0.9-topk3"
    small = lossless.chi_target()
    engine = Engine(small, untrained_proposer(kind, small, vocab=torch.tensor([0, 1, 3]), seed=11), k=lossless.K)
    params = lossless.seeded_params(setting, lossless.sample_count(kind), coupling=coupling)
    results = [engine.generate(lossless.PROMPT, p) for p in params]
    lossless.check_against_plain(f"{kind} head, {coupling}", results, setting)


# -- the vocabulary subset --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_q_draft_sums_to_one_and_is_zero_outside_the_subset(kind, target):
    subset = torch.tensor([1, 2, 5, 8, 13, 21])
    proposer = untrained_proposer(kind, target, vocab=subset, seed=4)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[subset] = False
    settings = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3, top_p=0.9),
                SamplingParams(temperature=1.3, repetition_penalty=1.4, frequency_penalty=0.5)]
    for i, params in enumerate(settings):
        seq = Sequence([1, 2, 3, 4, 5, 6], params, generator=torch.Generator().manual_seed(i))
        proposer.start(seq, _fresh_hidden(target, seq.tokens[:-1], proposer.hidden_layers))
        draft = proposer.propose(seq, 5)
        assert len(draft.tokens) == 5 and draft.q_draft is not None and draft.q_draft.shape == (5, VOCAB)
        assert torch.allclose(draft.q_draft.sum(-1), torch.ones(5), atol=1e-6)
        assert float(draft.q_draft[:, outside].abs().sum()) == 0.0
        assert all(int(t) in subset.tolist() for t in draft.tokens)
        assert all(float(draft.q_draft[i, t]) > 0 for i, t in enumerate(draft.tokens))
        proposer.finish(seq)


def test_greedy_drafts_are_point_masses_inside_the_subset(target):
    subset = torch.tensor([0, 4, 9, 16])
    proposer = untrained_proposer("eagle", target, vocab=subset, seed=4)
    seq = Sequence([3, 1, 4, 1, 5], SamplingParams(max_tokens=10))
    proposer.start(seq, _fresh_hidden(target, seq.tokens[:-1], proposer.hidden_layers))
    draft = proposer.propose(seq, 6)
    assert draft.q_draft is None and len(draft.tokens) == 6
    assert set(draft.tokens) <= set(subset.tolist())


# -- the target's states and rollback ---------------------------------------------------------------


def _fresh_hidden(model: Model, tokens: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    decoder = model.decoder
    _, hidden = decoder.forward_states(torch.tensor([tokens]), decoder.new_cache(1, len(tokens) + 8), states=layers)
    return hidden[0]


class Checked(HeadProposer):
    """A head drafter that records the states it is handed and checks its own cache after every rollback."""

    def __init__(self, inner: HeadProposer) -> None:
        super().__init__(inner.head)
        self.received: dict[int, list[torch.Tensor]] = {}
        self.checked = 0

    def start(self, seq, prompt_hidden=None) -> None:
        self.received[seq.id] = [prompt_hidden]
        super().start(seq, prompt_hidden)

    def on_step(self, seq, result, hidden) -> None:
        self.received[seq.id].append(hidden)
        super().on_step(seq, result, hidden)
        state = self.states[seq.id]
        assert state.cache.lengths == [state.fed], "rows drafted past the committed ones were not cut"
        if state.fed < 2:
            return
        # A fresh head feed of every committed row from the target's states must give the cached K/V.
        head = self.head
        states = head_net.pick_feature(self.config, torch.cat(self.received[seq.id]), head.target_config.hidden_size)
        fresh = head.new_cache(1, state.fed + 8)
        head.layer(head.inputs(states[None, : state.fed], head.embed(torch.tensor([seq.tokens[1 : state.fed + 1]]))),
                   fresh)
        for mine, ref in ((state.cache.keys[0], fresh.keys[0]), (state.cache.values[0], fresh.values[0])):
            assert torch.allclose(mine[:, :, : state.fed], ref[:, :, : state.fed], atol=1e-5, rtol=1e-4)
        self.checked += 1


@pytest.mark.parametrize("kind", KINDS)
def test_states_handed_over_equal_a_fresh_prefill_and_the_head_cache_is_rolled_back(kind, target, trained):
    """fp32, prompts short enough for the row path: what the head was handed step by step is bitwise one
    prefill of the committed tokens; after every step its cache equals a fresh feed of the committed rows."""
    proposer = Checked(trained_proposer(trained, kind, target))
    for prompt in PROMPTS:
        result = Engine(target, proposer, k=4).generate(prompt, SamplingParams(max_tokens=30))
        seq_id = max(proposer.received)
        committed = prompt + result.token_ids
        got = torch.cat(proposer.received[seq_id])
        want = _fresh_hidden(target, committed[:-1], proposer.hidden_layers)
        width = target.config.hidden_size * (len(proposer.hidden_layers) + 1)
        assert got.shape == want.shape == (len(committed) - 1, width)
        assert torch.equal(got, want)
        assert 0 < result.stats.accepted < result.stats.drafted, "both accepted and rejected drafts needed"
    assert proposer.checked > 10


class Recording(HeadProposer):
    """A head drafter that records the states it is handed and, per draft, the sequence length it drafted after."""

    def __init__(self, inner: HeadProposer) -> None:
        super().__init__(inner.head)
        self.received: list[torch.Tensor] = []
        self.drafts: list[tuple[int, list[int]]] = []

    def start(self, seq, prompt_hidden=None) -> None:
        self.received, self.drafts = [prompt_hidden], []
        super().start(seq, prompt_hidden)

    def on_step(self, seq, result, hidden) -> None:
        self.received.append(hidden)
        super().on_step(seq, result, hidden)

    def propose_batch(self, seqs, ks):
        drafts = super().propose_batch(seqs, ks)
        self.drafts += [(len(seq.tokens), list(draft.tokens)) for seq, draft in zip(seqs, drafts)]
        return drafts


@pytest.mark.parametrize("kind", KINDS)
def test_drafts_while_decoding_are_what_training_unrolls(kind, target, trained):
    """`augury train` measures a head's held-out acceptance with `objective.rollout` over the target's
    states: the drafts it makes while decoding must be rollout's predictions at the same anchor (the
    last committed row) and depth, for as long as the draft so far is the text. A position, visibility
    or feature fed differently while drafting would make the training curve a promise drafting breaks."""
    from augury.train.objective import Batch, rollout

    proposer = Recording(trained_proposer(trained, kind, target))
    head = proposer.head
    compared = [0, 0, 0, 0]
    for prompt in PROMPTS:
        text = prompt + Engine(target, proposer, k=4).generate(prompt, SamplingParams(max_tokens=30)).token_ids
        states = head_net.pick_feature(proposer.config, torch.cat(proposer.received), head.target_config.hidden_size)
        assert states.shape[0] == len(text) - 1
        tokens = torch.tensor([text])
        batch = Batch(tokens=tokens, states=torch.cat([states, states[-1:]])[None].float(), topk_ids=tokens[..., None],
                      topk_p=torch.ones(1, len(text), 1), lengths=torch.tensor([len(text)]),
                      starts=torch.tensor([len(prompt)]))
        with torch.inference_mode():
            predicted = [head.weights.vocab[head.logits(y).argmax(-1)][0].tolist() for y, _ in rollout(head, batch, 4)]
        for length, drafted in proposer.drafts:
            anchor = length - 2
            for depth, token in enumerate(drafted, start=1):
                assert token == predicted[depth - 1][anchor], (
                    f"{kind}: drafted {token} at depth {depth} after {length} tokens, rollout predicts "
                    f"{predicted[depth - 1][anchor]}")
                compared[depth - 1] += 1
                if anchor + depth + 1 >= len(text) or token != text[anchor + depth + 1]:
                    break
    assert compared[0] > 10 and compared[2] > 0, f"{kind}: too few chains to compare: {compared}"


def test_mtp_reads_the_last_layers_output_and_eagle_the_final_state(target):
    assert untrained_proposer("mtp", target).hidden_layers == (target.config.num_layers - 1,)
    assert untrained_proposer("eagle", target).hidden_layers == ()
    hidden = torch.arange(12.0).view(1, 12)
    assert head_net.pick_feature(HeadConfig.for_kind("mtp"), hidden, 6).tolist() == [list(range(6))]
    assert head_net.pick_feature(HeadConfig.for_kind("eagle"), hidden[:, 6:], 6).tolist() == [list(range(6, 12))]


def test_a_head_without_hidden_states_is_a_clear_error(target):
    proposer = untrained_proposer("eagle", target)
    with pytest.raises(AuguryError, match="needs the target's hidden states"):
        proposer.start(Sequence([1, 2, 3], SamplingParams()), None)


# -- head files -------------------------------------------------------------------------------------


def _with_source(model: Model, path: Path, content: bytes) -> Model:
    """The same tiny model, identified by a weights file of the given content."""
    path.write_bytes(content)
    return Model(name=path.stem, decoder=model.decoder, tokenizer=model.tokenizer, source=path)


def _save(folder: Path, target: Model, kind: str = "eagle", trained=None) -> Path:
    config, own, vocab = trained[kind] if trained else (HeadConfig.for_kind(kind),
                                                         head_net.init_own_weights(HeadConfig.for_kind(kind), target),
                                                         torch.arange(VOCAB))
    meta = {"kind": kind, "config": config.to_dict(),
            "target": {"name": target.name, "sha256": head_file.target_sha256(target)}}
    return head_file.save_head(folder, own, vocab, torch.arange(vocab.numel(), 0, -1), meta, dtype=torch.float32)


def test_a_saved_head_loads_and_drafts_as_it_did(target, trained, home):
    source = _with_source(target, home / "target.gguf", b"weights of the tiny target")
    path = _save(home / "head", source, "mtp", trained)
    loaded = heads.load_head(path.parent, source)
    in_memory = trained_proposer(trained, "mtp", source)
    for prompt in PROMPTS:
        a = Engine(source, loaded, k=4).generate(prompt, SamplingParams(max_tokens=20))
        b = Engine(source, in_memory, k=4).generate(prompt, SamplingParams(max_tokens=20))
        assert a.token_ids == b.token_ids and a.stats.accepted == b.stats.accepted
    built = METHODS["mtp"].build(source, SimpleNamespace(head=str(path), draft_vocab=0))
    assert isinstance(built, HeadProposer) and built.name == "mtp"


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_low_bit_head_drafts_losslessly_and_near_its_dense_self(kind, quant, target, trained):
    from augury.models.low_bit import int4_matmul_available

    config, own, vocab = trained[kind]
    dense = make_proposer(config, own, vocab, target)
    low = make_proposer(config, own, vocab, target, quant=quant)
    w = low.head.weights
    runs_int4 = quant == "int4" and int4_matmul_available(target.decoder.dtype, target.decoder.device)
    formats = {type(m).__name__ for m in (w.fc, w.lm_head, w.layer.wqkv, w.layer.wo, w.layer.w_gate_up,
                                           w.layer.w_down)}
    assert formats == {"Int4Weight" if runs_int4 else "Int8Weight"}
    y = torch.randn(1, 1, target.config.hidden_size, generator=torch.Generator().manual_seed(1))
    want, got = dense.head.logits(y), low.head.logits(y)
    err = float((got - want).norm() / want.norm())
    assert 0 < err < (0.2 if runs_int4 else 0.05), f"{kind} {quant}: logits off by {err:.4f} relative"
    stats = greedy_equivalence(target, low, PROMPTS, SamplingParams(max_tokens=40), 4, f"{kind} {quant}")
    assert sum(s.accepted for s in stats) > 0, f"the {quant} {kind} head never had a draft accepted"


def test_a_head_takes_only_its_own_weight_formats(target, trained, home):
    source = _with_source(target, home / "target.gguf", b"weights of the tiny target")
    path = _save(home / "head", source, "eagle", trained)
    with pytest.raises(AuguryError, match="--draft-quant q4_0 does not apply to a trained head"):
        METHODS["eagle"].build(source, SimpleNamespace(head=str(path), draft_vocab=0, draft_quant="q4_0"))
    with pytest.raises(AuguryError, match="unknown head weight format 'int3'"):
        heads.load_head(path, source, quant="int3")
    built = METHODS["eagle"].build(source, SimpleNamespace(head=str(path), draft_vocab=0, draft_quant="int8"))
    assert type(built.head.weights.lm_head).__name__ == "Int8Weight"


def test_draft_vocab_keeps_the_most_frequent_tokens(target, home):
    source = _with_source(target, home / "target.gguf", b"x")
    path = _save(home / "head", source)  # counts: token 0 most frequent, then 1, ...
    narrowed = heads.load_head(path, source, draft_vocab=5)
    assert narrowed.head.weights.vocab.tolist() == [0, 1, 2, 3, 4]


def test_head_file_problems_are_one_clear_error(target, home):
    source = _with_source(target, home / "target.gguf", b"the target")
    path = _save(home / "head", source)
    with pytest.raises(AuguryError, match="does not exist"):
        heads.load_head(home / "nowhere", source)
    other = _with_source(target, home / "other.gguf", b"another target")
    with pytest.raises(AuguryError, match="was trained for target 'target'.*not for 'other'"):
        heads.load_head(path, other)
    with pytest.raises(AuguryError, match="holds a 'eagle' head, not 'parallel'"):
        METHODS["parallel"].build(source, SimpleNamespace(head=str(path)))
    with pytest.raises(AuguryError, match="needs --head FILE"):
        METHODS["eagle"].build(source, SimpleNamespace())
    data = path.read_bytes()
    (home / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(AuguryError, match="corrupt or incomplete"):
        heads.load_head(home / "cut.safetensors", source)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(home / "plain.safetensors"))
    with pytest.raises(AuguryError, match="not an augury head file"):
        heads.load_head(home / "plain.safetensors", source)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        tensors = {name: fh.get_tensor(name) for name in fh.keys()}
        meta = fh.metadata()[head_file.META_KEY].replace('"kind": "eagle"', '"kind": "medusa"')
    save_file(tensors, str(home / "odd.safetensors"), metadata={head_file.META_KEY: meta})
    with pytest.raises(AuguryError, match="unknown kind 'medusa'"):
        heads.load_head(home / "odd.safetensors", source)
    description = json.loads(meta.replace('"kind": "medusa"', '"kind": "eagle"'))
    for field in ("target", "config"):  # a crafted description: a string where an object belongs
        save_file(tensors, str(home / "crafted.safetensors"),
                  metadata={head_file.META_KEY: json.dumps({**description, field: "smollm2"})})
        with pytest.raises(AuguryError, match=f"malformed description: its '{field}' is not an object"):
            heads.load_head(home / "crafted.safetensors", source)


def test_a_head_file_is_replaced_whole_or_not_at_all(target, home, monkeypatch):
    """A write that fails halfway (disk full) leaves the previous head loadable and no partial file behind."""
    source = _with_source(target, home / "target.gguf", b"w")
    path = _save(home / "head", source)
    before = path.read_bytes()

    real_replace = files.os.replace

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(OSError):
        _save(home / "head", source, "mtp")
    monkeypatch.setattr(files.os, "replace", real_replace)
    assert path.read_bytes() == before
    assert heads.load_head(path, source).name == "eagle"
    assert not [p for p in (home / "head").iterdir() if ".tmp" in p.name]


def test_hybrid_with_a_head_fallback_equals_plain_and_both_parts_draft(target, trained, home):
    """The suffix matcher first, the trained head when no match is long enough: the head still hears
    every step's states (the hybrid passes them through), so greedy output stays plain's."""
    from augury.proposers import build_proposer

    source = _with_source(target, home / "target.gguf", b"weights of the tiny target")
    path = _save(home / "head", source, "eagle", trained)
    hybrid = build_proposer("hybrid", source, head=str(path), match_min=1)
    assert hybrid.needs_hidden and isinstance(hybrid.model, HeadProposer)
    greedy_equivalence(source, hybrid, PROMPTS + [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]], SamplingParams(max_tokens=40), 4,
                       "hybrid with a head")
    assert hybrid.matcher_drafts > 0 and hybrid.model_drafts > 0, "both parts should have drafted"
