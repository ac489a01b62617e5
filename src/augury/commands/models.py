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
        store.get_model(name, paths=False)
    for name in dict.fromkeys(args.names):
        path = store.pull(name, progress=not args.quiet, verify=args.verify)
        print(path)
    return 0


def _print_table(table: list[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell (the last one left ragged)."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    for r in table:
        cells = [cell.ljust(w) for cell, w in zip(r, widths)] + [r[-1]]
        print("  ".join(cells).rstrip())


def _families() -> None:
    """What a .gguf file or HF folder of one's own may be: the families and block types the loaders take."""
    from augury.kernels.reference import KINDS
    from augury.models.families import FAMILIES
    from augury.models.gguf import SUPPORTED_QUANTS

    print("\nYour own .gguf file or Hugging Face folder loads if it is one of these families:")
    table = [("FAMILY (GGUF)", "HF MODEL_TYPE", "C++ LAYER ON GGUF BLOCKS", "NOTES")]
    table += [(f.name, ", ".join(f.hf_types), f.native_layer, f.notes) for f in FAMILIES]
    _print_table(table)
    dequantized = sorted(SUPPORTED_QUANTS - set(KINDS))
    print(f"GGUF blocks on the kernel: {', '.join(KINDS)}; dequantized at load: {', '.join(dequantized)}")


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
    _print_table(table)
    _families()
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

    p = sub.add_parser("list", help="show known models, whether they are pulled, and the supported families")
    p.set_defaults(func=_list)

    p = sub.add_parser("rm", help="delete pulled models")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(func=_rm)

    p = sub.add_parser("path", help="print the local path of a pulled model")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=_path)
