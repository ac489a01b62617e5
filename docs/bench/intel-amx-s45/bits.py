"""Logits of a 512-token prefill and 1/5/33-row blocks after it (saved to argv[1]) for bitwise before/after checks."""
import sys, torch
from augury.models.loader import load_model
from augury.costs import slots_for
model = load_model(sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b-instruct", offline=True)
dec = model.decoder
gen = torch.Generator().manual_seed(0)
out = {}
cache = dec.new_cache(1, slots_for(300, 40))
out["prefill"] = dec.forward(torch.randint(0, model.config.vocab_size, (1, 300), generator=gen), cache)
for t in (1, 5, 33):
    out[t] = dec.forward(torch.randint(0, model.config.vocab_size, (1, t), generator=gen), cache); cache.truncate(300)
torch.save(out, sys.argv[1])
