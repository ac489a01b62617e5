"""The verification cost curve of a model on this machine: measured by `augury profile`, read by the planner.

Speculation pays when a forward of T new tokens costs little more than one.
How much more depends on the CPU, the torch build, the thread count, the
weight format and the row padding, so it is measured, not assumed: `augury
profile` times forwards of 1..32 new tokens and saves the curve next to the
model's converted weights, keyed by what it depends on (the same key as the
row padding, `calibration.machine_key`). A planner reads it back with
`load_cost_curve(model)`; None means it was never measured for this model,
machine and format (or under another padding), and the planner must measure
for itself.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from augury.cache import slots_for
from augury.calibration import machine_key
from augury.files import write_json_atomic
from augury.models.decoder import weight_kinds
from augury.models.loader import Model

VERSION = 1


def cost_key(model: Model) -> str:
    """What a model's forward costs depend on, as the row padding's calibration keys it."""
    decoder = model.decoder
    return machine_key(decoder.dtype, weight_kinds(decoder.weights))


def costs_path(model: Model) -> Path:
    """Where the curve of this model on this machine is kept: beside its converted weights."""
    from augury.models.loader import _cache_dir
    from augury.models.store import augury_home

    return _cache_dir(model.source, augury_home()) / f"costs-{cost_key(model)}.json"


def save_cost_curve(
    model: Model, rows_ms: dict[int, float], *, context: int, weight_bytes: int, floor_ms: float
) -> Path:
    """Write the measured curve (new tokens -> median forward ms after `context` cached tokens)."""
    path = costs_path(model)
    record = {
        "version": VERSION,
        "key": cost_key(model),
        "weight_kinds": sorted(set(weight_kinds(model.decoder.weights))),
        "context": context,
        "rows_ms": {str(rows): ms for rows, ms in sorted(rows_ms.items())},
        # the padding the curve was measured under: a planner on another padding must not use it
        "padded_rows": {str(rows): model.decoder.pad_rows(rows) for rows in sorted(rows_ms)},
        "weight_bytes": weight_bytes,
        "floor_ms": floor_ms,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return path


def load_cost_curve(model: Model) -> dict[int, float] | None:
    """Median ms of a forward of T new tokens, by T, as `augury profile` measured it for this model here.

    None when there is no curve for this model, machine, thread count and
    weight format, when it is unreadable, or when the model now pads rows
    differently from when it was measured.
    """
    path = costs_path(model)
    try:
        record = json.loads(path.read_text())
        if record.get("version") != VERSION or record.get("key") != cost_key(model):
            return None
        curve = {int(rows): float(ms) for rows, ms in record["rows_ms"].items()}
        padded = {int(rows): int(n) for rows, n in record["padded_rows"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if any(model.decoder.pad_rows(rows) != n for rows, n in padded.items()):
        return None
    return curve


QUICK_CONTEXT = 128  # cached tokens before the block in the quick measurement
QUICK_REPEATS = 3


def weight_bytes_per_step(model: Model) -> int:
    """Bytes of weights one decode step must read: every layer matrix plus the output head."""
    w = model.decoder.weights
    total = 0
    for layer in w.layers:
        for value in vars(layer).values():
            if value is not None:
                total += value.nbytes
    return total + w.lm_head.nbytes + w.final_norm.nbytes


def forward_curve(model: Model, context: int, rows: list[int], repeats: int = 5) -> dict[int, float]:
    """Median ms of a forward of T new tokens after `context` cached tokens, for each T.

    The sizes take turns, a round of every T per repeat after a warm-up round:
    timed one size after another, a slow spell of a shared machine fell on one
    size alone, and a quick curve came out with 1 token dearer than 2 (73.2 ms
    against 59.5, docs/benchmarks.md 37a). Taking turns, a spell moves every
    size alike, and the planner keeps the curve's ratios (`ShapeCosts.set_prior`).
    """
    decoder = model.decoder
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = decoder.new_cache(1, slots_for(context, max(rows)))
    decoder.forward(torch.randint(0, vocab, (1, context), generator=gen), cache, logits_rows=slice(-1, None))
    blocks = {t: torch.randint(0, vocab, (1, t), generator=gen) for t in rows}
    times: dict[int, list[float]] = {t: [] for t in rows}
    for i in range(repeats + 1):
        for t, block in blocks.items():
            t0 = time.perf_counter()
            decoder.forward(block, cache)
            elapsed = time.perf_counter() - t0
            cache.truncate(context)
            if i:  # the first round is a warm-up
                times[t].append(elapsed)
    return {t: statistics.median(samples) * 1e3 for t, samples in times.items()}


def cost_curve_for(model: Model, k_max: int) -> dict[int, float]:
    """The target's cost curve for blocks of 1..k_max + 1 tokens: `augury profile`'s where it measured
    this model on this machine, else a quick one measured now (a second or two for a 1.5B model) and
    saved beside the model's converted weights, so the next load finds it.

    A planner without any curve would learn the costs from its own first
    steps, but those include first-touch and warm-up time; a measured curve
    lets the first plan already be right.
    """
    try:
        curve = load_cost_curve(model)
    except (OSError, ValueError):
        curve = None
    wanted = range(1, k_max + 2)
    if curve is not None and all(rows in curve for rows in wanted):
        return curve
    context = min(QUICK_CONTEXT, model.config.context_length - k_max - 16)
    measured = forward_curve(model, max(context, 1), list(wanted), repeats=QUICK_REPEATS)
    if _kept_on_disk(model):
        try:
            save_cost_curve(model, measured, context=context, weight_bytes=weight_bytes_per_step(model), floor_ms=0.0)
        except OSError:
            pass  # a read-only home: measured again next time
    return measured


def rows_curve(model: Model) -> dict[int, float]:
    """The model's forward milliseconds at 1, 2, 4 and 8 rows, measured now: what a step of n rows costs
    before a server's own steps have measured it (`StepBound`)."""
    context = max(1, min(QUICK_CONTEXT, model.config.context_length - 16))
    return forward_curve(model, context, [1, 2, 4, 8], repeats=QUICK_REPEATS)


def _kept_on_disk(model: Model) -> bool:
    """Whether a measurement of this model is kept beside its converted weights: a real model, not a
    test's in-memory one."""
    return model.source.is_file() or (model.source / "config.json").exists()


# -- whether prompts pay for being prefilled in pieces (the server's --prefill-chunk auto) ---------------

PIECES_PAY = 0.7  # pieces must prefill at least this share of a whole prompt's tokens per second
PREFILL_PROBE_PIECES = 4  # the measured prompt, in row-attention limits (256 tokens at 64: a typical prompt)


def prefill_rates(model: Model) -> tuple[float, float]:
    """Tokens per second of a prompt of PREFILL_PROBE_PIECES times the row-attention limit prefilled in
    pieces of that limit (the rows a step's ragged forward computes: the native layer's) and prefilled
    whole (past the limit: one masked torch call, dequantized tiles on GGUF blocks where the CPU has
    AMX), measured once per model, machine and weight format and kept beside the cost curve.

    Why measured: on the AVX-512 path of an Intel CPU with AMX a whole prompt prefilled 1.6x faster
    than pieces (docs/benchmarks.md section 10); with the AVX2 kernel the two were close, and there
    pieces cost a serving machine nothing.
    """
    path = costs_path(model).with_name(f"prefill-{cost_key(model)}.json")
    try:
        record = json.loads(path.read_text())
        if record.get("version") == VERSION and record.get("key") == cost_key(model):
            return float(record["pieces_tok_s"]), float(record["whole_tok_s"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    decoder = model.decoder
    limit = decoder.row_attention_limit
    n = PREFILL_PROBE_PIECES * limit
    prompt = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    cache = decoder.new_cache(1, slots_for(n, 0))

    def seconds(piece: int) -> float:
        cache.reset()
        t0 = time.perf_counter()
        for start in range(0, n, piece):
            decoder.forward(prompt[:, start : start + piece], cache, logits_rows=slice(-1, None))
        return time.perf_counter() - t0

    seconds(limit), seconds(n)  # warm-up (first touch of the weights, the kernels' scratch)
    pieces, whole = n / seconds(limit), n / seconds(n)
    if _kept_on_disk(model):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {"version": VERSION, "key": cost_key(model), "pieces_tok_s": pieces,
                                     "whole_tok_s": whole, "prompt_tokens": n,
                                     "measured": time.strftime("%Y-%m-%dT%H:%M:%S")})
        except OSError:
            pass  # a read-only home: measured again next time
    return pieces, whole


def pieces_pay(pieces_tok_s: float, whole_tok_s: float) -> bool:
    """Whether prompts should be prefilled in pieces: they prefill at least PIECES_PAY as fast as whole."""
    return pieces_tok_s >= PIECES_PAY * whole_tok_s
