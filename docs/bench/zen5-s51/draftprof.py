"""Where a model drafter's round goes: cProfile of fixed-K model drafting on two prompts.
Usage: draftprof.py [METHOD] [t07]  (t07: temperature 0.7, top-p 0.95, seed 1; else greedy)"""
import cProfile, pstats, sys, time
import augury
method = sys.argv[1] if len(sys.argv) > 1 else "model"
kw = dict(temperature=0.7, top_p=0.95, seed=1) if sys.argv[2:] == ["t07"] else {}
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method=method, k=4, adaptive=False, offline=True)
prompts = ["Write a Python function that merges two sorted lists, with a docstring and two examples.",
           "Explain how a hash table handles collisions, in three short paragraphs."]
for p in prompts:  # warm
    llm.generate([{"role": "user", "content": p}], max_tokens=32)
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
for p in prompts:
    r = llm.generate([{"role": "user", "content": p}], max_tokens=128, **kw)
    print(r.stats if hasattr(r, "stats") else r)
pr.disable()
print("wall", time.perf_counter() - t)
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(45)
st.sort_stats("tottime").print_stats(25)
