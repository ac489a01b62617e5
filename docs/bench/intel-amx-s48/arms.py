"""Per arm of a bench run: decode speed-up over plain, tau, the drafter's seconds, its forwards and ms per forward,
and a plain step's ms (verify_s / steps of the plain arm). Usage: arms.py RUN_DIR..."""
import json
import sys
from collections import defaultdict

for run in sys.argv[1:]:
    rows = [json.loads(line) for line in open(f"{run}/records.jsonl")]
    by = defaultdict(list)
    for r in rows:
        by[r["method"]].append(r)
    plain = by["plain"]
    step_ms = 1000 * sum(r["verify_s"] for r in plain) / sum(r["steps"] for r in plain)
    rate = lambda rs: sum(r["tokens"] for r in rs) / sum(r["verify_s"] + r["draft_s"] + r["other_s"] for r in rs)
    base = rate(plain)
    per_prompt_plain = {r["prompt_id"]: r["tokens_per_s"] for r in plain}
    print(f"{run}: plain step {step_ms:.1f} ms, {base:.2f} tok/s")
    for method, rs in by.items():
        if method == "plain":
            continue
        draft_s = sum(r["draft_s"] for r in rs)
        forwards = sum(r["draft_forwards"] for r in rs)
        steps = sum(r["steps"] for r in rs)
        tau = sum(r["committed_in_steps"] for r in rs) / steps
        slow = min((r["tokens_per_s"] / per_prompt_plain[r["prompt_id"]], r["prompt_id"]) for r in rs)
        print(f"  {method:14s} {rate(rs) / base:.3f}x  tau {tau:.2f}  draft {draft_s:5.2f} s  forwards {forwards:5d}  "
              f"{1000 * draft_s / max(forwards, 1):5.1f} ms/forward ({draft_s * 1000 / max(forwards, 1) / step_ms:.2f} step)"
              f"  slowest {slow[0]:.2f} ({slow[1]})")
