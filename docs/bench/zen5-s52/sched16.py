"""16 requests through the scheduler in-process (no HTTP): each step's wall, forward and rows, and a cProfile
of the 16-row steps. Greedy; `sched16.py t07`: temperature 0.7, top-p 0.95, seed 1."""
import sys, time, statistics, threading
import augury
from augury.scheduler import Scheduler, SchedulerConfig
from augury.sampling import SamplingParams
import augury.scheduler as S
SAMPLED = dict(temperature=0.7, top_p=0.95, seed=1) if sys.argv[1:] == ["t07"] else {}
PARAMS = SamplingParams(max_tokens=96, ignore_eos=True, **SAMPLED)
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
rec = []
orig_step = S.step
import cProfile, pstats
pr = cProfile.Profile()
def step(target, requests, cache):
    on = len(requests) == 16
    if on: pr.enable()
    t0 = time.perf_counter(); rep = orig_step(target, requests, cache)
    if on: pr.disable()
    rec.append(["fwd", len(requests), rep.rows, rep.forward_s, time.perf_counter() - t0]); return rep
S.step = step
s0 = Scheduler._step
def _step(self):
    t0 = time.perf_counter(); s0(self); rec.append(["all", time.perf_counter() - t0])
Scheduler._step = _step
sc = Scheduler(llm.target, None, SchedulerConfig(max_batch=16, prefill_chunk=None))
sc.start()
prompts = [f"Write a Python function number {i} that computes something useful about lists, with a docstring." for i in range(16)]
done = threading.Event(); left = [16]
lock = threading.Lock()
def on_event(ev):
    if type(ev).__name__ in ("Finished", "Failed"):
        with lock:
            left[0] -= 1
            if left[0] == 0: done.set()
for p in prompts:
    sc.submit(llm.encode(p, chat=True), PARAMS, on_event)
done.wait(300); sc.stop()
pairs = []
fw = [r for r in rec if r[0] == "fwd"]; al = [r for r in rec if r[0] == "all"]
full = [(f, a) for f, a in zip(fw, al) if f[1] == 16 and f[2] == 16]
print("steps with 16 decode rows:", len(full))
print("forward ms p50 %.1f, step() ms p50 %.1f, whole _step ms p50 %.1f" % (
    statistics.median(f[3] for f, a in full) * 1e3, statistics.median(f[4] for f, a in full) * 1e3, statistics.median(a[1] for f, a in full) * 1e3))
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(22)
