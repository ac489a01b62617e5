"""Whole forwards of the target, the kernel built from two sources in one process: the old library (one
chain of products a row) and the new (two on AVX-512), alternating; ms by rows after `context` tokens.
Usage: chains_ab.py OLD_SO NEW_SO [context]"""
import importlib.machinery, importlib.util, statistics, sys, time
import torch
import augury
from augury.models.native_layers import NativeStack

def module(path):
    name = path.rsplit("/", 1)[1].split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path, loader=importlib.machinery.ExtensionFileLoader(name, path))
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

old, new = module(sys.argv[1]), module(sys.argv[2])
ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 512
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
dec = llm.target.decoder
w = dec.weights
mats = [w.lm_head] + [getattr(l, n) for l in w.layers for n in ("wqkv", "wo", "w_gate_up", "w_down")]
stacks = {name: NativeStack(dec.config, w, m, dec.native.isa, dec.scale) for name, m in (("old", old), ("new", new))}
def use(name):
    for m in mats: m.kernel = old if name == "old" else new
    dec.native = stacks[name]
cache = dec.new_cache(1, 4096)
dec.forward(torch.randint(0, 1000, (1, ctx)), cache)
rows = (1, 2, 5, 8, 16)
res = {(a, r): [] for a in ("old", "new") for r in rows}
outs = {}
for rnd in range(6):
    for arm in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
        use(arm)
        for r in rows:
            tok = torch.arange(100, 100 + r)[None]
            ts = []
            for i in range(12):
                t = time.perf_counter(); out = dec.forward(tok, cache); ts.append(time.perf_counter() - t)
                cache.truncate(ctx)
            outs[arm, r] = out
            res[arm, r].append(statistics.median(ts[2:]) * 1e3)
print(f"isa {dec.native.isa}, context {ctx}")
for r in rows:
    o, n = statistics.median(res["old", r]), statistics.median(res["new", r])
    same = torch.equal(outs["old", r], outs["new", r])
    print(f"rows {r:2d}: old {o:6.2f} ms  new {n:6.2f} ms  new/old {n / o:.3f}  same logits: {same}")
