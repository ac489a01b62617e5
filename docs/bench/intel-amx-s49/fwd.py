"""Per prompt and arm: drafted tokens, drafter forwards, drafted per forward, draft seconds. Usage: fwd.py RUN_DIR"""
import json, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/records.jsonl")]
tot = defaultdict(lambda: [0, 0, 0.0])
for r in rows:
    if r["method"] == "plain":
        continue
    t = tot[r["method"]]; t[0] += r["drafted"]; t[1] += r["draft_forwards"]; t[2] += r["draft_s"]
    print(f"{r['prompt_id']:>4} {r['method']:15s} drafted {r['drafted']:4d} forwards {r['draft_forwards']:4d} draft {r['draft_s']:5.2f}s steps {r['steps']:4d}")
for m, (d, f, s) in tot.items():
    print(f"{m:15s} drafted {d} forwards {f} draft {s:.2f}s  ms/drafted {1e3 * s / max(d, 1):.1f}")
