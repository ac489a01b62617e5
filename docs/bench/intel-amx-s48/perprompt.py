"""Per prompt of a bench run: each arm's decode rate over plain's, tau, drafting seconds. Usage: perprompt.py RUN_DIR"""
import json
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(f"{sys.argv[1]}/records.jsonl")]
by = defaultdict(dict)
for r in rows:
    by[r["prompt_id"]][r["method"]] = r
methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "plain"]
print("prompt tokens " + "  ".join(f"{m:>28s}" for m in methods))
for pid, arms in by.items():
    plain = arms["plain"]["tokens_per_s"]
    cells = []
    for m in methods:
        r = arms[m]
        cells.append(f"{r['tokens_per_s'] / plain:5.2f}x tau {r['steps'] and r['committed_in_steps'] / r['steps']:4.2f} d {r['draft_s']:4.2f}s")
    print(f"{arms['plain']['task'][:5]} {pid:>4s} {arms['plain']['tokens']:4d} " + "  ".join(f"{c:>28s}" for c in cells))
