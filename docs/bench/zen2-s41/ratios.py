import json, sys, collections, statistics
for d in sys.argv[1:]:
    rs = [json.loads(l) for l in open(d + '/records.jsonl')]
    by = collections.defaultdict(dict)
    for r in rs: by[r['prompt_id']][r['method']] = r
    methods = sorted({r['method'] for r in rs} - {'plain'})
    tot = collections.defaultdict(lambda: [0.0, 0])
    per = collections.defaultdict(list)
    for pid, m in by.items():
        for k, v in m.items():
            tot[k][0] += v['seconds']; tot[k][1] += sum(len(t) for t in v['token_ids']) if v.get('token_ids') else 0
    p = by
    plain_rate = tot['plain'][1] / tot['plain'][0]
    print(d, 'plain %.2f tok/s' % plain_rate)
    for k in methods:
        rate = tot[k][1] / tot[k][0]
        ratios = []
        same = 0
        for pid, m in by.items():
            if k in m and 'plain' in m:
                ratios.append((m[k]['tokens_per_s'] / m['plain']['tokens_per_s'], m['plain']['task'] + ' ' + pid))
                same += m[k]['token_ids'] == m['plain']['token_ids']
        ratios.sort()
        tau = statistics.fmean(m[k]['tau'] for m in by.values() if k in m)
        print('  %-8s %.2fx decode  tau %.2f  equal %d/%d  slowest %s  below0.95: %d' % (
            k, rate / plain_rate, tau, same, len(ratios), ', '.join('%s %.2fx' % (n, r) for r, n in ratios[:3]),
            sum(r < 0.95 for r, _ in ratios)))
