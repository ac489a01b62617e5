"""Benchmark harness behind `augury bench`.

suites (prompt sets) -> runner (interleaved runs, records.jsonl, resume) ->
summary (tokens/s, speed-up, tau, alpha, correctness) -> report (summary.md,
PNG plots, report.html); peers (transformers, llama.cpp) and endpoint (any
OpenAI-compatible server) are further contenders in the same run.
"""
