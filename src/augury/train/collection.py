"""Collecting what a head trains on: the corpus, then the target's states and top-k over it, into shards.

Sources, in this order within the collection's share of the budget:
- `self`: the target writes requests and answers (corpus.self_corpus), its
  states recorded while it writes (on-policy text, ~40k tokens an hour on 2 cores);
- `--data`: JSONL conversations or text folders;
- `stdlib` (the default): chat-shaped samples of the Python standard library
  (stdlib_corpus), read by teacher-forced, batched prefill until the share
  of the budget or --corpus-tokens runs out (20-35x the rate of writing);
  `stdlib-tests` adds its test suites (about as much code again, same licence).
Every shard is written whole and renamed into place, and the manifest lists
them, so an interrupted collection keeps its finished shards.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

from augury.errors import AuguryError
from augury.models.head import HeadConfig, feature_layers
from augury.models.loader import Model
from augury.train import corpus as corpora
from augury.train import features as feats
from augury.train import stdlib_corpus
from augury.train.writer import write_corpus
from augury.train.progress import ProgressBar

SOURCES = ("stdlib", "stdlib-tests", "self")
TOKENIZE_CHUNK = 256  # samples tokenized at a time (the stdlib corpus is millions of tokens; only what is read)


@dataclass(frozen=True)
class CorpusPlan:
    """Where the text comes from and how much of it to read (validated before any work)."""

    sources: tuple[str, ...] = ("stdlib",)
    data_paths: tuple[str, ...] = ()
    max_tokens: int | None = None  # stop collecting after this many tokens (default: at the share of the budget)
    max_sequences: int | None = None  # self-written conversations at most
    share: float = 0.4  # of the whole budget
    batch_tokens: int = 512  # padded tokens per batched prefill (larger ran slower on 2 cores: docs/benchmarks.md 8a)
    max_chars: int = 1600  # stdlib answers cut here (about the training window of 512 tokens)
    self_plan: corpora.SelfCorpusPlan = field(default_factory=corpora.SelfCorpusPlan)

    def __post_init__(self) -> None:
        unknown = [s for s in self.sources if s not in SOURCES]
        if unknown:
            raise AuguryError(f"unknown corpus source '{unknown[0]}' (known: {', '.join(SOURCES)}, or none)")
        if not self.sources and not self.data_paths:
            raise AuguryError("--corpus none needs --data: there would be nothing to train on")
        if not 0.0 < self.share < 1.0:
            raise AuguryError(f"the corpus share of the budget must be in (0, 1), got {self.share}")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise AuguryError(f"--corpus-tokens must be positive, got {self.max_tokens}")


@dataclass
class Collected:
    """What a collection wrote, for the manifest."""

    shards: list[Path]
    sources: list[dict]
    tokens: int
    sequences: int
    seconds: float
    rates: dict[str, int]  # tokens an hour, per way of collecting


def collect_corpus(
    target: Model,
    config: HeadConfig,
    work: Path,
    plan: CorpusPlan,
    *,
    seq_len: int,
    topk: int,
    seed: int,
    deadline: float,
    progress: bool = True,
) -> Collected:
    """Every source of `plan` into feature shards under `work`, until the deadline (time.monotonic)."""
    t_start = time.monotonic()
    writer = feats.ShardWriter(work)
    sources: list[dict] = []
    rates: dict[str, int] = {}
    count = {"tokens": 0, "sequences": 0}

    def fraction() -> float:
        by_time = (time.monotonic() - t_start) / max(1e-9, deadline - t_start)
        return max(by_time, count["tokens"] / plan.max_tokens if plan.max_tokens else 0.0)

    def ticker(desc: str) -> ProgressBar:
        return ProgressBar(desc, progress)

    def budget_left() -> bool:
        full = plan.max_tokens is not None and count["tokens"] >= plan.max_tokens
        return not full and time.monotonic() < deadline

    def prefill(corpus: corpora.Corpus, bar: ProgressBar) -> float:
        t0 = time.monotonic()

        def tick(tokens: int, sequences: int) -> None:
            count["tokens"] += tokens
            count["sequences"] += sequences
            bar.update(fraction(), tokens=count["tokens"], sequences=count["sequences"])

        feats.collect(target, corpus.sequences, config, writer, starts=corpus.starts or None, topk=topk,
                      batch_tokens=plan.batch_tokens, deadline=deadline, progress=tick)
        return time.monotonic() - t0

    if "self" in plan.sources:
        # writing is slow: it gets the whole share only when it is the sole source
        share_end = deadline if plan.sources == ("self",) and not plan.data_paths else (
            t_start + (deadline - t_start) / 2)
        bar = ticker("the target writes its corpus")
        t0 = time.monotonic()

        def progress_of(sequences: int, tokens: int) -> None:
            bar.update(fraction(), tokens=tokens, sequences=sequences)

        if plan.self_plan.writer_on(target.decoder.device) == "waves":
            written = write_corpus(target, plan.self_plan, deadline=share_end, max_sequences=plan.max_sequences,
                                   on_sequence=progress_of, on_wave=lambda wave: prefill(wave, bar))
        else:
            written = corpora.self_corpus(
                target, plan.self_plan, deadline=share_end, max_sequences=plan.max_sequences,
                recorder=corpora.StateRecorder(feature_layers(config, target.config)), on_sequence=progress_of)
        bar.close()
        for ids, states, start in zip(written.sequences, written.states, written.starts):
            added = feats.add_recorded(writer, target, config, ids, states, topk, start) if states is not None else 0
            count["tokens"] += added
            count["sequences"] += added > 0
        # tokens of states an hour, the prefill of what was written included
        rates["self"] = round(written.tokens / max(time.monotonic() - t0, 1e-9) * 3600)
        sources += written.description

    prefilled = {"tokens": 0, "seconds": 0.0}
    for path in plan.data_paths:
        given = corpora.read_data(path, target, seq_len)
        before = count["tokens"]
        bar = ticker(f"states over {path}")
        prefilled["seconds"] += prefill(given, bar)
        bar.close()
        prefilled["tokens"] += count["tokens"] - before
        sources += given.description
    for source, tests in (("stdlib", False), ("stdlib-tests", True)):
        if source not in plan.sources or not budget_left():
            continue
        samples = stdlib_corpus.samples(plan.max_chars, seed=seed, tests=tests)
        bar = ticker(f"states over the standard library{' tests' if tests else ''}")
        before_tokens, before_sequences, read, t_phase = count["tokens"], count["sequences"], 0, time.monotonic()
        while budget_left():
            chunk = list(itertools.islice(samples, TOKENIZE_CHUNK))
            if not chunk:
                break
            left = None if plan.max_tokens is None else plan.max_tokens - count["tokens"]
            prefilled["seconds"] += prefill(corpora.chat_corpus(chunk, target, seq_len, max_tokens=left), bar)
            read += len(chunk)
        bar.close()
        prefilled["tokens"] += count["tokens"] - before_tokens
        rates[source] = round((count["tokens"] - before_tokens) / max(time.monotonic() - t_phase, 1e-9) * 3600)
        sources.append({"source": source, "kind": f"python standard library{' test suites' if tests else ''}",
                        "licence": stdlib_corpus.LICENCE, "root": str(stdlib_corpus.stdlib_root()),
                        "samples_read": read, "sequences": count["sequences"] - before_sequences,
                        "tokens": count["tokens"] - before_tokens})
    if prefilled["seconds"]:
        rates["prefill"] = round(prefilled["tokens"] / prefilled["seconds"] * 3600)
    shards = writer.flush()
    if not shards:
        raise AuguryError("the corpus is empty: nothing was collected in the time given")
    return Collected(shards=shards, sources=sources, tokens=count["tokens"], sequences=count["sequences"],
                     seconds=round(time.monotonic() - t_start, 1), rates=rates)
