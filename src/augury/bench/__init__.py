"""Benchmark harness behind `augury bench`.

suites (prompt sets) -> runner (interleaved runs, resume) -> records
(records.jsonl: the files, `Outcome`, writer and reader) -> summary (tokens/s,
speed-up, correctness; tau and alpha are `SpecStats`') -> report (summary.md,
PNG plots, report.html). The runner and the report meet only in records; the
command (`commands.bench`) runs, then reports. peers (transformers, llama.cpp)
and endpoint (any OpenAI-compatible server) are further contenders in the same
run.
"""
