import time
from augury.models.loader import load_model
from augury.proposers import build_proposer
t = load_model("qwen2.5-coder-1.5b-instruct", offline=True, progress=False)
for q in ("auto", "q4_0", "auto", "q4_0"):
    t0 = time.time(); p = build_proposer("hybrid", t, draft="qwen2.5-coder-0.5b-instruct", draft_quant=q, offline=True); print(q, f"{time.time()-t0:.1f}s", p.model.decoder.weights.lm_head.shape, p.model.decoder.weights.lm_head.kinds)
