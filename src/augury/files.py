"""Files written so that a reader sees the old one or the whole new one, never a part; and a check that
an output path can be written at all, made before the work that fills it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from augury.errors import AuguryError


def replace_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) fills a temporary file next to `path`, which is then synced and renamed onto it
    (for writers that take a file name, such as safetensors' save_file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes so that readers see the old file or the whole new one (tmp + fsync + rename)."""
    replace_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_json_atomic(path: Path, value: object) -> None:
    """`value` as indented JSON, atomically."""
    write_atomic(path, (json.dumps(value, indent=1) + "\n").encode())


def check_writable(path: Path, what: str, *, folder: bool = False) -> None:
    """A one-line error, before any long work, where `path` (a file, or a folder with folder=True) could
    not be written: a calibration or a load test that ran for minutes and then died on its --out lost
    everything. Creates the missing parent folders (the command would create them anyway)."""
    path = Path(path)
    if folder:
        if path.exists() and not path.is_dir():
            raise AuguryError(f"{what} {path} is a file, not a folder")
        parent = path
    else:
        if path.is_dir():
            raise AuguryError(f"{what} {path} is a folder; give a file name")
        parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AuguryError(f"{what} {path}: cannot create {parent} ({exc.strerror or exc})") from None
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise AuguryError(f"{what} {path} is not writable")
