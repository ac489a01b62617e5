"""A model without some of its layers, and the skip sets that say which: a comma list or a calibration file.

Two drafters use it: layer-skip self-speculation (`layer_skip.py`: the target
with layers left out drafts for itself) and a draft model trimmed of layers
(`--draft-skip-layers`). The result is a second `Decoder` over the same
tensors (nothing is copied) whose layer list leaves out the skipped layers.

The layers keep their identity: gemma3 alternates sliding-window and global
layers by layer index, so the skipped decoder's config maps its i-th layer back
to the original index (`SkippedLayersConfig`) before asking which kind it is.

Which layers to skip is a speed/acceptance trade-off that depends on the model
(and the machine), so it comes from a list like "3,5,7" or from a file written
by `augury calibrate`; for the layerskip method without either, a calibration
file for the model under $AUGURY_HOME/calibration is used if there is one,
else every other layer of the middle half is skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from augury.errors import AuguryError
from augury.files import write_json_atomic
from augury.models.decoder import Decoder, ModelConfig, Weights
from augury.models.loader import Model

CALIBRATION_FORMAT = 1


@dataclass(frozen=True)
class SkippedLayersConfig(ModelConfig):
    """A config for a subset of a model's layers; layer_ids[i] is the original index of layer i."""

    layer_ids: tuple[int, ...] = ()

    def is_sliding(self, layer: int) -> bool:
        return super().is_sliding(self.layer_ids[layer])


def original_layer_ids(config: ModelConfig) -> tuple[int, ...]:
    """The original index of each of a config's layers (itself, unless layers were already skipped)."""
    if isinstance(config, SkippedLayersConfig):
        return config.layer_ids
    return tuple(range(config.num_layers))


def skip_layers(decoder: Decoder, skip: set[int] | list[int]) -> Decoder:
    """A decoder over the same tensors without the layers in `skip` (indices of `decoder`'s layers)."""
    skip = set(skip)
    kept = [i for i in range(decoder.config.num_layers) if i not in skip]
    ids = original_layer_ids(decoder.config)
    fields = decoder.config.to_dict()
    fields.update(num_layers=len(kept), layer_ids=tuple(ids[i] for i in kept))
    w = decoder.weights
    weights = Weights(
        embed=w.embed, final_norm=w.final_norm, lm_head=w.lm_head, layers=[w.layers[i] for i in kept]
    )
    # A drafter needs no batch invariance (the target verifies), so no row padding.
    return Decoder(SkippedLayersConfig(**fields), weights, exact=False)


def default_skip(num_layers: int) -> list[int]:
    """Without calibration: every other layer of the middle half (first and last layers are the most needed)."""
    lo, hi = num_layers // 4, (3 * num_layers) // 4
    return [i for i in range(lo, hi) if i % 2 == 1]


def calibration_path(model_name: str) -> Path:
    """Where `augury calibrate` saves the skip set for a model: $AUGURY_HOME/calibration/<model>-layerskip.json."""
    from augury.models.store import augury_home

    stem = Path(model_name.rstrip("/")).name.removesuffix(".gguf")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem) or "model"
    return augury_home() / "calibration" / f"{stem}-layerskip.json"


def check_skip(skip: list[int], num_layers: int, source: str) -> list[int]:
    """Sorted distinct layer indices, or AuguryError if any is out of range or none would be left."""
    if not skip:
        raise AuguryError(f"skip layers from {source}: no layers given")
    bad = [i for i in skip if not 0 <= i < num_layers]
    if bad:
        raise AuguryError(f"skip layers from {source}: layer {bad[0]} is out of range 0..{num_layers - 1}")
    skip = sorted(set(skip))
    if len(skip) >= num_layers:
        raise AuguryError(f"skip layers from {source}: cannot skip all {num_layers} layers")
    return skip


def write_calibration(path: Path, model_name: str, num_layers: int, skip: list[int], **details: object) -> None:
    """Save a skip set (and whatever the calibration measured) as JSON, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": CALIBRATION_FORMAT, "model": model_name, "num_layers": num_layers, "skip_layers": sorted(skip)}
    data.update(details)
    write_json_atomic(path, data)


def read_calibration(path: Path, num_layers: int) -> list[int]:
    """The skip set in a calibration file, checked against the model's layer count."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise AuguryError(f"cannot read calibration file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("skip_layers"), list):
        raise AuguryError(f"calibration file {path} has no skip_layers list")
    if data.get("num_layers") != num_layers:
        raise AuguryError(
            f"calibration file {path} is for a model with {data.get('num_layers')} layers, this one has {num_layers}"
        )
    skip = data["skip_layers"]
    if not all(isinstance(i, int) for i in skip):
        raise AuguryError(f"calibration file {path}: skip_layers must be integers")
    return check_skip(skip, num_layers, str(path))


def parse_skip_layers(spec: str | None, num_layers: int, model_name: str, *, flag: str = "--skip-layers") -> list[int]:
    """Layers to skip from --skip-layers (or the option named by flag): "3,5,7", a calibration file, or None
    (saved calibration or default)."""
    if spec is None:
        saved = calibration_path(model_name)
        return read_calibration(saved, num_layers) if saved.is_file() else default_skip(num_layers)
    if Path(spec).is_file():
        return read_calibration(Path(spec), num_layers)
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise AuguryError(
            f"{flag} '{spec}' is neither a comma list of layer indices (e.g. 3,5,7) nor a calibration file"
        )
    return check_skip([int(p) for p in parts], num_layers, flag)


def layer_skip_model(model: Model, skip: list[int]) -> Model:
    """The model with `skip` layers left out, as a Model that shares its weights and tokenizer."""
    decoder = skip_layers(model.decoder, skip)
    return Model(name=f"{model.name}[skip {','.join(map(str, skip))}]", decoder=decoder,
                 tokenizer=model.tokenizer, source=model.source)
