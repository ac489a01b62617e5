"""s33: where a model drafter's drafted token goes: its forward vs the rest (probabilities, Python)."""
import time, cProfile, pstats, sys
import torch
from augury.models.loader import load_model
from augury.proposers import build_proposer
from augury.proposers.base import Sequence
from augury.sampling import SamplingParams

target = load_model("qwen2.5-coder-1.5b-instruct", offline=True)
prop = build_proposer("model", target, {}, offline=True)
dec = prop.decoder
seq = Sequence(list(range(1000, 1400)), SamplingParams(max_tokens=600))
prop.start(seq)
def one_round():
    d = prop.propose(seq, 4)
    seq.tokens.append(d.tokens[0])  # pretend the first was accepted + rollback of the rest
    st = prop.states[seq.id]
    st.fed = len(seq.tokens) - 1; st.cache.truncate(st.fed); st.drafted = []
    return len(d.tokens)
for _ in range(5): one_round()
n = 0; t0 = time.perf_counter()
for _ in range(40): n += one_round()
dt = time.perf_counter() - t0
print(f"propose K=4: {1000*dt/40:.1f} ms a round, {1000*dt/n:.1f} ms a drafted token ({n} drafted)")
# the bare forwards: 1 row at this cache length
cache = prop.states[seq.id].cache
x = torch.tensor([[5]])
ts = []
for _ in range(40):
    L = cache.length if hasattr(cache, "length") else None
    t = time.perf_counter(); dec.forward(x, cache, logits_rows=slice(-1, None)); ts.append(time.perf_counter() - t)
    prop.states[seq.id].cache.truncate(prop.states[seq.id].fed)
ts.sort(); print(f"bare 1-row forward: min {1000*ts[0]:.1f} median {1000*ts[len(ts)//2]:.1f} ms")
pr = cProfile.Profile(); pr.enable()
for _ in range(20): one_round()
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
