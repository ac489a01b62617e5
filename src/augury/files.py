"""Files written so that a reader sees the old one or the whole new one, never a part."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


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
