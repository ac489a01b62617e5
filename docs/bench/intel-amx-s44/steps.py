"""Repeated forwards of T new rows after 512 cached tokens (for perf record), T from argv; prints median ms."""
import statistics, sys, time
import torch
from augury.models.loader import load_model
from augury.costs import slots_for

rows, seconds = int(sys.argv[1]), float(sys.argv[2])
model = load_model("qwen2.5-coder-1.5b-instruct", offline=True)
dec = model.decoder
gen = torch.Generator().manual_seed(0)
cache = dec.new_cache(1, slots_for(512, rows))
dec.forward(torch.randint(0, model.config.vocab_size, (1, 512), generator=gen), cache, logits_rows=slice(-1, None))
block = torch.randint(0, model.config.vocab_size, (1, rows), generator=gen)
for _ in range(3):
    dec.forward(block, cache); cache.truncate(512)
print("ready", flush=True)
times, end = [], time.time() + seconds
while time.time() < end:
    t0 = time.perf_counter(); dec.forward(block, cache); times.append(time.perf_counter() - t0); cache.truncate(512)
print(f"rows {rows}: median {statistics.median(times) * 1e3:.1f} ms over {len(times)}", flush=True)
