"""s33: the 0.5B model drafter with layers left out: alpha by position and cost, fixed K and planned K."""
import sys, time, json
from augury.api import LLM
from augury.models.loader import load_model
from augury.proposers import build_proposer
from augury.bench.suites import load_suite
from augury.sampling import SamplingParams

adaptive = sys.argv[1] == "planned"
variants = sys.argv[2].split(";")
target = load_model("qwen2.5-coder-1.5b-instruct", offline=True)
prompts = load_suite("spec-bench:2", cwd=None).prompts
params = SamplingParams(max_tokens=int(sys.argv[3]) if len(sys.argv) > 3 else 64)
plain = LLM(target, None)
ids = [plain.encode([{"role": "user", "content": p.turns[0]}]) for p in prompts]
def run(llm):
    tot = None; outs = []
    for x in ids:
        r = llm.generate_ids(x, params)
        outs.append(r.token_ids if hasattr(r, "token_ids") else r.tokens)
        tot = r.stats if tot is None else tot.merge(r.stats)
    return tot, outs
for rep in range(2):
    base, base_out = run(plain)
    print(f"rep {rep} plain: {base.generated_tokens / base.decode_s:.2f} tok/s decode  step {1000*base.verify_s/max(base.steps,1):.1f} ms", flush=True)
    for v in variants:
        opts = {} if v == "none" else {"draft_skip_layers": v}
        prop = build_proposer("model", target, opts, offline=True)
        llm = LLM(target, prop, k=4, method="model", adaptive=adaptive)
        s, out = run(llm)
        same = sum(a == b for a, b in zip(out, base_out))
        tps = s.generated_tokens / s.decode_s
        print(f"rep {rep} skip {v}: {tps:.2f} tok/s ({tps / (base.generated_tokens / base.decode_s):.2f}x) tau {s.tau:.2f} "
              f"alpha {' '.join(f'{a:.2f}' for a in s.acceptance_by_position)} drafted {s.drafted} steps {s.steps} "
              f"ms/drafted {1000*s.draft_s/max(s.drafted,1):.1f} ms/verify {1000*s.verify_s/max(s.steps,1):.1f} same {same}/{len(ids)}", flush=True)
