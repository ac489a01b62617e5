"""The corpus a head trains on: token sequences the target reads.

Default: the target writes it (Magpie, Xu et al. 2024). Given only its chat
template's user prefix, an instruct model writes a plausible user request and
ends the turn; asked that request, it answers. Both run through augury's own
scheduler, batched. The head then learns the target's own continuations
(offline self-distillation, which beat fixed data by 11-25% in the published
comparisons), and nothing from the benchmark sets is ever read.

`--data` adds a JSONL file (one {"messages": [{"role", "content"}, ...]} or
{"text": ...} object per line) or a folder of .txt/.md files.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, ProposerBase, Sequence
from augury.sampling import SamplingParams

SENTINEL = "\ufdd0augury-user-request\ufdd1"
TEXT_SUFFIXES = (".txt", ".md")


@dataclass
class Corpus:
    """Token sequences plus what they are (written into the head's description)."""

    sequences: list[list[int]] = field(default_factory=list)
    description: list[dict] = field(default_factory=list)
    texts: list[dict] = field(default_factory=list)  # generated conversations, kept for inspection
    states: list[Tensor | None] = field(default_factory=list)  # per sequence: the target states recorded, if any
    starts: list[int] = field(default_factory=list)  # per written sequence: where the target's answer begins

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)


class StateRecorder(ProposerBase):
    """A proposer that drafts nothing and keeps the target states every step hands it.

    Run with the scheduler while the target writes its corpus, it collects each
    sequence's states as a by-product of decoding (the prompt's from the
    prefill, then every committed position's), instead of a second prefill of
    everything written. The last step of a sequence is not handed over (the
    sequence is done), so its final one or two positions go without.
    """

    name = "recorder"
    needs_hidden = True
    needs_every_step = True

    def __init__(self, hidden_layers: tuple[int, ...]) -> None:
        self.hidden_layers = hidden_layers
        self.live: dict[int, list[Tensor]] = {}
        self.finished: dict[tuple[int, ...], Tensor] = {}

    def start(self, seq: Sequence, prompt_hidden: Tensor | None = None) -> None:
        self.live[seq.id] = [prompt_hidden.clone()]

    def propose(self, seq: Sequence, k: int) -> Draft:
        return Draft([])

    def on_step(self, seq: Sequence, result, hidden: Tensor | None) -> None:
        self.live[seq.id].append(hidden.clone())  # a copy: the step's batch tensor is not kept alive

    def finish(self, seq: Sequence) -> None:
        parts = self.live.pop(seq.id, None)
        if parts:
            self.finished[tuple(seq.tokens)] = torch.cat(parts)

    def take(self, tokens: list[int]) -> Tensor | None:
        """The states [n, H'] of the finished sequence with these tokens (its first n positions), once."""
        return self.finished.pop(tuple(tokens), None)


def _chunks(ids: list[int], max_len: int) -> list[list[int]]:
    return [ids[i : i + max_len] for i in range(0, len(ids), max_len) if len(ids[i : i + max_len]) >= 4]


def read_data(path: str | Path, target: Model, max_len: int) -> Corpus:
    """Token sequences from a JSONL file or a text folder; every problem is an AuguryError naming it."""
    path = Path(path).expanduser()
    tokenizer = target.tokenizer
    corpus = Corpus()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not files:
            raise AuguryError(f"--data {path}: no {' or '.join(TEXT_SUFFIXES)} files in that folder")
        for file in files:
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise AuguryError(f"cannot read --data file {file}: {exc}") from None
            corpus.sequences += _chunks(tokenizer.encode(text, add_bos=None), max_len)
        corpus.description.append({"source": str(path), "kind": "text folder", "files": len(files)})
        return corpus
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuguryError(f"cannot read --data {path}: {exc}") from None
    count = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ids = _line_ids(line, tokenizer, f"--data {path}: line {number}")
        corpus.sequences += _chunks(ids, max_len)
        count += 1
    if not count:
        raise AuguryError(f"--data {path}: no records (expected one JSON object per line)")
    corpus.description.append({"source": str(path), "kind": "jsonl", "records": count})
    return corpus


def chat_corpus(samples: list, target: Model, max_len: int, *, max_tokens: int | None = None,
                description: dict | None = None) -> Corpus:
    """Token sequences of (request, answer) samples through the target's chat template, each cut to
    max_len tokens and starting its drafted text where the answer begins; stops after max_tokens."""
    tokenizer = target.tokenizer
    corpus = Corpus()
    for sample in samples:
        prompt = tokenizer.encode_chat(sample.messages()[:1], add_generation_prompt=True)
        ids = tokenizer.encode_chat(sample.messages(), add_generation_prompt=False)[:max_len]
        start = len(prompt) if ids[: len(prompt)] == prompt else 0
        if len(ids) - start < 4:
            continue
        corpus.sequences.append(ids)
        corpus.starts.append(start)
        corpus.states.append(None)
        if max_tokens is not None and corpus.tokens >= max_tokens:
            break
    if description is not None:
        corpus.description.append({**description, "sequences": len(corpus.sequences), "tokens": corpus.tokens})
    return corpus


def _line_ids(line: str, tokenizer, where: str) -> list[int]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise AuguryError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not ("messages" in record or "text" in record):
        raise AuguryError(f'{where}: expected an object with "messages" (a conversation) or "text"')
    if "text" in record:
        if not isinstance(record["text"], str):
            raise AuguryError(f'{where}: "text" must be a string')
        return tokenizer.encode(record["text"], add_bos=None)
    messages = record["messages"]
    if not isinstance(messages, list) or not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise AuguryError(f'{where}: "messages" must be a non-empty list of {{"role": str, "content": str}}')
    try:
        return tokenizer.encode_chat(messages, add_generation_prompt=False)
    except AuguryError as exc:
        raise AuguryError(f"{where}: {exc}") from None


def user_prefix_ids(target: Model) -> list[int]:
    """The chat template's text before a user's first words (system turn and user header), as token ids."""
    tokenizer = target.tokenizer
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], add_generation_prompt=False)
    except AuguryError as exc:
        raise AuguryError(f"the default corpus needs the target's chat template ({exc}); give --data instead") from None
    cut = rendered.find(SENTINEL)
    if cut <= 0:
        raise AuguryError("the target's chat template does not place a user message where it can be continued; "
                          "give --data instead")
    return tokenizer.encode(rendered[:cut], add_bos=None)


@dataclass(frozen=True)
class SelfCorpusPlan:
    """How the target writes its own corpus."""

    request_tokens: int = 96  # longest user request it writes
    answer_tokens: int = 256  # longest answer
    max_batch: int = 8  # sequences decoded together
    temperature: float = 1.0  # requests are sampled (variety); answers are greedy (what greedy decoding will ask)
    top_p: float = 0.95
    seed: int = 0
    # "waves": `writer.write_corpus` (a batch per wave, states by prefill after); "scheduler": `self_corpus`
    # (the serving scheduler, states recorded while writing); "auto": waves on a GPU, the scheduler on a CPU
    writer: str = "auto"

    def describe(self, writer: str) -> dict:
        """The corpus description of what this plan has the target write (sequences and tokens added at the end)."""
        return {"source": "self", "kind": "magpie", "writer": writer,
                "note": "the target writes user requests from its chat template's user prefix "
                        f"(temperature {self.temperature}, top_p {self.top_p}, <= {self.request_tokens} tokens) "
                        f"and answers them greedily (<= {self.answer_tokens} tokens), {self.max_batch} at a time"}

    def writer_on(self, device: torch.device) -> str:
        """The writer for a target on this device. On a CPU the scheduler wrote faster (its batch stays full
        and it records the states as it goes, where a wave's batch thins out before its longest answer ends
        and its states cost a second prefill: docs/benchmarks.md 23); on a GPU each row's small kernels in
        the scheduler's step cost more than the batch's whole forward, which a wave runs once a step."""
        if self.writer != "auto":
            return self.writer
        return "scheduler" if device.type == "cpu" else "waves"


def self_corpus(
    target: Model,
    plan: SelfCorpusPlan,
    *,
    deadline: float,
    max_sequences: int | None = None,
    on_sequence: Callable[[int, int], None] | None = None,
    recorder: StateRecorder | None = None,
) -> Corpus:
    """Requests and answers written by the target until the deadline (time.monotonic) or max_sequences.

    One scheduler runs both stages: each finished request is answered at once
    and each answer makes room for a new request, so the batch stays full.
    on_sequence(sequences, tokens) reports progress. With a recorder, each
    answered conversation comes with its target states (Corpus.states).
    """
    from augury.scheduler import Failed, Finished, Scheduler, SchedulerConfig

    prefix = user_prefix_ids(target)
    tokenizer = target.tokenizer
    longest_prompt = len(prefix) + plan.request_tokens + 64  # the answer's prompt: the request in the template
    per_row = longest_prompt + plan.answer_tokens + 16
    scheduler = Scheduler(target, recorder, SchedulerConfig(
        max_batch=plan.max_batch, max_queue=4 * plan.max_batch, kv_budget_tokens=plan.max_batch * per_row,
        adaptive_k=False,
    ))
    events: queue.Queue = queue.Queue()
    corpus = Corpus(description=[plan.describe("scheduler")])
    seeds = iter(range(plan.seed * 1_000_003, 1 << 62))
    in_flight = 0

    def submit(kind: str, ids: list[int], params: SamplingParams, payload: str = "") -> None:
        nonlocal in_flight
        scheduler.submit(ids, params, lambda event: events.put((kind, ids, payload, event)))
        in_flight += 1

    def ask_for_request() -> None:
        submit("request", prefix, SamplingParams(
            temperature=plan.temperature, top_p=plan.top_p, max_tokens=plan.request_tokens, seed=next(seeds)))

    wanted = max_sequences if max_sequences is not None else 1 << 62
    scheduler.start()
    try:
        for _ in range(min(plan.max_batch, wanted)):
            ask_for_request()
        while in_flight and time.monotonic() < deadline:  # at the deadline, sequences being written are dropped
            try:
                kind, ids, payload, event = events.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                continue
            if not isinstance(event, (Finished, Failed)):
                continue
            in_flight -= 1
            if isinstance(event, Failed):
                raise AuguryError(f"writing the corpus failed: {event.message}")
            open_slots = time.monotonic() < deadline and len(corpus.sequences) + in_flight < wanted
            if recorder is not None:
                states = recorder.take(list(ids) + list(event.result.token_ids))
            if kind == "request":
                request = event.result.text.strip()
                if request and open_slots:
                    answer_prompt = tokenizer.encode_chat([{"role": "user", "content": request}])
                    submit("answer", answer_prompt, SamplingParams(max_tokens=plan.answer_tokens), request)
                elif open_slots:
                    ask_for_request()
                continue
            answer_ids = event.result.token_ids
            if answer_ids:
                corpus.sequences.append(list(ids) + list(answer_ids))
                corpus.states.append(states if recorder is not None else None)
                corpus.starts.append(len(ids))
                corpus.texts.append({"request": payload, "answer": event.result.text})
                if on_sequence is not None:
                    on_sequence(len(corpus.sequences), corpus.tokens)
            if time.monotonic() < deadline and len(corpus.sequences) + in_flight < wanted:
                ask_for_request()
    finally:
        scheduler.stop()
    corpus.description[0].update(sequences=len(corpus.sequences), tokens=corpus.tokens)
    return corpus
