"""cProfile of Scheduler._admit with a prefix cache: 16 prompts, then the same 16 again (cache hits)."""
import threading, time, cProfile, pstats
import augury
from augury.scheduler import Scheduler, SchedulerConfig
from augury.sampling import SamplingParams
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
sc = Scheduler(llm.target, None, SchedulerConfig(max_batch=16, prefix_cache_bytes=1 << 28))
pr = cProfile.Profile()
a0 = Scheduler._admit
times = []
def _admit(self, t):
    pr.enable(); t0 = time.perf_counter(); a0(self, t); times.append(time.perf_counter() - t0); pr.disable()
Scheduler._admit = _admit
sc.start()
prompts = [f"Explain, step by step and with an example, how Python list number {i} can be sorted by a key function that looks at nested tuples and dictionaries." for i in range(16)]
for rnd in range(2):
    done = threading.Event(); left = [16]; lock = threading.Lock()
    def on_event(ev):
        if type(ev).__name__ in ("Finished", "Failed"):
            with lock:
                left[0] -= 1
                if left[0] == 0: done.set()
    for p in prompts:
        sc.submit(llm.encode(p, chat=True), SamplingParams(max_tokens=8), on_event)
    done.wait(300)
sc.stop()
print("admissions ms:", " ".join(f"{t*1e3:.2f}" for t in times))
pstats.Stats(pr).sort_stats("cumtime").print_stats(25)
