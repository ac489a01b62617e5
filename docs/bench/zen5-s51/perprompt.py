import json, sys
rows=[json.loads(l) for l in open(sys.argv[1])]
by={}
for r in rows: by.setdefault(r['prompt_id'],{})[r['method']]=r
meth = sys.argv[2] if len(sys.argv)>2 else 'hybrid'
print("pid task ptok ntok | plain ms/tok | %s: steps fwd dfwd drafted acc draft_s verify_s ms/dfwd ms/fwd ratio" % meth)
for pid,m in by.items():
    p=m['plain']; h=m[meth]
    pm=p['verify_s']/p['steps']*1000
    dfm = h['draft_s']/h['draft_forwards']*1000 if h['draft_forwards'] else 0
    vf = h['verify_s']/h['steps']*1000
    print(pid, p['task'][:8], p['prompt_tokens'], p['tokens'], '|', round(pm,1), '|', h['steps'], h['target_forwards'], h['draft_forwards'], h['drafted'], h['accepted'], round(h['draft_s'],2), round(h['verify_s'],2), round(dfm,1), round(vf,1), round(h['tokens_per_s']/p['tokens_per_s'],2))
