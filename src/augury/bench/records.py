"""What a benchmark run leaves on disk, and the contract between contenders and the run.

The bottom of `augury.bench`: the runner writes records through this module,
the summary and the report read them back through it, and neither imports the
other. One record is one (prompt, method, K): a JSON line in records.jsonl,
appended and flushed as soon as the run finishes, so an interrupted benchmark
keeps its work and a torn last line (the process killed mid-write) is dropped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from augury.bench.suites import Prompt
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.sampling import SamplingParams

# The files of one benchmark folder.
RECORDS = "records.jsonl"
RUN_INFO = "run.json"
SUMMARY_MD = "summary.md"
REPORT_HTML = "report.html"
PLOTS = ("speedup.png", "acceptance.png", "time_split.png", "sweep.png")
OUTPUT_FILES = (RECORDS, RUN_INFO, SUMMARY_MD, REPORT_HTML, *PLOTS)  # all a benchmark writes, and may remove

Messages = list[dict[str, str]]  # a chat so far: [{"role": ..., "content": ...}]


@dataclass
class Outcome:
    """What one generation produced: tokens, text and timing counters."""

    token_ids: list[int]
    text: str
    stats: SpecStats
    finish_reason: str = "length"


class Contender(Protocol):
    """A method under test. `method` and `k` name its records."""

    method: str
    k: int
    kind: str  # "augury", "peer" or "endpoint"
    lossless: bool  # greedy output must equal plain decoding's token for token
    counterpart: str | None  # the augury method a peer is compared against

    def generate(self, messages: Messages, prompt_ids: list[int] | None, params: SamplingParams) -> Outcome:
        """One completion of the chat so far (prompt_ids: its tokens, when a local tokenizer exists)."""


def run_key(prompt_id: str, method: str, k: int) -> tuple[str, str, int]:
    """What identifies a record: a run already recorded under this key is not run again on resume."""
    return (str(prompt_id), method, int(k))


def record_for(prompt: Prompt, contender: Contender, outcomes: list[Outcome]) -> dict:
    """The JSONL record of one prompt (all its turns) run by one contender."""
    stats = SpecStats()
    for outcome in outcomes:
        stats = stats.merge(outcome.stats)
    decode_s = stats.decode_s if stats.generated_tokens else 0.0
    return {
        "prompt_id": prompt.id,
        "task": prompt.task,
        "category": prompt.category,
        "method": contender.method,
        "k": contender.k,
        "kind": contender.kind,
        "turns": len(outcomes),
        "tokens": stats.generated_tokens,
        "seconds": decode_s,
        "tokens_per_s": stats.tokens_per_s,
        "tau": stats.tau,
        "alpha": stats.alpha,
        "acceptance_by_position": stats.acceptance_by_position,
        "prompt_tokens": stats.prompt_tokens,
        "prefill_s": stats.prefill_s,
        "draft_s": stats.draft_s,
        "verify_s": stats.verify_s,
        "other_s": stats.other_s,
        "total_s": stats.total_s,
        "steps": stats.steps,
        "committed_in_steps": stats.committed_in_steps,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "drafted_at": stats.drafted_at,
        "accepted_at": stats.accepted_at,
        "target_forwards": stats.target_forwards,
        "draft_forwards": stats.draft_forwards,
        "finish_reason": [o.finish_reason for o in outcomes],
        "token_ids": [o.token_ids for o in outcomes],
        "text": [o.text for o in outcomes],
    }


def record_stats(record: dict) -> SpecStats:
    """The counters a record was written from (`record_for`), so summaries redo no `SpecStats` arithmetic.

    A field an older record lacks counts as zero.
    """
    return SpecStats(
        prompt_tokens=record.get("prompt_tokens", 0),
        generated_tokens=record.get("tokens", 0),
        drafted=record.get("drafted", 0),
        accepted=record.get("accepted", 0),
        steps=record.get("steps", 0),
        target_forwards=record.get("target_forwards", 0),
        draft_forwards=record.get("draft_forwards", 0),
        drafted_at=list(record.get("drafted_at", [])),
        accepted_at=list(record.get("accepted_at", [])),
        prefill_s=record.get("prefill_s", 0.0),
        draft_s=record.get("draft_s", 0.0),
        verify_s=record.get("verify_s", 0.0),
        total_s=record.get("total_s", 0.0),
    )


class RecordWriter:
    """Appends one JSON line per finished run and flushes it to disk at once."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def read_records(path: Path) -> list[dict]:
    """Records written so far. A torn last line (the process was killed mid-write) is dropped."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if lineno == len(lines):
                break
            raise AuguryError(f"{path}:{lineno}: malformed record; fix or remove the line") from None
    return records
