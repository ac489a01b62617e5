"""Would the matcher's continuation let the 0.5B draft several tokens per forward? Teacher-forced on the
target's greedy answers (records.jsonl of a bench run), for every answer position t: the matcher's draft m
(k=3) from tokens[:t+1]; one 0.5B forward over [x_t, m1, m2, m3] after a cache of tokens[:t]; the 0.5B's
greedy token at each row. Counts the leading agreements (drafter tokens a cascade forward would give).
Usage: cascade_probe.py RECORDS"""
import json, sys, collections, pathlib
import torch
import augury
from augury.bench.suites import load_suite
from augury.proposers.base import Sequence
from augury.proposers.suffix import SuffixProposer
from augury.sampling import SamplingParams

recs = [json.loads(l) for l in open(sys.argv[1])]
plain = {r["prompt_id"]: r["token_ids"][0] for r in recs if r["method"] == "plain"}
suite = load_suite("spec-bench:2", cwd=pathlib.Path("/work/main"))
llm = augury.load(offline=True)
dm = llm._engine.proposer.model
dec = dm.decoder
hist = collections.Counter(); agree_target = collections.Counter(); n_pos = 0; n_match = 0
d_target = 0
for p in suite.prompts:
    ids = llm.encode([{"role": "user", "content": p.turns[0]}])
    ans = plain[p.id]
    toks = ids + ans
    matcher = SuffixProposer(1)
    cache = dec.new_cache(1, len(toks) + 8)
    dec.forward(torch.tensor([ids[:-1]]), cache, logits_rows=slice(-1, None))
    for t in range(len(ids) - 1, len(toks) - 1):
        seq = Sequence(toks[: t + 1], SamplingParams(), prompt_len=len(ids), id=hash(p.id) & 0xffff)
        m = matcher.propose(seq, 3).tokens
        rows = [toks[t]] + m
        logits = dec.forward(torch.tensor([rows]), cache)
        g = logits[0].argmax(-1).tolist()
        cache.truncate([t + 1])
        n_pos += 1
        d_target += g[0] == toks[t + 1]
        if m:
            n_match += 1
            agree = 0
            while agree < len(m) and g[agree] == m[agree]:
                agree += 1
            hist[agree] += 1
            agree_target[m[0] == toks[t + 1]] += 1
        else:
            hist["none"] += 1
    print(p.id, "positions", n_pos, dict(hist), flush=True)
print("0.5B first-token agreement with target", d_target / n_pos)
print("matcher drafts at", n_match, "of", n_pos, "; m1 == target", agree_target[True] / max(n_match, 1))
tot = sum(v for k, v in hist.items() if k != "none")
print("leading agreements with the 0.5B (of matcher drafts):", {k: round(v / tot, 3) for k, v in hist.items() if k != "none"})
print("mean extra drafter tokens per forward over all positions:", sum(k * v for k, v in hist.items() if k != "none") / n_pos)
