# Loaded by every Python process with this folder on PYTHONPATH: under TRACE_STEPS=<file>, an augury server's
# scheduler logs each step (wall time, decode rows, prompt tokens fed, forward rows, forward seconds).
import os, sys, importlib.abc, importlib.util, time, atexit, json
OUT = os.environ.get("TRACE_STEPS")
class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "augury.scheduler":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        orig = spec.loader.exec_module
        def exec_module(module):
            orig(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec
def _patch(S):
    rec = []
    step0 = S.step
    last = {}
    def step(target, requests, cache, *a, **kw):
        rep = step0(target, requests, cache, *a, **kw)
        last["rows"], last["fwd"], last["pr"] = rep.rows, rep.forward_s, rep.prompt_rows
        return rep
    S.step = step
    s0 = S.Scheduler._step
    def _step(self):
        last.clear()
        t0 = time.perf_counter(); s0(self); dt = time.perf_counter() - t0
        rec.append((t0, dt, last.get("rows", 0), last.get("fwd", 0.0), last.get("pr", 0)))
        if len(rec) % 200 == 0:
            _dump()
    S.Scheduler._step = _step
    a0 = S.Scheduler._admit
    def _admit(self, ticket):
        t0 = time.perf_counter(); a0(self, ticket); dt = time.perf_counter() - t0
        rec.append((t0, dt, -1, 0.0, len(ticket.prompt_ids)))
    S.Scheduler._admit = _admit
    r0 = S.Scheduler._release
    def _release(self, ticket, *a, **kw):
        t0 = time.perf_counter(); r0(self, ticket, *a, **kw); dt = time.perf_counter() - t0
        rec.append((t0, dt, -2, 0.0, 0))
    S.Scheduler._release = _release
    def _dump():
        with open(f"{OUT}.{os.getpid()}", "w") as f:
            json.dump(rec, f)
    atexit.register(_dump)
if OUT:
    sys.meta_path.insert(0, _Hook())
