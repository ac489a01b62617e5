# Under NICE_HTTP=<n>, an `augury serve` process lowers its main thread's priority (the HTTP event loop) to
# nice n once it has started: the engine thread and the OpenMP workers keep theirs (an A/B aid).
import os, sys, threading, time
_n = os.environ.get("NICE_HTTP")
if _n and "serve" in sys.argv:
    _main = threading.main_thread().native_id
    def _later():
        time.sleep(25)
        os.setpriority(os.PRIO_PROCESS, _main, int(_n))
        print(f"sitecustomize: main thread {_main} at nice {_n}", file=sys.stderr, flush=True)
    threading.Thread(target=_later, daemon=True).start()
