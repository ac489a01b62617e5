"""The ski-rental rule where it matters: a long prompt with a short answer after requests with long answers.
One process: the target once, three engines (plain, hybrid with the s46 rule, hybrid with the old rule:
CATCH_UP_LOOKAHEAD unbounded), each fed the same prompts in the same order; per prompt the decode speed
against plain and the drafter's seconds. Usage: longfirst.py ID,ID,... (Spec-Bench question ids)."""
import sys

sys.path.insert(0, "/work/benchrun/s46")
from old_rule import make_old

from augury.bench.runner import EngineContender, encode_messages
from augury.bench.suites import load_suite
from augury.models.loader import load_model
from augury.proposers import build_proposer
from augury.sampling import SamplingParams

ids = sys.argv[1].split(",")
suite = load_suite("spec-bench")
prompts = {p.id: p for p in suite.prompts}
target = load_model("qwen2.5-coder-1.5b-instruct", offline=True)
arms = {"plain": EngineContender(target, None, "plain", 0)}
for name in ("hybrid", "hybrid-old"):
    arms[name] = EngineContender(target, build_proposer("hybrid", target, {}), name, 4, adaptive=True)
make_old(arms["hybrid-old"].engine.planner)
params = SamplingParams(max_tokens=128, temperature=0.0)
for name, arm in arms.items():  # warm-up, not recorded
    arm.generate([], target.tokenizer.encode("Hello"), SamplingParams(max_tokens=8, temperature=0.0))
for pid in ids:
    p = prompts[pid]
    ids_ = encode_messages(target.tokenizer, [{"role": "user", "content": p.turns[0]}], True)
    row = {}
    for name, arm in arms.items():
        out = arm.generate([], ids_, params)
        s = out.stats
        row[name] = (None, s, out.token_ids)
    base = row["plain"][1]
    cells = []
    for name in ("hybrid", "hybrid-old"):
        s = row[name][1]
        cells.append(f"{name} {s.tokens_per_s / base.tokens_per_s:.2f}x draft {s.draft_s:.2f}s "
                     f"same {row[name][2] == row['plain'][2]}")
    print(f"{p.task} {pid} prompt {len(ids_)} answer {len(row['plain'][2])}: " + "; ".join(cells), flush=True)
