"""Forwards of 1..5 rows at context ~128 on two ISAs in one process, alternating (median ms)."""
import os, sys, time, statistics, torch
import augury
from augury.commands.profile import kernel_path
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct"
isas = sys.argv[2].split(",") if len(sys.argv) > 2 else ["avx512", "avx2"]
decs = {}
for isa in isas:
    os.environ["AUGURY_ISA"] = isa; from augury.kernels import extension as _e; _e.kernel_isa.cache_clear()
    llm = augury.load(name, draft_method="plain", offline=True)
    print(isa, kernel_path(llm.target))
    decs[isa] = llm.target.decoder
res = {(i, r): [] for i in isas for r in (1, 2, 3, 5)}
caches = {}
for isa, dec in decs.items():
    caches[isa] = dec.new_cache(1, 4096)
    dec.forward(torch.randint(0, 1000, (1, 128)), caches[isa])
for rnd in range(5):
    for isa, dec in decs.items():
        for r in (1, 2, 3, 5):
            ts = []
            for i in range(15):
                tok = torch.randint(0, 1000, (1, r))
                t = time.perf_counter(); dec.forward(tok, caches[isa]); ts.append(time.perf_counter() - t)
                caches[isa].truncate(128) if hasattr(caches[isa], "truncate") else None
            res[isa, r].append(statistics.median(ts) * 1e3)
for (isa, r), v in res.items():
    print(f"{isa} rows {r}: median {statistics.median(v):.2f} ms min {min(v):.2f}")
