"""Summarise trace.py's log (s37): drafter starts on short answers, and what a matcher draft's verification cost."""
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
req, kind, prev, by = 0, None, None, {}
for r in rows:
    if r['ev'] == 'request':
        req += 1
    elif r['ev'] == 'plan':
        probe = prev is not None and r['probes'] > prev
        prev, plan = r['probes'], r
    elif r['ev'] == 'draft':
        kind = 'model' if r['fw'] else 'free'
        if r['start_tok']:
            print(f"request {req}: drafter started at output token {plan['out']} for a {r['start_tok']}-token catch-up, "
                  f"{r['start_s']:.0f} ms ({'the warm-up' if plan['step'] <= 5 else 'a probe' if probe else 'the plan'}; plain step {plan['t1']} ms, expected left {plan['left']})")
    elif r['ev'] == 'step':
        if kind == 'free':
            by.setdefault(r['dr'], []).append((r['acc'], r['s']))
        kind = None
for d, v in sorted(by.items()):
    print(f"steps verifying {d} free (matcher) drafted tokens: {len(v)}, mean accepted {st.mean(a for a, _ in v):.2f}, "
          f"median step {st.median(s for _, s in v):.1f} ms")
