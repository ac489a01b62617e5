import sys, time, torch, augury
rows = int(sys.argv[1]); n = int(sys.argv[2]); ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 512
name = sys.argv[4] if len(sys.argv) > 4 else "qwen2.5-coder-1.5b-instruct"
llm = augury.load(name, draft_method="plain", offline=True)
dec = llm.target.decoder
cache = dec.new_cache(1, 4096)
dec.forward(torch.randint(0, 1000, (1, ctx)), cache)
for i in range(5):
    dec.forward(torch.randint(0, 1000, (1, rows)), cache); cache.truncate(ctx)
t = time.perf_counter()
for i in range(n):
    dec.forward(torch.randint(0, 1000, (1, rows)), cache); cache.truncate(ctx)
print(f"rows {rows} ctx {ctx}: {(time.perf_counter() - t) / n * 1e3:.2f} ms a forward")
