"""ms a row of sampling.probabilities (T 0.7, top-p 0.95) on the augury at PYTHONPATH, one row at a time,
on rows of three shapes: peaked (a nucleus of a few tokens), medium (tens to hundreds), flat (thousands)."""
import statistics, time, torch
from augury.sampling import SamplingParams, probabilities
V = 151_936
params = SamplingParams(temperature=0.7, top_p=0.95)
gen = torch.Generator().manual_seed(0)
def rows(scale, boost):
    out = []
    for _ in range(20):
        r = torch.randn(1, V, generator=gen) * scale
        r[0, torch.randint(0, V, (5,), generator=gen)] += boost
        out.append(r)
    return out
shapes = {"peaked": rows(2.0, 25.0), "medium": rows(2.0, 14.0), "flat": rows(1.0, 4.0)}
for name, rs in shapes.items():
    sizes = [int((probabilities(r, params) > 0).sum()) for r in rs]
    ts = []
    for rep in range(5):
        t = time.perf_counter()
        for r in rs: probabilities(r, params)
        ts.append((time.perf_counter() - t) / len(rs) * 1e3)
    print(f"{name}: nucleus {min(sizes)}-{max(sizes)} tokens, {statistics.median(ts):.3f} ms a row")
