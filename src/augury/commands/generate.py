"""`augury generate`: stream a completion, plain or speculative; `augury demo`: the showcase run."""

from __future__ import annotations

import argparse
import sys

from augury.commands.common import (
    add_draft_args,
    add_model_args,
    add_sampling_args,
    load_from_args,
    sampling_from_args,
)
from augury.errors import AuguryError

DEMO_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a short docstring."


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text (speculative by default)",
        description="Generate a completion, streaming text as tokens are committed. Greedy output is "
        "token-identical to plain decoding; sampled output has exactly the target's distribution.",
    )
    p.add_argument("prompt", nargs="?", help="prompt text ('-' or omitted: read stdin)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    add_model_args(p)
    add_draft_args(p)
    add_sampling_args(p)
    p.set_defaults(func=run_generate)

    d = subparsers.add_parser(
        "demo",
        help="speculative vs plain decoding on a sample prompt with the default models",
        description="Pulls the default target/draft pair if needed, runs plain and speculative greedy "
        "decoding on one prompt, and prints the text, speed-up, the draft length the planner settled on and "
        "why, tau and acceptance.",
    )
    d.add_argument("--prompt", default=DEMO_PROMPT)
    d.add_argument("--max-tokens", type=int, default=128)
    d.add_argument("--k", type=int, default=4)
    d.add_argument("--offline", action="store_true")
    d.add_argument("--runs", type=_positive_int, default=2,
                   help="speculative and plain runs, alternating; the fastest of each is compared (a shared "
                   "machine's speed drifts between runs)")
    d.set_defaults(func=run_demo)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def check_utf8(text: str | None, what: str) -> None:
    """Text from argv or stdin that was not UTF-8 arrives with its bytes as lone surrogates, which no
    tokenizer takes: say so in one line."""
    try:
        (text or "").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise AuguryError(f"{what} is not valid UTF-8 text (a byte 0x{ord(exc.object[exc.start]) & 0xFF:02x} "
                          f"at character {exc.start})") from None


def run_generate(args: argparse.Namespace) -> int:
    from augury.api import load
    from augury.step import check_k

    params = sampling_from_args(args)
    if args.draft_method != "plain":
        check_k(args.k)
    if args.system is not None and not args.chat:
        raise AuguryError("--system is the chat template's system message: it needs --chat")
    prompt = args.prompt
    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    if not prompt:
        raise AuguryError("empty prompt: give it as an argument or on stdin")
    for what, text in (("the prompt", prompt), ("--system", args.system), *(("--stop", s) for s in args.stop)):
        check_utf8(text, what)
    llm = load_from_args(args, load)
    ids = llm.encode(prompt, chat=args.chat, system=args.system)
    result = llm.generate_ids(ids, params, on_text=lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    sys.stdout.write("\n")
    print(f"[{args.draft_method}] {result.stats.summary()} finish={result.finish_reason}", file=sys.stderr)
    if llm.last_plan is not None:
        print(f"[{args.draft_method}] {llm.last_plan.line()}", file=sys.stderr)
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from augury.api import load
    from augury.commands.profile import kernel_path
    from augury.engine import Engine
    from augury.models.store import DEFAULT_DRAFT, DEFAULT_TARGET
    from augury.proposers.hybrid import HybridProposer
    from augury.proposers.options import DEFAULT_METHOD, ModelOptions
    from augury.proposers.suffix import SuffixProposer
    from augury.sampling import SamplingParams

    if not args.prompt.strip():
        raise AuguryError("empty --prompt: give the demo something to answer")
    check_utf8(args.prompt, "--prompt")
    options = ModelOptions(draft=DEFAULT_DRAFT, offline=args.offline)
    llm = load(DEFAULT_TARGET, draft_method=DEFAULT_METHOD, k=args.k, offline=args.offline, draft=options.draft)
    target, proposer = llm.target, llm.proposer
    ids = llm.encode(args.prompt, chat=True)
    params = SamplingParams(max_tokens=args.max_tokens)
    print(
        f"target {DEFAULT_TARGET} ({kernel_path(target)}), drafts by the {DEFAULT_METHOD} method: the suffix matcher "
        f"where its kind of draft is accepted as often as the draft model's, else {DEFAULT_DRAFT} "
        f"({options.draft_quant} weights, stops below confidence {proposer.model.confidence}); K up to {args.k} "
        f"chosen per step from measured costs, greedy\nprompt: {args.prompt}\n"
    )
    specs, plains, engines, parts = [], [], [], []
    for run in range(args.runs):  # alternating, so that a slow spell of the machine hits both alike
        # A new matcher each run, the loaded draft model shared: the matcher's corpus of earlier outputs
        # would have every run after the first copy the first one's answer (docs/benchmarks.md 21c).
        parts.append(HybridProposer(SuffixProposer(proposer.matcher.ngram_min), proposer.model,
                                    proposer.min_match_tokens))
        engines.append(Engine(target, parts[-1], k=args.k, adaptive=True))
        shown = (lambda text: (sys.stdout.write(text), sys.stdout.flush())) if run == 0 else None
        specs.append(engines[-1].generate(ids, params, on_text=shown))
        if run == 0:
            print("\n")
        print(f"plain decoding of the same prompt for comparison ({run + 1} of {args.runs}) ...", flush=True)
        plains.append(Engine(target).generate(ids, params))
    best = max(range(args.runs), key=lambda i: specs[i].stats.tokens_per_s)
    spec, engine = specs[best], engines[best]
    plain = max(plains, key=lambda r: r.stats.tokens_per_s)
    s, p = spec.stats, plain.stats
    ratio = s.tokens_per_s / max(p.tokens_per_s, 1e-9)
    of = f", the fastest of {args.runs} runs" if args.runs > 1 else ""
    print(f"plain       : {p.tokens_per_s:.2f} tok/s ({p.generated_tokens} tokens{of})")
    print(f"speculative : {s.tokens_per_s:.2f} tok/s ({s.generated_tokens} tokens{of})")
    note = engine.last_plan
    if note is not None and note.settled_k == 0:  # plain steps both ways: any ratio is run-to-run noise
        print(f"speed-up    : none: the planner settled on plain steps (measured {ratio:.2f}x: its warm-up "
              "drafts and run-to-run noise)")
    elif ratio >= 1.0:
        print(f"speed-up    : {ratio:.2f}x")
    else:  # a loss is not a speed-up: say so, and why
        print(f"speed-up    : none: speculation ran at {ratio:.2f}x plain on this machine for this prompt")
    if note is not None:
        print(note.line())
        if note.settled_k == 0:
            print("the planner found that no draft length pays here (a drafted token costs more than its "
                  "expected acceptance saves), so it decoded plain steps, trying a draft now and then")
    print(f"tau {s.tau:.2f} tokens per target forward, acceptance {s.alpha:.2f} "
          f"(by position {' '.join(f'{a:.2f}' for a in s.acceptance_by_position)}); planned drafts by the matcher "
          f"{parts[best].matcher_drafts}, by the model {parts[best].model_drafts}")
    same = all(r.token_ids == plain.token_ids for r in specs + plains)
    print(f"identical to plain greedy output: {'yes' if same else 'NO'}")
    return 0 if same else 1
