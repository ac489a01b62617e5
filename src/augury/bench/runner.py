"""Run every method on the same prompts in one process, one record per (prompt, method, K).

Fair comparison on a shared machine is the point of this module:

* the target is loaded once and every method (and peer) runs in this process;
* methods are interleaved prompt by prompt, in an order that rotates with the
  prompt index, so slow drift of the machine (other jobs, thermals) hits every
  method alike instead of whichever happened to run last;
* each contender does one short warm-up generation first, not recorded, so
  lazy initialisation and first-call costs are not billed to the first prompt;
* each record is appended to records.jsonl and flushed as soon as it finishes,
  so an interrupted run keeps its work and `resume` skips what is done.

A *contender* is anything that turns chat messages into a completion and a
`SpecStats`: augury's engine with a proposer (or none, plain decoding), a
transformers or llama.cpp peer, or a remote OpenAI-compatible endpoint.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from augury.bench.records import (
    OUTPUT_FILES,
    RECORDS,
    RUN_INFO,
    Contender,
    Messages,
    Outcome,
    RecordWriter,
    read_records,
    record_for,
    run_key,
)
from augury.bench.suites import Prompt
from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Proposer
from augury.sampling import SamplingParams

WARMUP_TOKENS = 8
Run = tuple[int, Prompt, Contender]  # (the prompt's index, for its seed; the prompt; who runs it)


class EngineContender:
    """augury's engine: plain decoding (proposer None) or speculative with one proposer."""

    kind = "augury"
    lossless = True
    counterpart = None

    def __init__(self, target: Model, proposer: Proposer | None, method: str, k: int, *, adaptive: bool = False) -> None:
        """k: the draft length, or with adaptive the longest the planner may choose per step."""
        from augury.engine import Engine

        self.method = method
        self.k = k if proposer is not None else 0
        self.engine = Engine(target, proposer, k=max(k, 1), adaptive=adaptive)

    def generate(self, messages: Messages, prompt_ids: list[int] | None, params: SamplingParams) -> Outcome:
        assert prompt_ids is not None
        result = self.engine.generate(prompt_ids, params)
        return Outcome(result.token_ids, result.text, result.stats, result.finish_reason)


def prompt_text(tokenizer, messages: Messages, chat: bool) -> str:
    """The text a conversation is fed as: through the chat template, or its turns concatenated (raw).

    Peers that take text rather than token ids (llama.cpp's binaries) get exactly this.
    """
    return tokenizer.apply_chat_template(messages) if chat else "".join(m["content"] for m in messages)


def encode_messages(tokenizer, messages: Messages, chat: bool) -> list[int]:
    """Token ids of a conversation: through the chat template, where only the template's own markers are
    special tokens (`Tokenizer.encode_chat`; the same ids as `prompt_text` for text without special
    markers), or its turns concatenated (raw)."""
    if chat:
        return tokenizer.encode_chat(messages)
    return tokenizer.encode(prompt_text(tokenizer, messages, chat))


def schedule(prompts: list[Prompt], contenders: list) -> list[tuple[Prompt, object]]:
    """Every (prompt, contender) pair, prompt by prompt; prompt i starts at contender i mod m.

    Rotating the start spreads any systematic cost of going first or last in a
    prompt's group (cache state, thermals) evenly over the methods.
    """
    m = len(contenders)
    order = []
    for i, prompt in enumerate(prompts):
        shift = i % m if m else 0
        order.extend((prompt, c) for c in contenders[shift:] + contenders[:shift])
    return order


def machine_info() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "kernel": _kernel_isa(),
    }


def _kernel_isa() -> str:
    """Which instruction set's GGUF kernel and layer run here (AUGURY_ISA's, or the best the CPU runs)."""
    from augury.kernels.extension import kernel_isa

    forced = os.environ.get("AUGURY_ISA")
    return kernel_isa() + (" (AUGURY_ISA)" if forced else "")


@dataclass
class BenchPlan:
    """What to run: prompts x contenders, with one set of sampling parameters."""

    prompts: list[Prompt]
    contenders: list
    params: SamplingParams
    encode: Callable[[Messages], list[int]] | None  # None: no local tokenizer (endpoint only)
    all_turns: bool = False  # run every turn, feeding back the contender's own answers
    settings: dict = field(default_factory=dict)  # model, suite, ... recorded in run.json

    def run_info(self) -> dict:
        """The identity of this run, written to run.json and checked on resume."""
        return {
            **self.settings,
            "max_new_tokens": self.params.max_tokens,
            "temperature": self.params.temperature,
            "seed": self.params.seed,
            # what each sampled prompt runs under (each gets its own seed, see _seeded)
            "sampling": "greedy" if self.params.greedy else _seeded(self.params, 0).mode,
            "turns": "all" if self.all_turns else "first",
            "methods": [
                {"method": c.method, "k": c.k, "kind": c.kind, "lossless": c.lossless, "counterpart": c.counterpart}
                for c in self.contenders
            ],
            "prompts": [p.id for p in self.prompts],
            "expected_runs": len(self.prompts) * len(self.contenders),
        }


# Settings that must match for a resumed run to extend the same benchmark.
IDENTITY_KEYS = (
    "model", "draft", "dtype", "chat", "suite", "max_new_tokens", "temperature", "seed", "sampling", "turns", "methods",
    "prompts",
)


def check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """The cheap part of `prepare_out_dir`, to run before loading any model."""
    if out.exists() and not out.is_dir():
        raise AuguryError(f"--out {out} is a file, not a folder")
    if (out / RECORDS).exists() and not (resume or overwrite):
        raise AuguryError(f"{out} already holds a benchmark run; pass --resume to continue it or --overwrite")


def prepare_out_dir(out: Path, info: dict, resume: bool, overwrite: bool) -> set[tuple[str, str, int]]:
    """Create or check the output folder; return the keys of runs already recorded.

    Refuses to mix two different benchmarks in one folder, and refuses to
    discard an earlier run's records unless asked. Only files this benchmark
    writes are ever removed.
    """
    check_out_dir(out, resume, overwrite)
    records_path = out / RECORDS
    info_path = out / RUN_INFO
    done: set[tuple[str, str, int]] = set()
    if records_path.exists() and resume:
        if not info_path.exists():
            raise AuguryError(f"cannot resume {out}: {RUN_INFO} is missing")
        try:
            old = json.loads(info_path.read_text())
        except json.JSONDecodeError:
            raise AuguryError(f"{info_path}: unreadable; cannot resume") from None
        for key in IDENTITY_KEYS:
            if old.get(key) != info.get(key):
                raise AuguryError(
                    f"cannot resume {out}: its run has different {key} ({old.get(key)!r} vs {info.get(key)!r})"
                )
        kept = read_records(records_path)
        # Rewritten without a torn last line, so that new records start on a fresh line.
        records_path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        done = {run_key(r["prompt_id"], r["method"], r["k"]) for r in kept}
        info = {**info, "started": old.get("started", info.get("started"))}
    else:
        for name in OUTPUT_FILES:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    info_path.write_text(json.dumps(info, indent=1))
    return done


def _seeded(params: SamplingParams, index: int) -> SamplingParams:
    """Per-prompt seed for sampled runs, so a rerun (or a resumed one) draws the same way."""
    import dataclasses

    if params.greedy:
        return params
    return dataclasses.replace(params, seed=(params.seed or 0) + index)


def _conversation(prompt: Prompt, plan: BenchPlan, contender: Contender, params: SamplingParams) -> list[Outcome]:
    """Run the prompt's first turn, or every turn feeding back the contender's own answers."""
    messages: Messages = []
    outcomes = []
    for turn in prompt.turns if plan.all_turns else prompt.turns[:1]:
        messages.append({"role": "user", "content": turn})
        ids = plan.encode(messages) if plan.encode is not None else None
        outcome = contender.generate(list(messages), ids, params)
        outcomes.append(outcome)
        messages.append({"role": "assistant", "content": outcome.text})
    return outcomes


def pending_runs(plan: BenchPlan, done: set, max_prompts: int | None = None) -> list[Run]:
    """The scheduled runs not yet recorded, with each prompt's index (for its seed)."""
    index = {p.id: i for i, p in enumerate(plan.prompts)}
    prompts = plan.prompts if max_prompts is None else plan.prompts[:max_prompts]
    return [
        (index[p.id], p, c)
        for p, c in schedule(prompts, plan.contenders)
        if run_key(p.id, c.method, c.k) not in done
    ]


def check_prompt_lengths(plan: BenchPlan, context: int) -> None:
    """Refuse, before anything runs, a prompt whose first turn cannot fit with max_new_tokens."""
    if plan.encode is None:
        return
    for prompt in plan.prompts:
        n = len(plan.encode([{"role": "user", "content": prompt.turns[0]}]))
        if n + plan.params.max_tokens > context:
            raise AuguryError(
                f"prompt {prompt.id} is {n} tokens; with --max-tokens {plan.params.max_tokens} it exceeds "
                f"the model's context of {context}"
            )


def prepare_run(
    plan: BenchPlan, out: Path, *, resume: bool = False, overwrite: bool = False, max_prompts: int | None = None
) -> list[Run]:
    """Check the settings against the folder, write run.json and return the runs not yet recorded.

    Runs before anything is generated, so bad input (a folder holding another
    benchmark, a resume with other settings) raises with nothing run or reported.
    """
    info = {**plan.run_info(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_info()}
    done = prepare_out_dir(out, info, resume, overwrite)
    return pending_runs(plan, done, max_prompts)


def run_bench(plan: BenchPlan, out: Path, todo: list[Run], *, progress: bool = True, warmup: bool = True) -> int:
    """Run `todo` (from `prepare_run`), appending each record to out/records.jsonl; return the runs finished.

    Each record is on disk as soon as its run finishes, so Ctrl-C or an error
    keep every finished run; the exception propagates. The report is the
    caller's next step (`commands.bench.run_and_report`).
    """
    finished = 0
    if todo and warmup:
        _warm_up(plan, todo)
    writer = RecordWriter(out / RECORDS)
    try:
        for index, prompt, contender in _progress(todo, progress):
            outcomes = _conversation(prompt, plan, contender, _seeded(plan.params, index))
            writer.write(record_for(prompt, contender, outcomes))
            finished += 1
    finally:
        writer.close()
    return finished


def _warm_up(plan: BenchPlan, todo: list[Run]) -> None:
    """One short, unrecorded generation per contender that still has work."""
    import dataclasses

    params = dataclasses.replace(plan.params, max_tokens=min(WARMUP_TOKENS, plan.params.max_tokens))
    seen = set()
    for _, prompt, contender in todo:
        if id(contender) in seen:
            continue
        seen.add(id(contender))
        messages = [{"role": "user", "content": prompt.turns[0]}]
        contender.generate(messages, plan.encode(messages) if plan.encode else None, params)


def _progress(todo: list[Run], enabled: bool) -> Iterator[Run]:
    if not enabled:
        yield from todo
        return
    from tqdm import tqdm

    with tqdm(total=len(todo), unit="run", desc="bench", file=sys.stderr, dynamic_ncols=True) as bar:
        for item in todo:
            _, prompt, contender = item
            bar.set_postfix_str(f"{prompt.task}/{prompt.id} {contender.method}", refresh=False)
            yield item
            bar.update(1)
