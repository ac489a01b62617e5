import augury, cProfile, pstats, time, json, sys
temp = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method=(sys.argv[2] if len(sys.argv)>2 else "hybrid"), offline=True)
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
prompts = [q["turns"][0] for q in qs if q.get("category") in ("writing", "math_reasoning", "qa")][:1] + [qs[400]["turns"][0], qs[81]["turns"][0]]
kw = dict(max_tokens=128, temperature=temp, top_p=0.95 if temp else 1.0, seed=1)
llm.generate(prompts[0], max_tokens=16)
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
for p in prompts:
    r = llm.generate(p, **kw)
pr.disable()
print("wall", time.perf_counter() - t)
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
