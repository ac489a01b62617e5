"""Median ms of forwards of T new rows after 512 cached tokens, for each T in argv[1] (comma list), argv[2] s each."""
import statistics, sys, time
import torch
from augury.models.loader import load_model
from augury.costs import slots_for
from augury.kernels.extension import extension

rows_list, seconds = [int(x) for x in sys.argv[1].split(",")], float(sys.argv[2])
model = load_model("qwen2.5-coder-1.5b-instruct", offline=True)
dec = model.decoder
gen = torch.Generator().manual_seed(0)
cache = dec.new_cache(1, slots_for(512, max(rows_list)))
dec.forward(torch.randint(0, model.config.vocab_size, (1, 512), generator=gen), cache, logits_rows=slice(-1, None))
out = []
for rounds in range(2):
  for rows in rows_list:
    block = torch.randint(0, model.config.vocab_size, (1, rows), generator=gen)
    for _ in range(2):
        dec.forward(block, cache); cache.truncate(512)
    times, end = [], time.time() + seconds / 2
    while time.time() < end:
        t0 = time.perf_counter(); dec.forward(block, cache); times.append(time.perf_counter() - t0); cache.truncate(512)
    out.append((rows, statistics.median(times) * 1e3, len(times)))
agg = {}
for r, m, n in out: agg.setdefault(r, []).append(m)
base = min(agg[rows_list[0]])
print(" ".join(f"{r}:{min(v):.1f}({min(v)/base:.2f}x)" for r, v in agg.items()), flush=True)
