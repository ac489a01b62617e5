# Under GC_TRACE=<prefix>, an `augury serve` process times the collector's passes (gc.callbacks) and writes
# count and seconds by generation to <prefix>.<method>.<pid>.json every 50 passes (an A/B aid).
import gc, json, os, sys, time
_out = os.environ.get("GC_TRACE")
if _out and "serve" in sys.argv:
    _method = sys.argv[sys.argv.index("--draft-method") + 1] if "--draft-method" in sys.argv else "?"
    _st = {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0], "max_s": 0.0, "collected": 0}
    _t0 = [0.0]
    def _cb(phase, info):
        if phase == "start":
            _t0[0] = time.perf_counter()
            return
        d = time.perf_counter() - _t0[0]
        g = info["generation"]
        _st["n"][g] += 1
        _st["s"][g] += d
        _st["max_s"] = max(_st["max_s"], d)
        _st["collected"] += info.get("collected", 0)
        if sum(_st["n"]) % 50 == 0:
            with open(f"{_out}.{_method}.{os.getpid()}.json", "w") as f:
                json.dump(_st, f)
    gc.callbacks.append(_cb)
