"""`augury profile`: verification cost curve per weight format, bandwidth floor, plain tok/s, peers beside it."""

from __future__ import annotations

import argparse
import gc
import inspect
import sys

from augury.commands.common import add_model_args
from augury.errors import AuguryError

PROMPT = "Write a Python class for a bank account with deposit, withdraw and balance methods, with docstrings."
PROFILE_PEERS = ("hf", "llamacpp")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile",
        help="forward cost of 1..32 new tokens per weight format, bandwidth floor, plain tok/s (vs peers)",
        description="Measures the cost of verifying T tokens in one forward after a fixed context, for each "
        "weight format asked for, the floor of a decode step (weight bytes / read bandwidth), and plain "
        "decoding speed, next to transformers' generate and llama.cpp's llama-bench on the same weights. "
        "Each curve is saved beside the model's converted weights, where the planner reads it. "
        "Run it alone: it is a benchmark.",
    )
    add_model_args(p)
    add_profile_args(p)
    p.set_defaults(func=run)


def add_profile_args(p: argparse.ArgumentParser) -> None:
    """The profile's own flags (and --peers/--llama-cpp, shared with bench)."""
    from augury.commands.bench import add_peer_args

    p.add_argument("--context", type=int, default=512, help="cached tokens before the block (default 512)")
    p.add_argument("--rows", default="1,2,4,5,6,8,16,32", help="block sizes to time (default 1,2,4,5,6,8,16,32)")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens for the tok/s measurement (default 64)")
    add_peer_args(p, "comma list of hf (transformers' generate on the same weights) and llamacpp "
                  "(llama-bench's prompt processing of the same row counts at the same depth; needs --llama-cpp); "
                  "--peers alone means hf", bare="hf")
    weights_help = "comma list of weight formats to profile one after the other, e.g. gguf,bf16 (default: as loaded)"
    existing = next((a for a in p._actions if "--weights" in a.option_strings), None)
    if existing is None:
        p.add_argument("--weights", default=None, help=weights_help)
    else:  # the model flags may name one format; here it takes a list
        existing.choices, existing.type, existing.help = None, None, weights_help


def _parse_list(value: str | None, flag: str, choices: tuple[str, ...] | None = None) -> list[str]:
    items = [s.strip() for s in (value or "").split(",") if s.strip()]
    for item in items:
        if choices is not None and item not in choices:
            raise AuguryError(f"unknown {flag} '{item}' (choose from {', '.join(choices)})")
    return list(dict.fromkeys(items))


def run(args: argparse.Namespace) -> int:
    import torch

    from augury.bench.forward import ProfileReport, profile, read_bandwidth_gbs
    from augury.bench.llama_cpp import gguf_file, llama_bench_ms, llama_cpp_binary
    from augury.costs import save_cost_curve
    from augury.models.decoder import weight_kinds
    from augury.models.loader import load_model
    from augury.models.store import resolve
    from augury.models.tokenizer import build_prompt_ids

    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        raise AuguryError(f"--rows must be a comma list of integers, got {args.rows!r}") from None
    if any(r < 1 or r > 64 for r in rows):
        raise AuguryError(f"--rows must lie in 1..64, got {args.rows!r}")
    if args.context < 1:
        raise AuguryError(f"--context must be at least 1, got {args.context}")
    if args.decode_tokens < 1:
        raise AuguryError(f"--decode-tokens must be at least 1, got {args.decode_tokens}")
    peers = _parse_list(args.peers, "peer", PROFILE_PEERS)
    formats: list[str | None] = list(_parse_list(args.weights, "weights")) or [None]
    if formats != [None] and "weights" not in inspect.signature(load_model).parameters:
        raise AuguryError("--weights needs augury's native GGUF weights, which this installation lacks")
    bench_binary = gguf = None
    if "llamacpp" in peers:  # checked before anything is measured
        bench_binary = llama_cpp_binary(args.llama_cpp, "llama-bench")
        gguf = gguf_file(resolve(args.model, offline=args.offline), "target")

    spread: dict[str, tuple[float, float, float]] = {}
    bandwidth = read_bandwidth_gbs(spread=spread)
    paths = []
    profiles = []
    for fmt in formats:
        model = load_model(args.model, dtype=args.dtype, device=args.device, offline=args.offline, exact=args.exact,
                           **({"weights": fmt} if fmt is not None else {}))
        if args.context + max(rows) >= model.config.context_length:
            raise AuguryError(
                f"--context {args.context} does not fit the model's context {model.config.context_length}"
            )
        label = fmt or "/".join(sorted(set(weight_kinds(model.decoder.weights))))
        prompt = build_prompt_ids(model.tokenizer, PROMPT, chat=model.tokenizer.meta.chat_template is not None)
        result = profile(model, label, context=args.context, rows=rows, decode_tokens=args.decode_tokens,
                         prompt_ids=prompt, transformers="hf" in peers)
        path = save_cost_curve(model, result.rows_ms, context=args.context, weight_bytes=result.weight_bytes,
                               floor_ms=result.floor_ms(max(bandwidth.values())))
        print(f"augury: the {label} cost curve is saved in {path}", file=sys.stderr)
        profiles.append(result)
        paths.append(f"{label}: {kernel_path(model)}")
        del model  # one model in memory at a time
        gc.collect()
    llama_ms = None
    if bench_binary is not None:
        llama_ms = llama_bench_ms(bench_binary, gguf, rows, depth=args.context, threads=torch.get_num_threads())
    print(f"model {args.model} ({args.dtype}, exact={args.exact}, {torch.get_num_threads()} threads)")
    print(ProfileReport(bandwidth, profiles, llama_ms, spread, "; ".join(paths)).markdown())
    return 0


def kernel_path(model) -> str:
    """Which code runs a model's decode steps: the kernel's instruction set, and whether the C++ layer runs."""
    import os

    from augury.kernels.extension import ISA_ENV, extension, kernel_isa
    from augury.kernels.weight import GgufWeight

    if not any(isinstance(getattr(layer, "wqkv", None), GgufWeight) for layer in model.decoder.weights.layers):
        return "no GGUF blocks (torch matmuls)"
    forced = os.environ.get(ISA_ENV)
    runs = extension().available_isas() if extension() is not None else []
    layer = "C++ layer" if model.decoder.native is not None else "torch layer"
    return (f"{kernel_isa()} kernel, {layer} ({ISA_ENV}={forced} forced it" if forced else
            f"{kernel_isa()} kernel, {layer} (the best of: {', '.join(runs) or 'none'}") + ")"
