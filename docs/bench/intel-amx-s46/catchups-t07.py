from augury.bench.runner import EngineContender, encode_messages
from augury.bench.suites import load_suite
from augury.models.loader import load_model
from augury.proposers import build_proposer
from augury.sampling import SamplingParams
target = load_model("qwen2.5-coder-1.5b-instruct", offline=True)
arm = EngineContender(target, build_proposer("hybrid", target, {}), "hybrid", 4, adaptive=True)
pl = arm.engine.planner
prompts = {q.id: q for q in load_suite("spec-bench").prompts}
arm.generate([], target.tokenizer.encode("Hello"), SamplingParams(max_tokens=8, temperature=0.7, top_p=0.95, seed=1))
orig = pl.plan
log = []
def plan(reqs):
    ks = orig(reqs); r = reqs[0]
    log.append((len(r.seq.output), r.catch_up(), round(pl._catch_up_spread(r), 1), round(pl.costs.catch_up_time(r.catch_up()) * 1000), ks[0]))
    return ks
pl.plan = plan
for pid in ["81", "82", "161", "162", "241", "242", "321", "322", "401"]:
    log.clear()
    ids = encode_messages(target.tokenizer, [{"role": "user", "content": prompts[pid].turns[0]}], True)
    out = arm.generate([], ids, SamplingParams(max_tokens=128, temperature=0.7, top_p=0.95, seed=1))
    s = out.stats
    print(pid, len(ids), "draft_s", round(s.draft_s, 2), "tau", round(s.tau, 2), "catch_ups", [(n, round(t * 1000)) for n, t in list(pl.costs.catch_ups)[-3:]],
          "fwd", round(pl.costs._drafter_forward() * 1000, 1), "alpha", round(pl.alpha, 2), "plain", round(pl.costs.target_time(1, 1) * 1000, 1), flush=True)
print([x for i, x in enumerate(log) if i % 6 == 0])
