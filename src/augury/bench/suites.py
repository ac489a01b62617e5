"""Benchmark prompt sets: Spec-Bench, MT-Bench, GSM8K or any JSONL file.

A suite is named `NAME[:N]` or given as a path. Named suites read the shared
data folder next to the project (`../shared/data/...` from the current
directory, as the project ships no copy of the prompts); `--data PATH`
points a named suite at another copy. `:N` keeps the first N prompts of each
task by question id, so `spec-bench:2` is the 12-prompt subset (two of each of
Spec-Bench's six tasks) used for quick comparisons.

Spec-Bench stores its first task (MT-Bench conversations) under MT-Bench's
eight fine categories; they are grouped into one task `mt_bench` here, as the
Spec-Bench paper reports them, and the fine category is kept on each prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from augury.errors import AuguryError

# The MT-Bench categories Spec-Bench's first task is made of.
MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)


@dataclass(frozen=True)
class SuiteSource:
    """Where a named suite's prompts live and how its rows are grouped into tasks."""

    default_path: str  # relative to the current directory
    group_mt_bench: bool = False  # fold MT-Bench categories into one task "mt_bench"


SUITES: dict[str, SuiteSource] = {
    "spec-bench": SuiteSource("../shared/data/spec_bench/question.jsonl", group_mt_bench=True),
    "mt-bench": SuiteSource("../shared/data/mt_bench/question.jsonl"),
    "gsm8k": SuiteSource("../shared/data/gsm8k/test.jsonl"),
}

# Row fields that hold the prompt text, in the order they are looked for.
TEXT_FIELDS = ("turns", "prompt", "question")


@dataclass(frozen=True)
class Prompt:
    """One benchmark question: its user turns, and the task it is reported under."""

    id: str
    task: str
    category: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Suite:
    name: str  # as given on the command line
    path: Path
    prompts: list[Prompt]

    @property
    def tasks(self) -> list[str]:
        """Task names in order of first appearance."""
        return list(dict.fromkeys(p.task for p in self.prompts))


def parse_suite_spec(spec: str) -> tuple[str, int | None]:
    """Split `NAME[:N]` into the name (or path) and the per-task limit."""
    name, sep, count = spec.rpartition(":")
    if sep and count.isdigit() and name:
        if int(count) < 1:
            raise AuguryError(f"suite '{spec}': the per-task prompt count must be at least 1")
        return name, int(count)
    return spec, None


@dataclass(frozen=True)
class ResolvedSuite:
    path: Path
    limit: int | None  # prompts per task
    group_mt_bench: bool
    default_category: str  # for rows without a "category"


def resolve_suite(spec: str, data: str | Path | None = None, cwd: Path | None = None) -> ResolvedSuite:
    """Where a suite spec's prompts are and how to select them.

    A spec that is an existing file is taken whole, even if it contains ':'.
    """
    cwd = Path.cwd() if cwd is None else cwd
    as_path = cwd / spec
    if as_path.is_file():
        return ResolvedSuite(as_path, None, False, as_path.stem)
    name, limit = parse_suite_spec(spec)
    source = SUITES.get(name)
    if source is None:
        path = cwd / name
        if path.suffix in (".jsonl", ".json") or "/" in name:
            if not path.is_file():
                raise AuguryError(f"suite file not found: {path}")
            return ResolvedSuite(path, limit, False, path.stem)
        raise AuguryError(
            f"unknown suite '{spec}' (choose {', '.join(f'{n}[:N]' for n in SUITES)} or a JSONL file path)"
        )
    path = Path(data) if data is not None else cwd / source.default_path
    if not path.is_file():
        hint = "" if data is not None else " (the project ships no copy of the prompts; give --data PATH)"
        raise AuguryError(f"{name} data not found at {path}{hint}")
    return ResolvedSuite(path, limit, source.group_mt_bench, name)


def _row_prompt(row: object, lineno: int, path: Path, group_mt_bench: bool, default_category: str) -> Prompt:
    if not isinstance(row, dict):
        raise AuguryError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    field = next((f for f in TEXT_FIELDS if f in row), None)
    if field is None:
        raise AuguryError(f"{path}:{lineno}: no prompt text (expected a field {', '.join(map(repr, TEXT_FIELDS))})")
    value = row[field]
    turns = tuple(value) if isinstance(value, list) else (value,)
    if not turns or not all(isinstance(t, str) and t for t in turns):
        raise AuguryError(f"{path}:{lineno}: field '{field}' must be a non-empty string or list of strings")
    qid = row.get("question_id", row.get("id", lineno))
    category = str(row.get("category", default_category))
    task = "mt_bench" if group_mt_bench and category in MT_BENCH_CATEGORIES else category
    return Prompt(id=str(qid), task=task, category=category, turns=turns)


def read_prompts(path: Path, group_mt_bench: bool = False, default_category: str | None = None) -> list[Prompt]:
    """Every row of a JSONL file as a Prompt; a bad line is named by its number."""
    prompts: list[Prompt] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuguryError(f"cannot read {path}: {exc}") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AuguryError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from None
        prompts.append(_row_prompt(row, lineno, path, group_mt_bench, default_category or path.stem))
    if not prompts:
        raise AuguryError(f"{path}: no prompts")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise AuguryError(f"{path}: question id {dup} appears more than once")
    return prompts


def _sort_key(prompt: Prompt) -> tuple:
    return (0, int(prompt.id), "") if prompt.id.lstrip("-").isdigit() else (1, 0, prompt.id)


def first_per_task(prompts: list[Prompt], n: int) -> list[Prompt]:
    """The first n prompts of each task by question id, tasks in order of first appearance."""
    by_task: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_task.setdefault(prompt.task, []).append(prompt)
    return [p for group in by_task.values() for p in sorted(group, key=_sort_key)[:n]]


def load_suite(spec: str, data: str | Path | None = None, cwd: Path | None = None) -> Suite:
    """The prompts of a suite spec (see the module docstring)."""
    resolved = resolve_suite(spec, data, cwd)
    prompts = read_prompts(resolved.path, resolved.group_mt_bench, resolved.default_category)
    if resolved.limit is not None:
        prompts = first_per_task(prompts, resolved.limit)
    return Suite(name=spec, path=resolved.path, prompts=prompts)
