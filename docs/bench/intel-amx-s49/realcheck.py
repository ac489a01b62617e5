import json, pathlib, torch
import augury
from augury.bench.suites import load_suite
from augury.proposers.base import Sequence
from augury.sampling import SamplingParams
suite = load_suite("spec-bench:2", cwd=pathlib.Path("/work/main"))
recs = [json.loads(l) for l in open("/work/benchrun/s48/final/greedy-avx512-1/records.jsonl")]
ans = {r["prompt_id"]: r["token_ids"][0] for r in recs if r["method"] == "plain"}
llm = augury.load(offline=True)
dm = llm._engine.proposer.model
p = next(p for p in suite.prompts if p.id == "81")
ids = llm.encode([{"role": "user", "content": p.turns[0]}])
bad = 0
for cut in range(0, 60, 3):
    toks = ids + ans["81"][:cut]
    s1 = Sequence(list(toks), SamplingParams(max_tokens=50)); dm.start(s1)
    d1 = dm.propose_batch([s1], [4])[0].tokens
    s2 = Sequence(list(toks), SamplingParams(max_tokens=50)); dm.start(s2)
    d2 = dm.propose_batch([s2], [4], lambda q, dr, n: d1[len(dr):len(dr)+n])[0].tokens
    s3 = Sequence(list(toks), SamplingParams(max_tokens=50)); dm.start(s3)
    d3 = dm.propose_batch([s3], [4], lambda q, dr, n: [(t + len(dr)) % 1000 for t in d1[len(dr):len(dr)+n]])[0].tokens
    if not (d1 == d2 == d3): bad += 1
    print(cut, d1, d2, d3, dm.forwards)
    for s in (s1, s2, s3): dm.finish(s)
print("mismatches", bad)
