"""Arguments shared by generate, bench and serve: model, drafter, sampling."""

from __future__ import annotations

import argparse

from augury.errors import AuguryError
from augury.models.store import DEFAULT_TARGET
from augury.proposers.options import DEFAULT_METHOD
from augury.sampling import GREEDY_BELOW, SamplingParams


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", "-m", default=DEFAULT_TARGET, help=f"target model name or path (default {DEFAULT_TARGET})")
    g.add_argument("--dtype", default="bf16", help="bf16 (default, fast on CPUs with AMX/AVX-512), fp16 or fp32")
    g.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    g.add_argument("--offline", action="store_true", help="never download: use only models already pulled")
    g.add_argument("--weights", default=None, choices=("gguf", "bf16"),
                   help="gguf: multiply a GGUF file's own low-bit blocks (default on CPUs where augury's kernel "
                   "builds); bf16: dequantize them to --dtype (the path for safetensors models too)")
    g.add_argument(
        "--no-exact",
        dest="exact",
        action="store_false",
        help="skip the batch-invariant padding (bf16 speculative output may then differ from plain at near-ties)",
    )


def add_draft_args(parser: argparse.ArgumentParser, *, default_method: str | None = DEFAULT_METHOD) -> None:
    """--draft-method (unless default_method is None), --k, and every method's own options.

    Each option is one flag, listed in --help under the methods that read it;
    a flag the chosen method does not read is refused when the proposer is
    built (see proposers/options.py).
    """
    from augury.proposers import METHODS, method_names
    from augury.proposers.options import flag, method_fields

    g = parser.add_argument_group("drafting")
    if default_method is not None:
        g.add_argument("--draft-method", default=default_method,
                       help=f"plain (no speculation) or one of: {', '.join(method_names()[1:])} "
                       f"(default {default_method})")
    g.add_argument("--k", type=int, default=4, action=_Given,
                   help="draft length K: tokens proposed per step at most (default 4)")
    g.add_argument("--fixed-k", action="store_true",
                   help="always draft --k tokens (default: K or a plain step per step, from measured costs)")
    readers: dict[str, list[str]] = {}
    for name, method in METHODS.items():
        for field_name in method_fields(method.options):
            readers.setdefault(field_name, []).append(name)
    groups: dict[tuple[str, ...], argparse._ArgumentGroup] = {}
    for field_name, names in readers.items():
        key = tuple(names)
        if key not in groups:
            groups[key] = parser.add_argument_group(f"drafting options of {', '.join(names)}")
        fields = [method_fields(METHODS[n].options)[field_name] for n in names]
        defaults = {n: f.default for n, f in zip(names, fields)}
        if len(set(map(repr, defaults.values()))) == 1:
            shown = f"default {fields[0].default}"
        else:
            shown = "default " + ", ".join(f"{v} for {n}" for n, v in defaults.items())
        groups[key].add_argument(flag(field_name), dest=f"opt_{field_name}", type=fields[0].metadata["type"],
                                 default=argparse.SUPPRESS, help=f"{fields[0].metadata['help']} ({shown})")


class _Given(argparse.Action):
    """Stores the value and notes that the flag was given (`args.given_flags`): a default cannot be told
    from the same value typed."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given_flags = {*getattr(namespace, "given_flags", ()), option_string}


def given_draft_options(args: argparse.Namespace) -> dict[str, object]:
    """The method options given on the command line (flags left out are absent), plus the load options."""
    given = {name[4:]: value for name, value in vars(args).items() if name.startswith("opt_")}
    return {**given, "dtype": args.dtype, "device": args.device, "offline": args.offline}


def add_sampling_args(parser: argparse.ArgumentParser, *, max_tokens: int = 256) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--temperature", "-t", type=float, default=0.0,
                   help=f"0 (or below {GREEDY_BELOW:g}) = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * max probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    g.add_argument("--coupling", default="auto", choices=("auto", "coupled", "rejection"),
                   help="seeded sampling: coupled (the same text with or without speculation; auto picks it) or "
                   "rejection sampling")
    g.add_argument("--max-tokens", "-n", type=int, default=max_tokens,
                   help=f"tokens to generate at most, per turn (default {max_tokens})")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        coupling=args.coupling,
    )


def load_from_args(args: argparse.Namespace, load):
    """`augury.load` with the model, drafting and method-option flags (generate and serve load alike)."""
    if args.draft_method == "plain":
        given = {"--k": "--k" in getattr(args, "given_flags", ()), "--fixed-k": args.fixed_k}
        unread = [name for name, was_given in given.items() if was_given]
        if unread:
            raise AuguryError(f"{' and '.join(unread)} {'is' if len(unread) == 1 else 'are'} not "
                              f"{'an option' if len(unread) == 1 else 'options'} of plain decoding (it drafts nothing)")
    options = {k: v for k, v in given_draft_options(args).items() if k not in ("dtype", "device", "offline")}
    return load(args.model, draft_method=args.draft_method, k=args.k, dtype=args.dtype, device=args.device,
                offline=args.offline, exact=args.exact, weights=args.weights, adaptive=not args.fixed_k, **options)
