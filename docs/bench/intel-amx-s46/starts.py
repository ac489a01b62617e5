import time, torch
from augury.models.loader import load_model
from augury.proposers import build_proposer
from augury.proposers.base import Sequence
from augury.sampling import SamplingParams
target = load_model("qwen2.5-coder-1.5b-instruct", offline=True)
prop = build_proposer("model", target, {})
draft = prop.model
def t_target(n):
    cache = target.decoder.new_cache(1, n + 8)
    toks = torch.randint(100, 20000, (1, n))
    t = time.perf_counter(); target.decoder.forward(toks, cache); return time.perf_counter() - t
def t_draft_start(n):
    seq = Sequence(list(torch.randint(100, 20000, (n + 1,)).tolist()), SamplingParams(max_tokens=8))
    t = time.perf_counter(); prop.start(seq); dt = time.perf_counter() - t; prop.finish(seq); return dt
def t_draft_raw(n):
    cache = draft.decoder.new_cache(1, n + 8)
    toks = torch.randint(100, 20000, (1, n))
    t = time.perf_counter(); draft.decoder.forward(toks, cache); return time.perf_counter() - t
for f in (t_target, t_draft_start, t_draft_raw): f(8)
for n in (1, 2, 16, 52, 128, 256, 741):
    a = min(t_target(n) for _ in range(2)); b = min(t_draft_start(n) for _ in range(2)); c = min(t_draft_raw(n) for _ in range(2))
    print(f"{n:4d} rows: target {a*1000:7.1f} ms ({a/n*1000:.2f}/tok)  drafter start {b*1000:7.1f} ms ({b/n*1000:.2f}/tok)  drafter forward {c*1000:7.1f} ms", flush=True)
