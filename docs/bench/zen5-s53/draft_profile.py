"""Where the model drafter's time goes, greedy and T 0.7 (top-p 0.95, seed 1): cProfile of propose_batch
over 3 prompts of 128 tokens, method model K 4, tottime of the heaviest calls. Usage: draft_profile.py [t07]"""
import sys, cProfile, pstats
import augury
from augury.proposers import draft_model as D
pr = cProfile.Profile()
p0 = D.DraftModelProposer.propose_batch
def wrapped(self, *a, **kw):
    pr.enable(); r = p0(self, *a, **kw); pr.disable(); return r
D.DraftModelProposer.propose_batch = wrapped
sampled = "t07" in sys.argv[1:]
kw = dict(temperature=0.7, top_p=0.95, seed=1) if sampled else {}
prompts = ["Write a Python function that merges two sorted lists, with a docstring and two examples.",
           "Explain how a hash table handles collisions, in three short paragraphs.",
           "Summarize the plot of Hamlet in five sentences."]
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="model", k=4, offline=True)
llm.generate([{"role": "user", "content": prompts[0]}], max_tokens=16)
pr = cProfile.Profile()
for p in prompts:
    r = llm.generate([{"role": "user", "content": p}], max_tokens=128, **kw)
    st = r.stats
    print(f"steps {st.steps} tau {st.tau:.2f} verify {st.verify_s / st.steps * 1e3:.1f} ms/step draft {st.draft_s / st.steps * 1e3:.1f} ms/step drafted {st.drafted} -> {st.draft_s / max(1, st.drafted) * 1e3:.2f} ms a drafted token")
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
