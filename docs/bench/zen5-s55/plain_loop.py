import augury, torch, time
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
dec = llm.target.decoder
cache = dec.new_cache(1, 4096)
dec.forward(torch.randint(0, 1000, (1, 256)), cache)
tok = torch.tensor([[100]])
t = time.perf_counter()
for i in range(300):
    dec.forward(tok, cache); cache.truncate(256)
print("ms/forward", (time.perf_counter() - t) / 300 * 1e3)
