"""Prefill seconds of a prompt of n tokens: whole (one forward, what the engine does) against pieces of the
row-attention limit (the native layer), in turns, 3 rounds, median. Usage: prefill_len.py N1,N2,..."""
import statistics, sys, time
import torch
import augury
from augury.cache import slots_for

plain = augury.load(offline=True, draft_method="plain")
model = plain.target
dec = model.decoder
limit = dec.row_attention_limit
lengths = [int(x) for x in sys.argv[1].split(",")]
gen = torch.Generator().manual_seed(0)
prompts = {n: torch.randint(0, 32000, (1, n), generator=gen) for n in lengths}
cache = dec.new_cache(1, slots_for(max(lengths), 8))

def run(n, piece):
    cache.reset()
    t0 = time.perf_counter()
    for s in range(0, n, piece):
        dec.forward(prompts[n][:, s:s + piece], cache, logits_rows=slice(-1, None))
    return time.perf_counter() - t0

times = {(n, k): [] for n in lengths for k in ("whole", "pieces")}
run(lengths[0], limit); run(lengths[-1], lengths[-1])  # warm-up
for _ in range(3):
    for n in lengths:
        times[(n, "whole")].append(run(n, n))
        times[(n, "pieces")].append(run(n, limit))
print(f"kernel: {dec.native.describe() if hasattr(dec.native, 'describe') else ''} limit {limit}")
print("tokens  whole s  pieces s  whole tok/s  pieces tok/s")
for n in lengths:
    w, p = statistics.median(times[(n, "whole")]), statistics.median(times[(n, "pieces")])
    print(f"{n:6d}  {w:7.3f}  {p:8.3f}  {n / w:11.1f}  {n / p:12.1f}")
