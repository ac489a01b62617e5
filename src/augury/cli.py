"""`augury` command line: generate | models | bench | serve."""

from __future__ import annotations

import argparse
import importlib
import sys

from augury.errors import AuguryError

# Each subcommand lives in augury.commands.<name> and exposes register(subparsers),
# which adds its parser and sets `func` to a callable taking the parsed args.
SUBCOMMANDS = ("generate", "models", "bench", "serve", "profile", "calibrate", "loadtest", "train")  # generate also registers demo, train export-head


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="augury", description="Lossless speculative decoding for LLMs."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"augury.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"augury.commands.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except AuguryError as exc:
        print(f"augury: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("augury: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
