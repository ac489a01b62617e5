"""Where a sampled step's time goes outside the target's forward: _verify_and_commit's share per step,
T 0.7 top-p 0.95 seed 1, hybrid (the default) and plain, 4 prompts; cProfile of the verification."""
import sys, time, statistics, cProfile, pstats
import augury
import augury.step as S
acc = {}
v0 = S._verify_and_commit
pr = cProfile.Profile()
def timed(*a, **kw):
    t = time.perf_counter(); pr.enable(); r = v0(*a, **kw); pr.disable(); acc["v"] = acc.get("v", 0.0) + time.perf_counter() - t; return r
S._verify_and_commit = timed
prompts = ["Write a Python function that merges two sorted lists, with a docstring and two examples.",
           "Explain how a hash table handles collisions, in three short paragraphs.",
           "Summarize the plot of Hamlet in five sentences.",
           "Translate to French: The weather is nice today, and we are going to the park after lunch."]
for method in ("plain", "hybrid"):
    llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method=method, k=4, offline=True)
    llm.generate([{"role": "user", "content": prompts[0]}], max_tokens=16)
    rows = []
    for p in prompts:
        acc.clear()
        r = llm.generate([{"role": "user", "content": p}], max_tokens=128, temperature=0.7, top_p=0.95, seed=1)
        st = r.stats
        rows.append((acc["v"] / st.steps * 1e3, st.verify_s / st.steps * 1e3, st.draft_s / st.steps * 1e3, st.tau))
    for v, s, d, tau in rows:
        print(f"{method}: verify+commit {v:.2f} ms a step, step {s:.1f} ms, drafting {d:.1f} ms a step, tau {tau:.2f}")
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
