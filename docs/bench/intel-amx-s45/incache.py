"""Compute-bound vs streamed matmul cost per sub-block (16 columns x 32 values) at 1..8 rows."""
import statistics, sys, time, torch
from augury.kernels.bench import model_matrices, time_step
from augury.models.decoder import linear
mats = model_matrices(sys.argv[1])
def subblocks(ms): return sum(m.shape[0] * m.shape[1] for m in ms) / 512
small = [mats[0]]  # layer 0's first matrix: L2-resident across calls
print("small", small[0].shape, f"{small[0].shape[0]*small[0].shape[1]*4.5/8/1e6:.2f} MB")
for rows in (1, 2, 5, 8):
    x = torch.randn(1, rows, small[0].shape[1])
    for _ in range(50): linear(x, small[0])
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(200): linear(x, small[0])
        ts.append((time.perf_counter() - t0) / 200)
    t = statistics.median(ts)
    print(f"in cache rows {rows}: {t*1e6:.0f} us/call, {t*1e9/subblocks(small)*2:.1f} ns per sub-block per core")
full = time_step(mats, [1, 2, 5, 8], torch.float32, repeats=5)
for rows, ms in full.items():
    print(f"streamed rows {rows}: {ms:.1f} ms, {ms*1e6/subblocks(mats)*2:.1f} ns per sub-block per core")
