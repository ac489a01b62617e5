"""Head files (written by `augury train`): one safetensors file whose header
metadata carries the JSON description (kind, config, target name and sha256,
training data, measured acceptance), so weights and description can never
disagree; `head.json` next to it is the same JSON for people and tools.
A head is refused for any target but the one it was trained for (by hash).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import Tensor

from augury.errors import AuguryError
from augury.files import write_atomic
from augury.models.head import KINDS, LAYER_PREFIX
from augury.models.loader import Model

FORMAT_VERSION = 1
META_KEY = "augury_head"
HEAD_FILE = "head.safetensors"
HEAD_JSON = "head.json"


def target_sha256(target: Model | Path) -> str:
    """sha256 of the target's weights file (a GGUF), or of a Hugging Face folder's config and weights.

    Cached per file path, size and modification time under $AUGURY_HOME/hashes,
    since a 1 GB file takes seconds to hash.
    """
    from augury.models.store import augury_home

    source = Path(target.source if isinstance(target, Model) else target).resolve()
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.is_file() and (p.suffix in (".safetensors", ".gguf")
                                                                        or p.name == "config.json"))
    else:
        files = [source]
    if not files:
        raise AuguryError(f"{source}: no model files to identify the target by")
    stamp = "|".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    cache = augury_home() / "hashes" / (hashlib.sha256(stamp.encode()).hexdigest()[:24] + ".txt")
    if cache.exists():
        return cache.read_text().strip()
    digest = hashlib.sha256()
    for p in files:
        if len(files) > 1:
            digest.update(p.name.encode() + b"\0")
        with p.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    value = digest.hexdigest()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, value.encode())
    except OSError:
        pass  # an unwritable cache only costs the next load a rehash
    return value


def save_head(folder: Path, own: dict[str, Tensor], vocab: Tensor, counts: Tensor, meta: dict,
              dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `folder/head.safetensors` (weights, vocab, description in the header) and `head.json`, atomically.

    meta must hold "kind", "config" (HeadConfig.to_dict) and "target" ({"name", "sha256", ...}).
    Norms stay fp32; matrices are stored in `dtype`.
    """
    from safetensors.torch import save

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t.float() if t.dim() == 1 else t.to(dtype)).contiguous() for name, t in own.items()}
    tensors["vocab"] = vocab.to(torch.int64).contiguous()
    tensors["vocab_counts"] = counts.to(torch.int64).contiguous()
    text = json.dumps({"format": FORMAT_VERSION, **meta}, indent=1, sort_keys=True)
    data = save(tensors, metadata={META_KEY: text})
    path = folder / HEAD_FILE
    write_atomic(path, data)
    write_atomic(folder / HEAD_JSON, text.encode())
    return path


def read_head(path: str | Path) -> tuple[dict, dict[str, Tensor]]:
    """(description, tensors) of a head file or folder; one clear AuguryError for anything unreadable."""
    from safetensors import SafetensorError, safe_open

    path = Path(path).expanduser()
    file = path / HEAD_FILE if path.is_dir() else path
    if not file.exists():
        raise AuguryError(f"head file {file} does not exist (train one with `augury train`)")
    try:
        with safe_open(str(file), framework="pt") as fh:
            meta_text = (fh.metadata() or {}).get(META_KEY)
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise AuguryError(f"head file {file} is corrupt or incomplete: {exc}") from None
    if meta_text is None:
        raise AuguryError(f"{file} is not an augury head file (no '{META_KEY}' description in its header)")
    try:
        meta = json.loads(meta_text)
    except json.JSONDecodeError as exc:
        raise AuguryError(f"head file {file} has a corrupt description: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise AuguryError(f"head file {file} has format {meta.get('format') if isinstance(meta, dict) else '?'}, "
                          f"this augury reads format {FORMAT_VERSION}")
    for field in ("target", "config"):  # read as objects of settings further on
        if not isinstance(meta.get(field, {}), dict):
            raise AuguryError(f"head file {file} has a malformed description: its '{field}' is not an object")
    kind = meta.get("kind")
    if kind not in KINDS:
        raise AuguryError(f"head file {file} is of unknown kind '{kind}' (known: {', '.join(KINDS)})")
    for name in ("fc", "state_norm", "token_norm", "vocab", LAYER_PREFIX + "wqkv"):
        if name not in tensors:
            raise AuguryError(f"head file {file} is incomplete: no tensor '{name}'")
    return meta, tensors


def check_target(meta: dict, target: Model, file: str | Path) -> None:
    """Refuse a head trained for another target: by file hash, then by shape."""
    want = (meta.get("target") or {}).get("sha256")
    have = target_sha256(target)
    if want != have:
        trained = (meta.get("target") or {}).get("name", "?")
        raise AuguryError(
            f"head {file} was trained for target '{trained}' (sha256 {str(want)[:12]}...), "
            f"not for '{target.name}' (sha256 {have[:12]}...); train one for this target with `augury train`"
        )
