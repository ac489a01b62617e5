"""What verifying and committing costs per step, new (argmax alone) against old (one-hot rows), timed
inside the engine: greedy, the model drafter at K = 4 every step and plain decoding, 4 Spec-Bench-like
prompts, the two implementations alternating per generation. Prints ms per step of _verify_and_commit
(and _first_token) by arm, and the step's whole time for scale."""
import sys, time, statistics
sys.path.insert(0, "docs/bench/zen5-s52")
import augury
import augury.step as S
from ab_greedy import old_verify, old_first
new_verify, new_first = S._verify_and_commit, S._first_token
acc = {}
def timed(fn, key):
    def inner(*a, **kw):
        t = time.perf_counter(); r = fn(*a, **kw); acc[key] = acc.get(key, 0.0) + time.perf_counter() - t; return r
    return inner
prompts = ["Write a Python function that merges two sorted lists, with a docstring and two examples.",
           "Explain how a hash table handles collisions, in three short paragraphs.",
           "Summarize the plot of Hamlet in five sentences.",
           "Translate to French: The weather is nice today, and we are going to the park after lunch."]
for method in ("plain", "model"):
    llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method=method, k=4, adaptive=False, offline=True)
    llm.generate([{"role": "user", "content": prompts[0]}], max_tokens=16)
    res = {"new": [], "old": []}
    for rnd in range(3):
        for arm in ("new", "old") if rnd % 2 == 0 else ("old", "new"):
            S._verify_and_commit = timed(new_verify if arm == "new" else old_verify, "v")
            S._first_token = timed(new_first if arm == "new" else old_first, "v")
            for p in prompts:
                acc.clear()
                r = llm.generate([{"role": "user", "content": p}], max_tokens=128)
                st = r.stats
                res[arm].append((acc["v"] / (st.steps + 1) * 1e3, st.verify_s / st.steps * 1e3, r.token_ids))
    for arm in ("new", "old"):
        v = [x[0] for x in res[arm]]; s = [x[1] for x in res[arm]]
        print(f"{method} {arm}: verify+commit {statistics.median(v):.3f} ms a step (min {min(v):.3f}), whole step {statistics.median(s):.1f} ms")
    assert [x[2] for x in res["new"]] == [x[2] for x in res["old"]], "the two arms committed different tokens"
    print(method, "same tokens in both arms: yes")
