import augury, torch, time, statistics
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
dec = llm.target.decoder
w = dec.weights
head = w.lm_head
print(type(head), head.nbytes/1e6, "MB")
x = torch.randn(1, 1536)
for rows in (1, 5):
    xr = torch.randn(rows, 1536)
    ts=[]
    for i in range(40):
        t=time.perf_counter(); y = head.linear(xr, None) if hasattr(head,"linear") else None; ts.append(time.perf_counter()-t)
    print("head rows", rows, f"median {statistics.median(ts[5:])*1e3:.2f} ms min {min(ts)*1e3:.2f}", "GB/s", round(head.nbytes/min(ts)/1e9,1))
l = w.layers[0]
for name, v in vars(l).items():
    if hasattr(v, "nbytes") and hasattr(v, "linear") and v.nbytes > 1e6:
        xr = torch.randn(1, v.n_in if hasattr(v,"n_in") else 1536)
        try:
            ts=[]
            for i in range(40):
                t=time.perf_counter(); v.linear(xr, None); ts.append(time.perf_counter()-t)
            print(name, v.nbytes/1e6, f"min {min(ts)*1e3:.3f} ms", "GB/s", round(v.nbytes/min(ts)/1e9,1))
        except Exception as e:
            print(name, "err", e)
