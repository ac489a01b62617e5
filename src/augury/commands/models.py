"""`augury models pull|list|rm|path`: manage the local model cache.

A thin layer over :mod:`augury.models.store`; every user mistake surfaces as an
AuguryError, which the CLI prints as one line.
"""

from __future__ import annotations

import argparse
import sys

from augury.models import store


def _pull(args: argparse.Namespace) -> int:
    # Check every name before downloading anything, so a typo in the last name
    # does not surface only after gigabytes of downloads.
    for name in args.names:
        store.get_model(name)
    for name in dict.fromkeys(args.names):
        path = store.pull(name, progress=not args.quiet, verify=args.verify)
        print(path)
    return 0


def _list(args: argparse.Namespace) -> int:
    rows = store.list_models()
    table = [("NAME", "ARCH", "SIZE", "PULLED", "PATH")]
    for row in rows:
        table.append((
            row.name,
            row.architecture,
            store.format_size(row.size_bytes),
            "yes" if row.pulled else "no",
            str(row.path) if row.pulled else "-",
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    for r in table:
        cells = [cell.ljust(w) for cell, w in zip(r, widths)] + [r[-1]]
        print("  ".join(cells).rstrip())
    return 0


def _rm(args: argparse.Namespace) -> int:
    for name in args.names:
        if store.remove(name):
            print(f"removed {name}")
        else:
            print(f"{name} is not pulled; nothing to remove", file=sys.stderr)
    return 0


def _path(args: argparse.Namespace) -> int:
    # Offline on purpose: `path` is for scripts and should never start a download.
    print(store.resolve(args.name, offline=True))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `models` command and its subcommands to the top-level parser."""
    parser = subparsers.add_parser(
        "models", help="pull, list and remove known models",
        description="Manage the model cache under $AUGURY_HOME (default ~/.cache/augury).",
    )
    sub = parser.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    sub.required = True

    p = sub.add_parser("pull", help="download and verify known models")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.add_argument("--verify", action="store_true",
                   help="re-hash models that are already pulled")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_pull)

    p = sub.add_parser("list", help="show known models and whether they are pulled")
    p.set_defaults(func=_list)

    p = sub.add_parser("rm", help="delete pulled models")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(func=_rm)

    p = sub.add_parser("path", help="print the local path of a pulled model")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=_path)
