"""Load a model by name or path, converting once and caching the result.

A GGUF holds block-quantized weights that must be dequantized before torch can
use them (tens of seconds for 1.5B parameters). The converted weights, config
and tokenizer are cached under `$AUGURY_HOME/converted/<file>-<key>/` as
safetensors in the requested dtype, so a second load is a plain file read.
The cache key covers the source file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from augury.errors import AuguryError
from augury.files import replace_atomic
from augury.models.decoder import (
    LINEAR_FIELDS,
    Decoder,
    LayerWeights,
    ModelConfig,
    OneDnnWeight,
    Weights,
    onednn_packing_available,
    pack_weights,
)
from augury.models.tokenizer import Tokenizer

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise AuguryError(f"unknown dtype '{name}' (choose from bf16, fp16, fp32)") from None


def parse_device(name: str | torch.device) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise AuguryError(f"unknown device '{name}' (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AuguryError("device 'cuda' requested but no CUDA device is available")
    return device


@dataclass
class Model:
    """A loaded model: the decoder, its tokenizer, and where it came from."""

    name: str
    decoder: Decoder
    tokenizer: Tokenizer
    source: Path

    @property
    def config(self) -> ModelConfig:
        return self.decoder.config


def weights_from_flat(flat: dict[str, torch.Tensor], config: ModelConfig) -> Weights:
    """Build `Weights` from augury's flat tensor names ("embed", "layers.3.wqkv", ...)."""
    layers = []
    for i in range(config.num_layers):
        prefix = f"layers.{i}."
        fields = {name[len(prefix) :]: t for name, t in flat.items() if name.startswith(prefix)}
        layers.append(LayerWeights(**fields))
    embed = flat["embed"]
    return Weights(
        embed=embed,
        final_norm=flat["final_norm"],
        # A native GGUF load keeps a tied head as its own (block) weight next to the embedding copy.
        lm_head=flat["lm_head"] if "lm_head" in flat else embed,
        layers=layers,
    )


SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, each read straight into the process's own memory.

    safetensors' `load_file` maps the file: mapped pages count towards the
    process's memory once touched, and matmuls over page-cache pages ran about
    1.4x slower here than over the same bytes in private memory, so the loads
    used to copy every tensor out of the mapping, holding the model twice at
    the peak (13.6 GB for the 1.5B in fp32). Reading each tensor into its own
    buffer keeps the peak at the model's size.
    """
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
        header.pop("__metadata__", None)
        tensors = {}
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            start, end = entry["data_offsets"]
            tensor = torch.empty(entry["shape"], dtype=SAFETENSORS_DTYPES[entry["dtype"]])
            if tensor.numel() * tensor.element_size() != end - start:
                raise AuguryError(f"{path}: tensor {name} has {end - start} bytes for shape {entry['shape']}")
            fh.seek(8 + size + start)
            if tensor.numel() and fh.readinto(tensor.view(-1).view(torch.uint8).numpy()) != end - start:
                raise AuguryError(f"{path} is truncated (tensor {name})")
            tensors[name] = tensor
    return tensors


def _cache_dir(source: Path, home: Path) -> Path:
    stat = source.stat()
    if source.is_dir():
        parts = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in source.iterdir() if p.is_file())
        key_src = f"{source.resolve()}|{parts}"
    else:
        key_src = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    return home / "converted" / f"{source.name}-{key}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _convert(source: Path, dtype: torch.dtype, progress: bool) -> tuple[ModelConfig, Tokenizer, dict]:
    if source.is_dir():
        from augury.models import hf

        config = hf.read_config(source)
        return config, hf.read_tokenizer(source), hf.read_weights(source, config, dtype)
    from augury.models import gguf

    reader = gguf.open_gguf(source)
    config = gguf.read_config(reader, source)
    tokenizer = gguf.read_tokenizer(source)
    flat = _read_with_progress(reader, f"converting {source.name}", progress,
                               lambda update: gguf.read_weights(reader, config, source, dtype, progress=update))
    return config, tokenizer, flat


def _read_with_progress(reader, desc: str, progress: bool, read):
    """read(update) under a byte progress bar over the GGUF's tensors (or none)."""
    if not progress:
        return read(None)
    from tqdm import tqdm

    total = sum(int(t.n_bytes) for t in reader.tensors)
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr) as bar:
        return read(bar.update)


def _save_atomic(folder: Path, config: ModelConfig, tokenizer: Tokenizer, flat: dict, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
    tokenizer.save(folder)
    replace_atomic(folder / f"weights-{_dtype_name(dtype)}.safetensors", lambda tmp: save_file(flat, str(tmp)))


def _padding(weights: Weights, dtype: torch.dtype, device: torch.device, cached: Path | None, exact: bool):
    """The batch-invariant row padding for these weights on this machine: measured once, cached with the model."""
    if not exact or device.type != "cpu":
        return None  # the decoder pads nothing then
    from augury.calibration import NO_PADDING, load_or_calibrate, machine_key
    from augury.models.decoder import LINEAR_FIELDS, measure_padding, weight_kinds

    mats = [getattr(layer, name) for layer in weights.layers for name in LINEAR_FIELDS] + [weights.lm_head]
    if all(getattr(m, "invariant_rows", 0) == 1 for m in mats):
        # Every matmul gives a row its bits at any row count (GGUF blocks on the kernel): nothing to pad
        # and nothing to time (timing alone once picked 2 rows for 1 on a tiny model: the first count
        # timed paid a warm-up).
        return NO_PADDING
    key = machine_key(dtype, weight_kinds(weights))
    path = cached / f"padding-{key}.json" if cached is not None else None
    padding = load_or_calibrate(path, key, lambda: measure_padding(weights, dtype))
    if padding.checked_rows < 8:
        print(f"augury: note: matmuls on this machine keep each row's bits only up to {padding.checked_rows} rows; "
              "longer blocks run in pieces (exact, but verification costs more)", file=sys.stderr)
    return padding


WEIGHT_FORMATS = ("gguf", "bf16")


def resolve_weights(weights: str | None, source: Path, dtype: torch.dtype, device: torch.device) -> str:
    """Which weight path a load takes: "gguf" (the file's own blocks, `GgufWeight`) or "bf16" (dequantized).

    Unset, a .gguf file on CPU in bf16 or fp32 (the activations' type: the
    blocks stay the file's) takes "gguf" where the kernel builds and runs
    here, everything else "bf16" (the dequantized path in `dtype`, the name
    kept for the CLI flag; a GGUF dequantized for its dtype says so in one line). Asked for, "gguf" needs a .gguf file and
    the CPU; without the kernel it runs on the (slow) torch fallback.
    """
    if weights is not None and weights not in WEIGHT_FORMATS:
        raise AuguryError(f"unknown weights '{weights}' (choose from {', '.join(WEIGHT_FORMATS)})")
    is_gguf = source.is_file() and source.suffix == ".gguf"
    if weights == "gguf":
        if not is_gguf:
            raise AuguryError(f"weights 'gguf' needs a .gguf file, but {source} is not one (use weights 'bf16')")
        if device.type != "cpu":
            raise AuguryError(f"weights 'gguf' runs on the CPU only, not on {device}")
        return "gguf"
    if weights == "bf16" or not is_gguf or device.type != "cpu":
        return "bf16"
    if dtype not in (torch.bfloat16, torch.float32):
        name = next((k for k, v in DTYPES.items() if v == dtype), str(dtype))
        print(f"augury: {source.name} in {name} has no native GGUF path: its weights are dequantized to {name} "
              "(--dtype bf16 or fp32 keeps the file's blocks)", file=sys.stderr)
        return "bf16"
    from augury.kernels.extension import extension

    return "gguf" if extension() is not None else "bf16"


def _native_cache_name(dtype: torch.dtype) -> str:
    """File name of cached repacked weights: keyed by the kernel layout's source, which defines the bytes."""
    from augury.kernels import packing

    key = hashlib.sha256(Path(packing.__file__).read_bytes()).hexdigest()[:12]
    return f"native-{key}-{_dtype_name(dtype)}"


def _save_native(folder: Path, config: ModelConfig, tokenizer: Tokenizer, flat: dict, dtype: torch.dtype) -> None:
    """Cache a native load: packed block buffers and plain tensors in one safetensors file, part lists in json."""
    from safetensors.torch import save_file

    from augury.kernels.weight import GgufWeight

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
    tokenizer.save(folder)
    tensors, index = {}, {}
    for name, value in flat.items():
        if isinstance(value, GgufWeight):
            index[name] = {"in": value.shape[1], "parts": [[p.kind, p.rows] for p in value.parts]}
            for k, part in enumerate(value.parts):
                tensors[f"{name}.part{k}"] = part.data
        else:
            tensors[name] = value
    base = folder / _native_cache_name(dtype)
    replace_atomic(base.with_suffix(".safetensors"), lambda tmp: save_file(tensors, str(tmp)))
    base.with_suffix(".json").write_text(json.dumps(index))


def _load_native(folder: Path, dtype: torch.dtype) -> dict | None:
    """A cached native load, or None if there is none."""
    from augury.kernels.weight import GgufWeight

    base = folder / _native_cache_name(dtype)
    if not base.with_suffix(".json").exists() or not base.with_suffix(".safetensors").exists():
        return None
    index = json.loads(base.with_suffix(".json").read_text())
    tensors = read_tensors(base.with_suffix(".safetensors"))
    flat = {name: t for name, t in tensors.items() if name.rsplit(".part", 1)[0] not in index}
    for name, entry in index.items():
        parts = [(kind, rows, tensors[f"{name}.part{k}"]) for k, (kind, rows) in enumerate(entry["parts"])]
        flat[name] = GgufWeight.from_packed(parts, entry["in"], dtype=dtype)
    return flat


def _load_native_flat(source: Path, cached: Path | None, dtype: torch.dtype, progress: bool,
                      share_tokenizer: Tokenizer | None = None):
    """(config, tokenizer, flat) for weights="gguf": from the cache if there, else read from the file."""
    from augury.kernels.extension import extension
    from augury.models import gguf

    if cached is not None and extension() is not None and (cached / "config.json").exists():
        flat = _load_native(cached, dtype)
        if flat is not None:
            config = ModelConfig(**json.loads((cached / "config.json").read_text()))
            return config, Tokenizer.load(cached, share=share_tokenizer), flat
    reader = gguf.open_gguf(source)
    config = gguf.read_config(reader, source)
    tokenizer = gguf.read_tokenizer(source)
    flat = _read_with_progress(reader, f"repacking {source.name}", progress, lambda update: gguf.read_native_weights(
        reader, config, source, dtype, progress=update, warn=lambda line: print(f"augury: {line}", file=sys.stderr)))
    if cached is not None and extension() is not None:
        _save_native(cached, config, tokenizer, flat, dtype)
    return config, tokenizer, flat


def _native_model(
    config: ModelConfig, flat: dict, dtype: torch.dtype, device: torch.device, cached: Path | None, exact: bool
) -> Decoder:
    """The decoder over native weights; plain matmul weights (block types the kernel lacks) packed for oneDNN.

    The row padding is calibrated like any other load's (`GgufWeight` rows are
    invariant for every row count, so an all-native model measures no padding),
    on a layer made of the most restrictive weights: calibration looks at one
    layer, and a per-tensor fallback may sit in any layer.
    """
    weights = weights_from_flat(flat, config)
    if onednn_packing_available(dtype, device):
        for layer in weights.layers:
            for name in LINEAR_FIELDS:
                if isinstance(getattr(layer, name), torch.Tensor):
                    setattr(layer, name, OneDnnWeight(getattr(layer, name)))
        if isinstance(weights.lm_head, torch.Tensor):
            tied = weights.lm_head is weights.embed
            weights.lm_head = OneDnnWeight(weights.lm_head, shared_dense=weights.embed if tied else None)
    from augury.kernels.weight import GgufWeight

    probe_layer = replace(weights.layers[0], **{
        name: next((m for m in (getattr(la, name) for la in weights.layers) if not isinstance(m, GgufWeight)),
                   getattr(weights.layers[0], name))
        for name in LINEAR_FIELDS
    })
    probe = replace(weights, layers=[probe_layer])
    return Decoder(config, weights, exact=exact, padding=_padding(probe, dtype, device, cached, exact))


def load_model(
    name_or_path: str,
    *,
    dtype: str | torch.dtype = "bf16",
    device: str | torch.device = "cpu",
    offline: bool = False,
    exact: bool = True,
    pack: bool = True,
    use_cache: bool = True,
    progress: bool = True,
    weights: str | None = None,
    share_tokenizer: Tokenizer | None = None,
) -> Model:
    """Load a known model name (pulled on first use), a .gguf file or a Hugging Face folder.

    exact: pad small forwards to the row count from which this machine's
    matmuls are batch invariant, so that speculative verification is bitwise
    equal to plain decoding (see decoder.py).
    pack: store bf16 matmul weights in oneDNN's packed layout where that runs
    (decode steps about 1.7x faster on the development CPU; see `OneDnnWeight`).
    weights: "gguf" multiplies a GGUF file's own blocks (augury.kernels; about
    the file's size in memory), "bf16" dequantizes them to `dtype`; unset picks
    "gguf" for a .gguf file on CPU in bf16 or fp32 where the kernel runs (`resolve_weights`).
    share_tokenizer: reuse this tokenizer's parsed backends where the model's cached tokenizer.json is
    byte-identical to the one they were parsed from (`Tokenizer.load`'s share: a drafter of the
    target's family; its own meta is kept).
    """
    from augury.models.store import augury_home, resolve

    torch_dtype = parse_dtype(dtype)
    torch_device = parse_device(device)
    source = resolve(name_or_path, offline=offline)
    cached = _cache_dir(source, augury_home()) if use_cache else None
    if resolve_weights(weights, source, torch_dtype, torch_device) == "gguf":
        config, tokenizer, flat = _load_native_flat(source, cached, torch_dtype, progress, share_tokenizer)
        decoder = _native_model(config, flat, torch_dtype, torch_device, cached, exact)
        return Model(name=name_or_path, decoder=decoder, tokenizer=tokenizer, source=source)
    weights_file = cached / f"weights-{_dtype_name(torch_dtype)}.safetensors" if cached else None
    if weights_file is not None and weights_file.exists():
        config = ModelConfig(**json.loads((cached / "config.json").read_text()))
        tokenizer = Tokenizer.load(cached, share=share_tokenizer)
        flat = read_tensors(weights_file)
    else:
        config, tokenizer, flat = _convert(source, torch_dtype, progress)
        if cached is not None:
            _save_atomic(cached, config, tokenizer, flat, torch_dtype)
    packing = pack and onednn_packing_available(torch_dtype, torch_device)
    if torch_device.type != "cpu":
        flat = {name: t.to(torch_device) for name, t in flat.items()}
    weights = weights_from_flat(flat, config)
    if packing:
        weights = pack_weights(weights)
    decoder = Decoder(config, weights, exact=exact, padding=_padding(weights, torch_dtype, torch_device, cached, exact))
    return Model(name=name_or_path, decoder=decoder, tokenizer=tokenizer, source=source)
