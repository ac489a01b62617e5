import json, sys, glob, os
base = '/work/benchrun/s37/ab'
def load(d):
    recs = [json.loads(l) for l in open(f'{d}/records.jsonl')]
    plain = {r['prompt_id']: r for r in recs if r['method'] == 'plain'}
    hyb = {r['prompt_id']: r for r in recs if r['method'] == 'hybrid'}
    return plain, hyb
rows = []
for d in sorted(glob.glob(base + '/*-*-*-*')):
    if not os.path.isdir(d) or not os.path.exists(d + '/records.jsonl'): continue
    plain, hyb = load(d)
    ids = [i for i in plain if i in hyb]
    if len(ids) < 12: continue
    tp = sum(plain[i]['tokens'] for i in ids) / sum(plain[i]['seconds'] for i in ids)
    th = sum(hyb[i]['tokens'] for i in ids) / sum(hyb[i]['seconds'] for i in ids)
    ratios = {i: (hyb[i]['tokens'] / hyb[i]['seconds']) / (plain[i]['tokens'] / plain[i]['seconds']) for i in ids}
    worst = min(ratios, key=ratios.get)
    same = sum(hyb[i]['token_ids'] == plain[i]['token_ids'] for i in ids)
    short = [i for i in ids if plain[i]['tokens'] < 40]
    dfw_short = sum(hyb[i]['draft_forwards'] for i in short)
    print(f"{os.path.basename(d):24s} plain {tp:6.2f} hybrid {th/tp:5.2f}x  slowest {ratios[worst]:.2f} ({worst})  "
          f"below 0.95: {sum(r < 0.95 for r in ratios.values())}  short answers' drafter forwards {dfw_short}  "
          f"= plain {same}/12  " + ' '.join(f"{i}:{ratios[i]:.2f}" for i in ids))
