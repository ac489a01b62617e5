"""Per run and arm: prompts after which the arm's model drafter never ran again (draft_s == 0 on every later
prompt whose prompt is under 100 tokens), a sign of a drafter priced out for the rest of the process."""
import collections, json, sys
for path in sys.argv[1:]:
    recs = [json.loads(l) for l in open(path)]
    by = collections.defaultdict(list)
    for r in recs:
        if r["method"] != "plain":
            by[r["method"]].append(r)
    for m, rs in by.items():
        short = [r for r in rs if r["prompt_tokens"] < 100]
        idle = [r for r in short[1:] if r["draft_s"] < 0.01]
        if len(idle) >= len(short) - 2:
            print(f"{path}: {m}: the 0.5B idle on {len(idle)} of {len(short) - 1} later short prompts")
