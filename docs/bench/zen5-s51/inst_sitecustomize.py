"""Instrumentation for a load test's `augury serve` processes: each engine step's start, end, decoding
sequences and forward time, and each admission's duration, appended to $AUGURY_INST_DIR/<pid>.tsv."""
import os, time
out = os.environ.get("AUGURY_INST_DIR")
if out:
    try:
        import augury.scheduler as sch
        f = open(os.path.join(out, f"{os.getpid()}.tsv"), "a", buffering=1)
        step0, admit0 = sch.Scheduler._step, sch.Scheduler._admit

        def _step(self):
            n = sum(1 for t in self._running if not t.request.prefilling)
            p = len(self._running) - n
            t0 = time.perf_counter()
            step0(self)
            f.write(f"step\t{t0:.6f}\t{time.perf_counter():.6f}\t{n}\t{p}\n")

        def _admit(self, ticket):
            t0 = time.perf_counter()
            admit0(self, ticket)
            f.write(f"admit\t{t0:.6f}\t{time.perf_counter():.6f}\t0\t0\n")

        sch.Scheduler._step, sch.Scheduler._admit = _step, _admit
    except Exception as exc:  # never break the server
        print("instrumentation off:", exc)
