"""sampling.probabilities before (out of place, sampling_before_inplace.py) and now, alternating: ms a call."""
import sys, time, importlib.util
import torch
import augury.sampling as new
spec = importlib.util.spec_from_file_location("old_sampling", "/work/benchrun/s51/sampling_before_inplace.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_sampling"] = old; spec.loader.exec_module(old)
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
params = new.SamplingParams(temperature=0.7, top_p=0.95)
oparams = old.SamplingParams(temperature=0.7, top_p=0.95)
def tm(f, n=300):
    f(); t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e3
for V in (151936, 32768):
    for N in (1, 3, 5):
        logits = (torch.randn(N, V, generator=g) * 10).to(torch.bfloat16)
        assert torch.equal(old.probabilities(logits, oparams), new.probabilities(logits, params))
        a, b = [], []
        for rep in range(3):
            a.append(tm(lambda: old.probabilities(logits, oparams))); b.append(tm(lambda: new.probabilities(logits, params)))
        print(V, N, "rows: before %.3f now %.3f ms (min of 3, alternating)" % (min(a), min(b)))
