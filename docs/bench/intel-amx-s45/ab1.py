"""In one process: two copies of the model, on the kernel built from A's sources and on B's (this tree's),
timed in turns (argv: A's .so, rows list, rounds, seconds a turn): min and median of each turn's medians."""
import importlib.machinery, importlib.util, statistics, sys, time
import torch
import augury.kernels.weight as W, augury.models.loader as LD
from augury.kernels.extension import extension
from augury.costs import slots_for

def load_so(path):
    name = path.rsplit("/", 1)[1].split(".")[0]
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec); loader.exec_module(mod); return mod

so_a, rows_list, rounds, secs = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), float(sys.argv[4])
mods = {"A": load_so(so_a), "B": extension()}
models = {}
import os, augury.kernels.extension as E
isa_of = {"A": os.environ.get("ISA_A"), "B": os.environ.get("ISA_B")}
for k, m in mods.items():
    W.extension = LD.extension = (lambda m=m: m)
    E.kernel_isa.cache_clear()
    if isa_of[k]: os.environ["AUGURY_ISA"] = isa_of[k]
    else: os.environ.pop("AUGURY_ISA", None)
    models[k] = LD.load_model("qwen2.5-coder-1.5b-instruct", offline=True)
    print(k, "isa", models[k].decoder.native.layers[0] if False else E.kernel_isa(), flush=True)
gen = torch.Generator().manual_seed(0)
ctx = 512
state = {}
for k, model in models.items():
    dec = model.decoder
    cache = dec.new_cache(1, slots_for(ctx, max(rows_list)))
    dec.forward(torch.randint(0, model.config.vocab_size, (1, ctx), generator=torch.Generator().manual_seed(0)), cache, logits_rows=slice(-1, None))
    state[k] = (dec, cache)
blocks = {r: torch.randint(0, 151936, (1, r), generator=gen) for r in rows_list}
res = {(k, r): [] for k in models for r in rows_list}
for _ in range(rounds):
    for r in rows_list:
        for k in models:
            dec, cache = state[k]
            dec.forward(blocks[r], cache); cache.truncate(ctx)
            ts, end = [], time.time() + secs
            while time.time() < end:
                t0 = time.perf_counter(); dec.forward(blocks[r], cache); ts.append(time.perf_counter() - t0); cache.truncate(ctx)
            res[(k, r)].append(statistics.median(ts) * 1e3)
for r in rows_list:
    print(f"rows {r}: " + "  ".join(f"{k} min {min(res[(k, r)]):.1f} med {statistics.median(res[(k, r)]):.1f}" for k in models)
          + f"  B/A med {statistics.median(res[('B', r)]) / statistics.median(res[('A', r)]):.3f}")
for k in models:
    print(k, " ".join(f"{r}:{statistics.median(res[(k, r)]) / statistics.median(res[(k, rows_list[0])]):.2f}x" for r in rows_list))
