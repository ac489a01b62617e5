"""1-row forwards of a model on its GGUF blocks at 1 and 2 threads, alternating (median ms)."""
import sys, time, statistics, torch
import augury
name = sys.argv[1]
llm = augury.load(name, draft_method="plain", offline=True)
dec = llm.target.decoder
cache = dec.new_cache(1, 4096)
dec.forward(torch.randint(0, 1000, (1, 128)), cache)
tok = torch.tensor([[5]])
res = {1: [], 2: []}
for rnd in range(6):
    for th in (1, 2):
        torch.set_num_threads(th)
        ts = []
        for i in range(40):
            t = time.perf_counter(); dec.forward(tok, cache); ts.append(time.perf_counter() - t)
        res[th].append(statistics.median(ts) * 1e3)
for th, v in res.items():
    print(name, "threads", th, "median of medians %.2f ms, min %.2f" % (statistics.median(v), min(v)))
