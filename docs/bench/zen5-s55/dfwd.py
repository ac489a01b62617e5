"""Drafter (0.5B, as the hybrid builds it) and target forwards of 1 row after `ctx` tokens; weight bytes."""
import augury, torch, statistics, time, sys
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 256
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="hybrid", offline=True)
for name, dec in (("target", llm.target.decoder), ("drafter", llm.proposer.model.decoder)):
    w = dec.weights
    nbytes = sum(v.nbytes for l in w.layers for v in vars(l).values() if v is not None) + w.lm_head.nbytes
    cache = dec.new_cache(1, 4096)
    dec.forward(torch.randint(0, 1000, (1, ctx)), cache)
    for rows in (1, 2, 4):
        ts = []
        for i in range(25):
            tok = torch.arange(100, 100 + rows)[None]
            t = time.perf_counter(); dec.forward(tok, cache); ts.append(time.perf_counter() - t)
            cache.truncate(ctx)
        print(name, getattr(dec, "native", None) and dec.native.isa, "rows", rows, f"median {statistics.median(ts[3:])*1e3:.2f} ms min {min(ts)*1e3:.2f}", f"params+buffers {nbytes/1e6:.0f} MB")
