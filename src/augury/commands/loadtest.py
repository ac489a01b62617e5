"""`augury loadtest`: output tokens/s of `augury serve` against concurrency, speculation on and off.

The servers are started here, as subprocesses, so the numbers include all the
real server's overheads (HTTP, SSE, the scheduler thread); how they share the
machine is explained in `augury.bench.load`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from augury.commands.common import add_model_args
from augury.errors import AuguryError

DEFAULT_SUITE = "spec-bench:2"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "loadtest",
        help="tokens/s of the server against concurrency, speculation on and off",
        description="Starts two `augury serve` processes on 127.0.0.1 (model drafting and plain decoding), "
        "loads one at a time with 1, 2, 4, ... concurrent streaming clients (greedy chat completions), and "
        "prints aggregate output tokens/s, time to first token and time per output token per level, with "
        "the speed-up of speculation. Every response is checked against its prompt's text at concurrency 1. "
        "--endpoint adds any running OpenAI-compatible server (llama-server -np N -cb) to the same run, "
        "with TTFT and TPOT at p50 and p99 and resident memory for every server.",
    )
    add_model_args(p)
    g = p.add_argument_group("servers")
    g.add_argument("--draft", default=None, help="draft model of the spec-on server (default: serve's default)")
    g.add_argument("--k", type=int, default=4, help="largest draft length of the spec-on server (default 4)")
    g.add_argument("--max-batch", type=int, default=None,
                   help="sequences each server decodes together (default: the highest concurrency)")
    g.add_argument("--seq-tokens", type=int, default=2048,
                   help="KV slots per sequence, prompt + output (default 2048; sets serve's --kv-budget-tokens)")
    g.add_argument("--prefix-cache-gb", default=None,
                   help="each augury server's prefix cache (serve's --prefix-cache-gb; 0 disables it; default serve's)")
    g.add_argument("--prefill-chunk", default=None, metavar="N|auto",
                   help="each augury server's prompt tokens per step beside the decode rows (serve's --prefill-chunk; "
                   "0: prompts prefilled whole at admission; default serve's)")
    g.add_argument("--max-step-ms", type=float, default=None, metavar="MS",
                   help="each augury server's bound on a step's time (serve's --max-step-ms; default none)")
    g.add_argument("--port", type=int, default=0,
                   help="spec off on PORT, spec on on PORT+1 (default 0: free ephemeral ports)")
    g.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds to wait for each server's /health (default 600)")
    g = p.add_argument_group("other servers")
    g.add_argument("--endpoint", default=None, metavar="URL",
                   help="also load this running OpenAI-compatible server (e.g. llama-server -np 16 -cb on the same "
                   "GGUF) with the same prompts and levels, in the same run")
    g.add_argument("--endpoint-label", default="endpoint", help="its name in the report (default endpoint)")
    g.add_argument("--endpoint-pid", type=int, default=None,
                   help="its process id, to report its resident memory as augury's servers' is")
    g.add_argument("--endpoint-api-key", default=None, help="bearer key the endpoint wants, if any")
    g.add_argument("--endpoint-model", default=None, help="model name to send it (default: the first it lists)")
    g.add_argument("--endpoint-only", action="store_true", help="load only the endpoint: start no augury server")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", default="1,2,4,8,16", help="client counts, comma separated (default 1,2,4,8,16)")
    g.add_argument("--requests-per-client", type=int, default=2,
                   help="requests each client sends one after another per level (default 2)")
    g.add_argument("--min-requests", type=int, default=12,
                   help="requests each level sends at least, clients sending more rounds where needed "
                   "(default 12: at one client, 12 prompts rather than 2)")
    g.add_argument("--repeats", type=int, default=1,
                   help="run each level this many times per server, turning the order each time (off on on off ...), "
                   "and show the spread of the per-repeat ratios (default 1)")
    g.add_argument("--max-tokens", "-n", type=int, default=128,
                   help="max_tokens of every request (default 128, as Spec-Bench runs and the peers measured here)")
    g.add_argument("--suite", default=DEFAULT_SUITE,
                   help=f"prompts: spec-bench[:N], mt-bench[:N], gsm8k[:N] or a JSONL file (default {DEFAULT_SUITE}; "
                   "first turn only)")
    g.add_argument("--data", default=None, help="the named suite's JSONL file, if not in ../shared/data")
    g.add_argument("--chat-turns", type=int, default=0,
                   help="after the levels, run a few multi-turn chats of this many turns on each server alone "
                   "(the whole history re-sent every turn, as chat clients do) and report TTFT by turn "
                   "(default 0: none)")
    g.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    p.set_defaults(func=run_loadtest)


def _check_args(args: argparse.Namespace) -> list[int]:
    from augury.bench.load import parse_concurrency
    from augury.bench.load_report import SPEC_OFF, SPEC_ON
    from augury.bench.server_process import resident_gb

    levels = parse_concurrency(args.concurrency)
    for name in ("requests_per_client", "max_tokens", "k", "repeats"):
        if getattr(args, name) < 1:
            raise AuguryError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.chat_turns != 0 and args.chat_turns < 2:
        raise AuguryError(f"--chat-turns must be 0 (no chats) or at least 2, got {args.chat_turns}")
    if args.min_requests < 0:
        raise AuguryError(f"--min-requests must be >= 0, got {args.min_requests}")
    if args.max_batch is not None and args.max_batch < 1:
        raise AuguryError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.seq_tokens <= args.max_tokens:
        raise AuguryError(f"--seq-tokens ({args.seq_tokens}) must exceed --max-tokens ({args.max_tokens}) "
                          "to leave room for the prompt")
    if not 0 <= args.port < 65535:
        raise AuguryError(f"--port must be between 1 and 65534 (or 0 for ephemeral ports), got {args.port}")
    if args.startup_timeout <= 0:
        raise AuguryError(f"--startup-timeout must be positive, got {args.startup_timeout}")
    if args.prefix_cache_gb is not None:  # a bad size is one line here, not two servers failing to start
        from augury.commands.serve import prefix_cache_bytes

        prefix_cache_bytes(args.prefix_cache_gb)
    if args.prefill_chunk is not None:
        from augury.commands.serve import prefill_chunk

        prefill_chunk(args.prefill_chunk)
    from augury.commands.serve import max_step_ms

    max_step_ms(args.max_step_ms)
    if args.endpoint is None:
        for flag in ("endpoint_pid", "endpoint_api_key", "endpoint_model"):
            if getattr(args, flag) is not None:
                raise AuguryError(f"--{flag.replace('_', '-')} needs --endpoint")
        if args.endpoint_only:
            raise AuguryError("--endpoint-only needs --endpoint")
    if args.endpoint_label in (SPEC_OFF, SPEC_ON) or not args.endpoint_label.strip():
        raise AuguryError(f"--endpoint-label must name the endpoint apart from augury's servers, got "
                          f"{args.endpoint_label!r}")
    if args.endpoint_pid is not None and resident_gb(args.endpoint_pid) is None:
        raise AuguryError(f"--endpoint-pid {args.endpoint_pid}: no such process (or no /proc to read its memory)")
    if args.out is not None:  # before the load test, not after it
        from augury.files import check_writable

        check_writable(args.out, "--out")
    return levels


def _draft_args(args: argparse.Namespace) -> list[str]:
    """The spec-on server's drafting options (the plain one refuses them)."""
    return ["--k", str(args.k)] + (["--draft", args.draft] if args.draft is not None else [])


def _serve_args(args: argparse.Namespace, max_batch: int) -> list[str]:
    """The options both servers share."""
    argv = ["--model", args.model, "--dtype", args.dtype, "--device", args.device,
            "--max-batch", str(max_batch), "--kv-budget-tokens", str(max_batch * args.seq_tokens),
            "--max-tokens-limit", str(args.max_tokens)]
    if args.prefix_cache_gb is not None:
        argv += ["--prefix-cache-gb", str(args.prefix_cache_gb)]
    if args.prefill_chunk is not None:
        argv += ["--prefill-chunk", str(args.prefill_chunk)]
    if args.max_step_ms is not None:
        argv += ["--max-step-ms", str(args.max_step_ms)]
    if args.offline:
        argv.append("--offline")
    if not args.exact:
        argv.append("--no-exact")
    return argv


def run_loadtest(args: argparse.Namespace) -> int:
    levels = _check_args(args)
    from augury.bench.endpoint import EndpointContender
    from augury.bench.load import run_with_servers, write_json
    from augury.bench.suites import load_suite

    suite = load_suite(args.suite, args.data)
    prompts = [[{"role": "user", "content": p.turns[0]}] for p in suite.prompts]
    max_batch = args.max_batch or max(levels)

    def progress(line: str) -> None:
        print(f"augury: {line}", file=sys.stderr, flush=True)

    endpoints, pids = {}, {}
    if args.endpoint is not None:
        client = EndpointContender(args.endpoint, api_key=args.endpoint_api_key, model=args.endpoint_model,
                                   method=args.endpoint_label)
        client.check()  # an unreachable or non-OpenAI endpoint: one line, before any augury server starts
        endpoints[args.endpoint_label] = client
        if args.endpoint_pid is not None:
            pids[args.endpoint_label] = args.endpoint_pid
    report = run_with_servers(
        _serve_args(args, max_batch), prompts, levels, args.requests_per_client, args.max_tokens,
        port=args.port, startup_timeout=args.startup_timeout, progress=progress, min_requests=args.min_requests,
        repeats=args.repeats, endpoints=endpoints, endpoint_pids=pids, start_augury=not args.endpoint_only,
        chat_turns=args.chat_turns, draft_args=_draft_args(args),
    )
    report.prompt_ids = [p.id for p in suite.prompts]
    report.settings = {
        "model": args.model, "draft": args.draft, "k": args.k, "max_batch": max_batch, "dtype": args.dtype,
        "device": args.device, "suite": args.suite, "prompts": len(prompts), "concurrency": levels,
        "requests_per_client": args.requests_per_client, "min_requests": args.min_requests, "repeats": args.repeats,
        "max_tokens": args.max_tokens, "temperature": 0.0, "endpoint": args.endpoint,
        "endpoint_label": args.endpoint_label if args.endpoint else None, "augury_servers": not args.endpoint_only,
        "chat_turns": args.chat_turns, "prefix_cache_gb": args.prefix_cache_gb, "prefill_chunk": args.prefill_chunk,
        "max_step_ms": args.max_step_ms,
    }
    print(report.markdown(), end="")
    if args.out is not None:
        write_json(report, args.out)
        progress(f"wrote {args.out}")
    return 0
