"""Forward ms by rows and context (one process, median of rounds)."""
import sys, time, statistics, torch
import augury
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
dec = llm.target.decoder
res = {}
for ctx in (16, 512, 2048):
    cache = dec.new_cache(1, 4096)
    dec.forward(torch.randint(0, 1000, (1, ctx)), cache)
    for r in (1, 8, 16):
        ts = []
        for i in range(12):
            tok = torch.randint(0, 1000, (1, r))
            t = time.perf_counter(); dec.forward(tok, cache); ts.append(time.perf_counter() - t)
            cache.truncate(ctx)
        res[ctx, r] = statistics.median(ts[2:]) * 1e3
for k, v in res.items(): print(k, f"{v:.1f} ms")
