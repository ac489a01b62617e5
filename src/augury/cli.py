"""`augury` command line: generate | models | bench | serve."""

from __future__ import annotations

import argparse
import importlib
import os
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
    try:
        args = build_parser().parse_args(argv)  # inside: Ctrl-C while the subcommands import is an interrupt too
        result = args.func(args)
        sys.stdout.flush()  # a closed pipe or a full disk shows here, in the handlers below, not at exit
    except AuguryError as exc:
        print(f"augury: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("augury: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`augury generate ... | head`): nothing left to say
        _quiet_stdout()
        return 141
    except OSError as exc:  # a file or folder the command was given or writes to (a full disk, /proc/x)
        _quiet_stdout()
        print(f"augury: error: {exc}", file=sys.stderr)
        return 1
    return int(result or 0)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's flush at exit cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind stdout
        pass


if __name__ == "__main__":
    sys.exit(main())
