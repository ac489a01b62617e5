"""Per-step trace of the demo's speculative run: plan, draft kind, verified, accepted, ms."""
import sys, time
import augury.engine as eng
from augury.api import load
from augury.engine import Engine
from augury.models.store import DEFAULT_DRAFT, DEFAULT_TARGET
from augury.proposers.hybrid import HybridProposer
from augury.proposers.options import DEFAULT_METHOD, ModelOptions
from augury.proposers.suffix import SuffixProposer
from augury.sampling import SamplingParams

PROMPT = "Write a Python function that checks whether a string is a palindrome, with a short docstring."
options = ModelOptions(draft=DEFAULT_DRAFT, offline=True)
llm = load(DEFAULT_TARGET, draft_method=DEFAULT_METHOD, k=4, offline=True, draft=options.draft)
target, proposer = llm.target, llm.proposer
ids = llm.encode(PROMPT, chat=True)
params = SamplingParams(max_tokens=128)
log = []
orig_step, orig_draft, orig_free = eng.step, eng.draft, eng.draft_free
cur = {}
def draft(p, reqs, ks, free_k=0):
    t = time.perf_counter(); r = orig_draft(p, reqs, ks, free_k=free_k)
    cur.update(plan=ks[0], draft_ms=(time.perf_counter() - t) * 1e3, model_len=len(reqs[0].draft), bucket=reqs[0].draft.bucket)
    return r
def draft_free(p, reqs, k):
    t = time.perf_counter(); r = orig_free(p, reqs, k)
    cur.update(free_ms=(time.perf_counter() - t) * 1e3, free_len=len(reqs[0].draft), fbucket=reqs[0].draft.bucket)
    return r
def step(t_, reqs, cache):
    cur['verified'] = len(reqs[0].draft)
    t = time.perf_counter(); rep = orig_step(t_, reqs, cache)
    cur['step_ms'] = (time.perf_counter() - t) * 1e3
    res = rep.results[0]
    cur['acc'] = res.num_accepted if res else None
    log.append(dict(cur)); cur.clear()
    return rep
eng.step, eng.draft, eng.draft_free = step, draft, draft_free
for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    part = HybridProposer(SuffixProposer(proposer.matcher.ngram_min), proposer.model, proposer.min_match_tokens)
    e = Engine(target, part, k=4, adaptive=True)
    log.clear()
    t0 = time.perf_counter(); r = e.generate(ids, params); wall = time.perf_counter() - t0
    eng.step = orig_step
    p = Engine(target).generate(ids, params)
    eng.step = step
    print(f"run {run}: spec {r.stats.tokens_per_s:.2f} tok/s, plain {p.stats.tokens_per_s:.2f}, wall {wall:.3f}s, draft_s {r.stats.draft_s:.3f} verify_s {r.stats.verify_s:.3f}")
    print(e.last_plan.line())
    tot = {}
    for i, l in enumerate(log):
        print(i, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in l.items()})
    print("curve", e.planner.costs.__dict__.keys())
pl = e.planner
for b, t in sorted(pl.by_bucket.items()):
    print("bucket", b, "allowed", t.allowed, "drafted", t.drafted, "accepted", t.accepted, "odds", [round(a, 2) for a in t.odds().accept])
print("plan tally", pl.tally.allowed, pl.tally.drafted, pl.tally.accepted)
print("costs 1..5", [round(pl.costs.target_time(1, k) * 1e3, 1) for k in range(1, 6)])
print("skips", pl.bucket_skips)
import collections
agg = collections.defaultdict(lambda: [0, 0.0])
for l in log:
    a = agg[l['verified']]; a[0] += 1; a[1] += l['step_ms']
for v, (n, s) in sorted(agg.items()):
    print(f"verified {v}: {n} steps, {s:.0f} ms, {s/n:.1f} ms each")
print("draft ms total", round(sum(l.get('draft_ms', 0) + l.get('free_ms', 0) for l in log)), "steps total", round(sum(l['step_ms'] for l in log)))
print("spec stats", r.stats)
print("plain stats", p.stats)
