"""Per prompt: each method's decode speed-up over plain (same run), prompt and answer tokens, drafter seconds."""
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
methods = sys.argv[2].split(",") if len(sys.argv) > 2 else ["hybrid"]
plain = {r["prompt_id"]: r for r in recs if r["method"] == "plain"}
by = collections.defaultdict(dict)
for r in recs:
    by[r["method"]][r["prompt_id"]] = r
print("| prompt | prompt tokens | answer | " + " | ".join(f"{m} x plain | {m} draft s | {m} tau" for m in methods) + " |")
for pid, p in plain.items():
    cells = []
    for m in methods:
        r = by[m].get(pid)
        cells += [f"{r['tokens_per_s'] / p['tokens_per_s']:.2f}", f"{r['draft_s']:.2f}", f"{r['tau']:.2f}"] if r else ["", "", ""]
    print(f"| {p['task']} {pid} | {p['prompt_tokens']} | {p['tokens']} | " + " | ".join(cells) + " |")
for m in methods:
    rs = list(by[m].values())
    low = [f"{r['task']} {r['prompt_id']} {r['tokens_per_s'] / plain[r['prompt_id']]['tokens_per_s']:.2f}x" for r in rs
           if r["tokens_per_s"] / plain[r["prompt_id"]]["tokens_per_s"] < 0.95]
    print(f"{m}: below 0.95x plain: {', '.join(low) or 'none'}")
