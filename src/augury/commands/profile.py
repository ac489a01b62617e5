"""`augury profile`: verification cost curve, bandwidth floor, plain tok/s vs transformers."""

from __future__ import annotations

import argparse

from augury.commands.common import add_model_args
from augury.errors import AuguryError

PROMPT = "Write a Python class for a bank account with deposit, withdraw and balance methods, with docstrings."


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile",
        help="forward cost of 1..32 new tokens, bandwidth floor, plain tok/s (vs transformers)",
        description="Measures the cost of verifying T tokens in one forward after a fixed context, the floor "
        "of a decode step (weight bytes / read bandwidth), and plain decoding speed next to transformers' "
        "generate on the same weights. Run it alone: it is a benchmark.",
    )
    add_model_args(p)
    p.add_argument("--context", type=int, default=512, help="cached tokens before the block (default 512)")
    p.add_argument("--rows", default="1,2,4,8,16,32", help="block sizes to time (default 1,2,4,8,16,32)")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens for the tok/s measurement (default 64)")
    p.add_argument("--peers", action="store_true", help="also time transformers' generate on the same weights")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from augury.bench.forward import profile
    from augury.commands.generate import build_prompt_ids
    from augury.models.loader import load_model

    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        raise AuguryError(f"--rows must be a comma list of integers, got {args.rows!r}") from None
    if any(r < 1 or r > 64 for r in rows) or args.context < 1:
        raise AuguryError("--rows must lie in 1..64 and --context must be positive")
    model = load_model(args.model, dtype=args.dtype, device=args.device, offline=args.offline, exact=args.exact)
    if args.context + max(rows) >= model.config.context_length:
        raise AuguryError(f"--context {args.context} does not fit the model's context {model.config.context_length}")
    prompt = build_prompt_ids(model.tokenizer, PROMPT, chat=model.tokenizer.meta.chat_template is not None)
    result = profile(
        model, context=args.context, rows=rows, decode_tokens=args.decode_tokens, prompt_ids=prompt, peers=args.peers
    )
    print(f"model {args.model} ({args.dtype}, exact={args.exact})")
    print(result.markdown())
    return 0
