"""`augury bench`: Spec-Bench style comparison of decoding methods, peers and endpoints in one run."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from augury.commands.common import (
    add_draft_args,
    add_model_args,
    add_sampling_args,
    given_draft_options,
    sampling_from_args,
)
from augury.errors import AuguryError
from augury.proposers.options import DEFAULT_METHOD

if TYPE_CHECKING:
    from augury.bench.runner import BenchPlan

DRAFT_MODEL_METHODS = ("model", "hybrid", "cross")  # methods that load a second model
LLAMA_CPP_MAX_CTX = 8192


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark decoding methods on Spec-Bench (or another prompt set) and write a report",
        description="Runs every method on the same prompts in one process, interleaved prompt by prompt, "
        "and writes records.jsonl, summary.md, PNG plots and a self-contained report.html to --out. "
        "Speed-up is tokens/s over plain decoding measured in the same run.",
    )
    p.add_argument("--methods", default=None,
                   help=f"comma list of plain and drafting methods (default plain,{DEFAULT_METHOD}; with "
                   "--endpoint and no --methods, the endpoint alone)")
    p.add_argument("--suite", default="spec-bench:2",
                   help="spec-bench[:N], mt-bench[:N], gsm8k[:N] (N prompts per task) or a JSONL file with a "
                   "'prompt' or 'turns' field (default spec-bench:2, 12 prompts)")
    p.add_argument("--data", default=None, help="the named suite's JSONL file (default ../shared/data/...)")
    p.add_argument("--turns", choices=("first", "all"), default="first",
                   help="multi-turn prompts: first turn only (default) or all, feeding back each method's answers")
    p.add_argument("--no-chat", dest="chat", action="store_false", help="feed prompts raw, without the chat template")
    p.add_argument("--sweep-k", default=None, help="comma list of K: run each drafting method at every K")
    add_peer_args(p, "comma list of hf, hf-assisted, hf-lookup, llamacpp (llama.cpp plain and with the draft "
                  "model), llamacpp-plain, llamacpp-spec, llamacpp-lookup: other engines on the same weights")
    p.add_argument("--endpoint", default=None, help="also benchmark an OpenAI-compatible server at this URL")
    p.add_argument("--api-key", default=None, help="bearer token for --endpoint")
    p.add_argument("--served-model", default=None, help="model name to request from --endpoint (default: first listed)")
    p.add_argument("--out", required=True, help="folder for records.jsonl and the report")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished runs")
    p.add_argument("--overwrite", action="store_true", help="discard an earlier run in --out")
    p.add_argument("--max-prompts", type=int, default=None, help="stop after the first N prompts (resumable)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the unrecorded warm-up generation")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from --out's records")
    add_model_args(p)
    add_draft_args(p, default_method=None)  # --methods names them here
    add_sampling_args(p, max_tokens=128)
    p.set_defaults(func=run_bench_command)


def add_peer_args(p: argparse.ArgumentParser, peers_help: str, bare: str | None = None) -> None:
    """--peers and --llama-cpp (bench and profile). bare: what a --peers given without a value means."""
    p.add_argument("--peers", default=None, nargs="?" if bare else None, const=bare, help=peers_help)
    p.add_argument("--llama-cpp", default=None, metavar="DIR",
                   help="folder holding llama.cpp's binaries, for the llamacpp peers "
                   "(../shared/peers/build-llama-cpp.sh builds them)")


def parse_methods(spec: str | None) -> list[str]:
    """Method names from a comma list, checked against the proposer registry.

    A name may carry a weight format, `plain@bf16`: that contender runs on a
    target loaded with those weights (see --weights), so formats compare in one run.
    """
    from augury.models.loader import WEIGHT_FORMATS
    from augury.proposers import METHODS

    names = list(dict.fromkeys(s.strip() for s in (spec or "").split(",") if s.strip()))
    for name in names:
        method, _, weights = name.partition("@")
        if method != "plain" and method not in METHODS:
            raise AuguryError(f"unknown method '{method}' (choose from plain, {', '.join(sorted(METHODS))})")
        if weights and weights not in WEIGHT_FORMATS:
            raise AuguryError(f"unknown weights '{weights}' in '{name}' (choose from {', '.join(WEIGHT_FORMATS)})")
    return names


def parse_ks(spec: str | None, default: int) -> list[int]:
    from augury.engine import check_k

    if spec is None:
        return [default]
    try:
        ks = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise AuguryError(f"--sweep-k must be a comma list of integers, got '{spec}'") from None
    if not ks:
        raise AuguryError("--sweep-k is empty")
    return sorted(set(check_k(k) for k in ks))


def _check_report_deps() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AuguryError("the benchmark report needs matplotlib: pip install 'augury[bench]'") from None


def run_bench_command(args: argparse.Namespace) -> int:
    from augury.bench.report import console_summary, write_report
    from augury.bench.runner import check_out_dir
    from augury.files import check_writable

    out = Path(args.out)
    _check_report_deps()
    if args.report_only:
        summary = write_report(out)
        print(console_summary(summary))
        print(f"report: {out / 'summary.md'}, {out / 'report.html'}", file=sys.stderr)
        return 0

    # Everything a user can get wrong is checked before any model loads or any file is written.
    from augury.bench.endpoint import EndpointContender
    from augury.bench.llama_cpp import check_llama_cpp
    from augury.bench.peers import PEERS_WITH_DRAFT, parse_peers
    from augury.bench.suites import load_suite
    from augury.engine import check_k

    default = "" if args.endpoint else f"plain,{DEFAULT_METHOD}"
    methods = parse_methods(args.methods if args.methods is not None else default)
    drafting = list(dict.fromkeys(m.partition("@")[0] for m in methods if m.partition("@")[0] != "plain"))
    ks = parse_ks(args.sweep_k, args.k)
    check_k(args.k)
    peers = parse_peers(args.peers)
    check_llama_cpp(peers, args.llama_cpp)
    draft_peers = set(peers) & set(PEERS_WITH_DRAFT)
    if not methods and not args.endpoint:
        raise AuguryError("nothing to run: give --methods and/or --endpoint")
    if peers and not methods:
        raise AuguryError("--peers compare against augury's methods; give --methods too")
    if args.max_prompts is not None and args.max_prompts < 1:
        raise AuguryError("--max-prompts must be at least 1")
    if args.max_tokens < 1:
        raise AuguryError("--max-tokens must be at least 1")
    params = sampling_from_args(args)
    suite = load_suite(args.suite, args.data)
    if args.resume and args.overwrite:
        raise AuguryError("--resume continues the run in --out and --overwrite discards it: give one of them")
    check_out_dir(out, args.resume, args.overwrite)
    check_writable(out, "--out", folder=True)
    endpoint = None
    if args.endpoint:
        endpoint = EndpointContender(args.endpoint, args.api_key, args.served_model)
        endpoint.check()

    notes: list[str] = []
    contenders: list = []
    target = None
    from augury.proposers import METHODS
    from augury.proposers.options import DEFAULT_DRAFT, method_fields, split_options

    given = given_draft_options(args)
    draft_name = str(given.get("draft", DEFAULT_DRAFT))  # the draft model of the model-drafting peers
    readers = {m: METHODS[m].options for m in drafting}
    if draft_peers and not any("draft" in method_fields(cls) for cls in readers.values()):
        given = {k: v for k, v in given.items() if k != "draft"}  # --draft is the peers' alone here
    options = split_options(given, readers)
    if methods:
        target, contenders, draft_model = _build_local(args, methods, ks, options)
        if peers:
            from augury.bench.peers import build_peers

            if "hf-assisted" in peers:
                # augury's own drafter may hold int8 weights that transformers cannot run:
                # the peer gets the draft model as stored, in the run's dtype.
                from augury.models.loader import load_model

                draft_model = load_model(draft_name, dtype=args.dtype, device=args.device, offline=args.offline)
            draft_file = None
            if "llamacpp-spec" in peers:
                from augury.models.store import resolve

                draft_file = resolve(draft_name, offline=args.offline)
            n_ctx = min(target.config.context_length, LLAMA_CPP_MAX_CTX)
            contenders += build_peers(peers, target, draft_model, args.k, n_ctx, notes, llama_cpp=args.llama_cpp,
                                      draft_file=draft_file, chat=args.chat)
    if endpoint is not None:
        contenders.append(endpoint)

    from augury.bench.runner import BenchPlan, check_prompt_lengths, encode_messages

    plan = BenchPlan(
        prompts=suite.prompts,
        contenders=contenders,
        params=params,
        encode=partial(encode_messages, target.tokenizer, chat=args.chat) if target is not None else None,
        all_turns=args.turns == "all",
        settings={
            "model": args.model if target is not None else None,
            "draft": draft_name if (set(drafting) & set(DRAFT_MODEL_METHODS) or draft_peers) else None,
            "suite": args.suite,
            "data": str(suite.path.resolve()),
            "k": args.k if args.sweep_k is None else ks,
            "dtype": args.dtype if target is not None else None,
            "device": args.device if target is not None else None,
            "endpoint": f"{endpoint.base} ({endpoint.model})" if endpoint is not None else None,
            "chat": args.chat,
            "notes": notes,
        },
    )
    if target is not None:
        check_prompt_lengths(plan, target.config.context_length)
    for note in notes:
        print(f"augury: {note}", file=sys.stderr)
    try:
        run_and_report(
            plan, out, resume=args.resume, overwrite=args.overwrite, max_prompts=args.max_prompts,
            progress=args.progress, warmup=args.warmup,
        )
    except KeyboardInterrupt:
        print(f"augury: interrupted; finished runs are in {out / 'records.jsonl'} (resume with --resume)",
              file=sys.stderr)
        raise
    from augury.bench.report import load_summary

    summary = load_summary(out)
    print(console_summary(summary))
    print(f"report: {out / 'summary.md'}, {out / 'report.html'}", file=sys.stderr)
    return 0


def run_and_report(
    plan: BenchPlan,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    max_prompts: int | None = None,
    progress: bool = True,
    warmup: bool = True,
) -> int:
    """Run the benchmark (`runner.run_bench`), then write its report; return the runs finished now.

    Once runs have started the report is written however the run ends:
    max_prompts, Ctrl-C or an error leave a report marked INCOMPLETE, and the
    run's exception propagates after it. Bad settings raise before anything
    runs and leave no report behind.
    """
    from augury.bench.report import write_report
    from augury.bench.runner import prepare_run, run_bench

    todo = prepare_run(plan, out, resume=resume, overwrite=overwrite, max_prompts=max_prompts)
    try:
        finished = run_bench(plan, out, todo, progress=progress, warmup=warmup)
    except BaseException:
        try:
            write_report(out)
        except Exception as exc:  # noqa: BLE001 - the run's own exception is the one to show
            print(f"augury: could not write the report of the interrupted run: {exc}", file=sys.stderr)
        raise
    write_report(out)
    return finished


def _build_local(args: argparse.Namespace, methods: list[str], ks: list[int], options: dict[str, dict]):
    """Load the target once and each drafter once; one contender per (method, K)."""
    from augury.bench.runner import EngineContender
    from augury.models.loader import load_model
    from augury.proposers import build_proposer

    targets: dict[str | None, object] = {}

    def target_for(weights: str | None):
        if weights not in targets:
            targets[weights] = load_model(args.model, dtype=args.dtype, device=args.device, offline=args.offline,
                                          exact=args.exact, weights=weights)
        return targets[weights]

    target = target_for(args.weights)
    contenders = []
    draft_model = None
    for name in methods:
        method, _, weights = name.partition("@")
        on = target_for(weights or args.weights)
        proposer = build_proposer(method, on, options.get(method))
        if proposer is None:
            contenders.append(EngineContender(on, None, name, 0))
            continue
        if method == "model":
            draft_model = getattr(proposer, "model", None)
        contenders.extend(EngineContender(on, proposer, name, k, adaptive=not args.fixed_k) for k in ks)
    return target, contenders, draft_model
