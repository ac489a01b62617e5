import sys, collections
import augury
from augury.planner import Planner
log = []
orig = Planner.prefers_matcher
def spy(self, matched, k):
    c = self.costs
    om = self._verified_odds(matched.bucket)
    rm = max(om.tokens(n) / c.target_time(1, n + 1) for n in range(len(matched) + 1))
    od = self.tally.odds()
    sd = c.target_time(1, k + 1) + od.drafted(k) * c.draft_round_time(1)
    log.append((matched.bucket, len(matched), k, round(rm, 1), round(od.tokens(k) / sd, 1), round(c.target_time(1,1)*1e3,1), round(c.target_time(1,k+1)*1e3,1), round(c.draft_round_time(1)*1e3,1), [round(a,2) for a in od.accept], [round(r,2) for r in od.reach]))
    return orig(self, matched, k)
Planner.prefers_matcher = spy
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="hybrid", offline=True)
r = llm.generate([{"role": "user", "content": "A train travels 60 km in 45 minutes. What is its average speed in km/h? Explain step by step."}], max_tokens=128)
print(r.stats.summary())
for row in log[:5] + log[-8:]:
    print(row)
print(collections.Counter((b, rm >= rd) for b, _, _, rm, rd, *_ in log))
