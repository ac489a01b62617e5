"""Whole forwards of the target by rows after `context` tokens, median of 10 after 2 warm-ups, in the
process's own kernel (the augury on PYTHONPATH). Usage: fwd_rows.py [context] [rows,...]"""
import statistics, sys, time
import torch
import augury
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 512
rows = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,2,5,8,16").split(",")]
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
dec = llm.target.decoder
cache = dec.new_cache(1, 4096)
dec.forward(torch.randint(0, 1000, (1, ctx)), cache)
out = []
for r in rows:
    tok = torch.arange(100, 100 + r)[None]
    ts = []
    for i in range(12):
        t = time.perf_counter(); dec.forward(tok, cache); ts.append(time.perf_counter() - t)
        cache.truncate(ctx)
    out.append(f"{r}:{statistics.median(ts[2:]) * 1e3:.2f}")
print(dec.native.isa, ctx, " ".join(out), flush=True)
