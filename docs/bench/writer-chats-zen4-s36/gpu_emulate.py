"""The GPU path's pieces on this CPU with the real 1.5B on the torch layer (bf16 weights, no native layer):
waves through the masked short blocks and the indexed ragged cache write, against rows attended alone."""
import time
from augury.models.loader import load_model
from augury.sampling import SamplingParams
from augury.train.writer import continue_batch

t = load_model("qwen2.5-coder-1.5b-instruct", offline=True, progress=False, weights="bf16")
print("native layer:", t.decoder.native is not None)
texts = ["Write a haiku about rain.", "What is 17 * 23?", "Explain recursion to a child in two sentences.",
         "Name three prime numbers.", "Translate 'good morning' into French.", "Give a Python one-liner that reverses a list.",
         "Why is the sky blue?", "List the planets.", "What does HTTP stand for?", "Summarize the plot of Hamlet in one line.",
         "Suggest a name for a cat.", "What is the capital of Australia?"]
prompts = [t.tokenizer.encode_chat([{"role": "user", "content": x}]) for x in texts]
out = {}
for masked in (False, True):
    t.decoder.masked_short_blocks = masked
    t0 = time.perf_counter()
    written, ended = continue_batch(t, prompts, 32, SamplingParams(max_tokens=32), None)
    out[masked] = written
    print(f"masked={masked}: {sum(map(len, written))} tokens in {time.perf_counter() - t0:.1f} s, ended {sum(ended)}/{len(ended)}")
same = sum(a == b for a, b in zip(out[False], out[True]))
print(f"identical continuations: {same}/{len(prompts)}")
for a, b in zip(out[False], out[True]):
    if a != b:
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if any(x != y for x, y in zip(a, b)) else min(len(a), len(b))
        print(f"  first difference at token {k} of {len(a)}/{len(b)}")
print(repr(t.tokenizer.decode(out[True][1])))
