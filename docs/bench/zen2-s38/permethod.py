import json, sys, collections
recs=[json.loads(l) for l in open(sys.argv[1])]
by=collections.defaultdict(list)
for r in recs: by[r['method']].append(r)
plain={r['prompt_id']:r for r in by['plain']}
step_ms = sum(r['verify_s'] for r in by['plain'])/sum(r['target_forwards'] for r in by['plain'])*1000
print(f"plain ms per target step (decode): {step_ms:.1f}")
for m,rs in by.items():
    if m=='plain' or rs[0]['kind']!='augury': continue
    dr=sum(r['drafted'] for r in rs); st=sum(r['steps'] for r in rs); ds=sum(r['draft_s'] for r in rs); df=sum(r['draft_forwards'] for r in rs)
    ratios=[]
    for r in rs:
        p=plain[r['prompt_id']]
        ratios.append((r['tokens_per_s']/p['tokens_per_s'], r['task'], r['prompt_id']))
    ratios.sort()
    low=[f"{t} {i} {x:.2f}x" for x,t,i in ratios if x<0.95]
    print(f"{m}: drafted/step {dr/st:.2f}; ms/drafted token {1000*ds/max(dr,1):.1f} ({1000*ds/max(dr,1)/step_ms:.3f} of a step); draft forwards {df}; below 0.95x: {', '.join(low) or 'none'}")
