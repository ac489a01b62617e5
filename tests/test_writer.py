"""The target writing its corpus in waves (train/writer.py): what each row writes, rows leaving the batch,
the deadline, and the states of what was written."""

from __future__ import annotations

import time

import pytest
import torch

from augury.engine import Engine
from augury.models.loader import load_model
from augury.sampling import SamplingParams
from augury.train.corpus import SelfCorpusPlan
from augury.train.writer import continue_batch, write_corpus
from tests.test_train import tiny_target

TEXTS = ["hello there", "a", "the quick brown fox jumps over", "lazy dogs sleep", "xyz xyz xyz xyz xyz"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_model(str(tiny_target(tmp_path_factory.mktemp("writer"))), dtype="fp32")


def _prompts(target) -> list[list[int]]:
    return [target.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in TEXTS]


def test_a_wave_writes_what_greedy_decoding_writes_for_each_prompt_alone(target):
    """Prompts of five lengths in one batch, rows leaving it as they end (the last row moved into each
    hole): each continuation is the engine's greedy text for that prompt alone, cut at the same end."""
    prompts = _prompts(target)
    assert len({len(p) for p in prompts}) == len(prompts), "ragged prompts: the padding and the lengths matter"
    written, ended = continue_batch(target, prompts, 24, SamplingParams(max_tokens=24), None)
    alone = [Engine(target).generate(p, SamplingParams(max_tokens=24)).token_ids for p in prompts]
    assert written == alone
    assert all(ended)
    assert all(target.tokenizer.eos_ids.isdisjoint(w) for w in written)


def test_rows_that_end_at_once_leave_the_rest_writing(target):
    """With eos ids that the target picks at different steps, rows leave the batch at different times
    (one of them at its first token): each row's text is still its own prompt's."""
    prompts = _prompts(target)
    full, _ = continue_batch(target, prompts, 16, SamplingParams(max_tokens=16), None)
    # End-of-turn ids made of tokens the rows write at different positions, the first row's first token among them.
    stops = {full[0][0], full[2][5]}
    tokenizer = target.tokenizer
    saved = tokenizer.eos_ids
    tokenizer.eos_ids = frozenset(stops)
    try:
        cut, ended = continue_batch(target, prompts, 16, SamplingParams(max_tokens=16), None)
    finally:
        tokenizer.eos_ids = saved
    for whole, part in zip(full, cut):
        end = next((i for i, t in enumerate(whole) if t in stops), len(whole))
        assert part == whole[:end], "a row's text must not change when other rows leave the batch"
    assert cut[0] == [] and all(ended)
    assert len({len(part) for part in cut}) > 2, "the rows left at different steps"


def test_sampled_rows_are_seeded_and_a_past_deadline_ends_nothing(target):
    prompts = _prompts(target)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=10)

    def draw(seed: int) -> list[list[int]]:
        return continue_batch(target, prompts, 10, params, torch.Generator().manual_seed(seed))[0]

    first = draw(1)
    assert first == draw(1)
    assert first != draw(2)
    assert all(len(w) <= 10 for w in first)
    written, ended = continue_batch(target, prompts, 10, params, None, deadline=time.monotonic() - 1)
    assert written == [[] for _ in prompts] and not any(ended)


def test_waves_write_requests_then_answers_and_hand_each_wave_over(target):
    plan = SelfCorpusPlan(request_tokens=8, answer_tokens=12, max_batch=3)
    waves = []

    def on_wave(wave) -> float:
        waves.append(wave)
        return 0.0

    corpus = write_corpus(target, plan, deadline=time.monotonic() + 120, max_sequences=7, on_wave=on_wave)
    assert 0 < len(corpus.sequences) <= 7
    assert [len(w.sequences) for w in waves][:2] == [3, 3], "waves of max_batch conversations"
    assert sum(len(w.sequences) for w in waves) == len(corpus.sequences)
    for seq, start, text in zip(corpus.sequences, corpus.starts, corpus.texts):
        asked = target.tokenizer.encode_chat([{"role": "user", "content": text["request"]}])
        assert seq[:start] == asked, "each sequence is the request in the template, then the answer"
        assert 0 < len(seq) - start <= 12
    assert corpus.states == [None] * len(corpus.sequences), "states come by prefill, not while writing"
    # The answers are greedy: the engine answers each request the same way.
    for seq, start in zip(corpus.sequences, corpus.starts):
        answer = Engine(target).generate(seq[:start], SamplingParams(max_tokens=12)).token_ids
        assert seq[start:] == answer


def test_the_writer_leaves_the_last_waves_states_time_before_the_deadline(target):
    """A wave whose hand-over took s seconds makes the next one stop writing 1.25 s before the deadline,
    so what it wrote can still be prefilled in time; nothing is written once too little time is left."""
    plan = SelfCorpusPlan(request_tokens=8, answer_tokens=12, max_batch=2)
    handed = []

    def slow(wave) -> float:
        handed.append(time.monotonic())
        return 3600.0  # as if prefilling took an hour: no second wave may start

    corpus = write_corpus(target, plan, deadline=time.monotonic() + 120, on_wave=slow)
    assert len(handed) == 1 and len(corpus.sequences) <= 2


def test_auto_writes_in_waves_on_a_gpu_and_through_the_scheduler_on_a_cpu():
    plan = SelfCorpusPlan()
    assert plan.writer_on(torch.device("cpu")) == "scheduler"
    assert plan.writer_on(torch.device("cuda")) == "waves"
    assert SelfCorpusPlan(writer="waves").writer_on(torch.device("cpu")) == "waves"


def test_train_with_the_wave_writer_prefills_what_it_wrote(home, tmp_path, capsys):
    """`augury train --corpus self --self-writer waves`: the head's description names the writer, and every
    conversation written became states (prefilled wave by wave within the collection's time)."""
    import json

    from augury.cli import main
    from tests.test_train import QUICK

    out = home / "head"
    code = main(["train", "--model", str(tiny_target(tmp_path / "t")), "--kind", "eagle", "--out", str(out),
                 "--corpus", "self", "--self-writer", "waves", "--max-batch", "6", "--max-steps", "10", *QUICK])
    assert code == 0, capsys.readouterr().err
    data = json.loads((out / "head.json").read_text())["data"]
    written = next(s for s in data["sources"] if s["source"] == "self")
    assert written["writer"] == "waves" and written["sequences"] == 24
    assert data["tokens"] == written["tokens"], "every written token's states were collected"
    assert data["tokens_per_hour"]["self"] > 0
