"""How often a drafter's argmax equals the target's, teacher-forced over the target's own greedy answers to the
12 Spec-Bench prompts (the plain arm's token_ids in a bench run's records.jsonl): alpha1 measured without the
planner or the hybrid in the way. Drafter variants: its own blocks, Q4_0 by round to nearest, Q4_0 fitted.
Run with PYTHONPATH at the q40 worktree: agree.py RECORDS"""
import json
import sys
import time

import torch

from augury.bench.runner import encode_messages
from augury.bench.suites import load_suite
from augury.kernels import reference, requantize
from augury.kernels.weight import GgufWeight
from augury.models.loader import Model, load_model
from augury.models.low_bit import requantize_decoder

records = [json.loads(line) for line in open(sys.argv[1])]
plain = {r["prompt_id"]: r["token_ids"][0] for r in records if r["method"] == "plain"}
prompt_len = {r["prompt_id"]: r["prompt_tokens"] for r in records if r["method"] == "plain"}
suite = load_suite("spec-bench:2")
target = load_model("qwen2.5-coder-1.5b-instruct", offline=True, progress=False)
draft = load_model("qwen2.5-coder-0.5b-instruct", offline=True, progress=False, share_tokenizer=target.tokenizer)
VOCAB = 32768


def requantized_by(quantizer):
    def requantized(self, kind):
        dense = torch.cat([reference.affine_dequantize(d) for d in self.decoded()])
        return GgufWeight([(kind, quantizer(dense))], dtype=self.dtype, kernel=self.kernel or False)
    return requantized


variants = {"own blocks": draft.decoder.with_head_rows(VOCAB)}
fitted_requantized = GgufWeight.requantized
for name, method in (("q4_0 nearest", requantized_by(requantize.round_to_nearest)), ("q4_0 fitted", fitted_requantized)):
    GgufWeight.requantized = method
    t0 = time.time()
    variants[name] = requantize_decoder(draft.decoder.with_head_rows(VOCAB), "Q4_0")
    print(f"{name}: requantized in {time.time() - t0:.1f} s", flush=True)


def logits_of(decoder, ids):
    cache = decoder.new_cache(1, len(ids) + 8)
    return decoder.forward(torch.tensor([ids]), cache)[0].float()  # [T, V]


hits = {name: [0, 0] for name in variants}  # answer positions: agree, all
prompt_hits = {name: [0, 0] for name in variants}
for prompt in suite.prompts:
    if prompt.id not in plain:
        continue
    head = encode_messages(target.tokenizer, [{"role": "user", "content": prompt.turns[0]}], True)
    assert len(head) == prompt_len[prompt.id], (prompt.id, len(head), prompt_len[prompt.id])
    ids = head + plain[prompt.id]
    want = logits_of(target.decoder, ids).argmax(-1)  # [T]
    n = len(head)
    for name, decoder in variants.items():
        got = logits_of(decoder, ids)[:, :VOCAB].argmax(-1)
        same = got == want
        hits[name][0] += int(same[n - 1 : -1].sum()); hits[name][1] += len(ids) - n
        prompt_hits[name][0] += int(same[: n - 1].sum()); prompt_hits[name][1] += n - 1
    print(prompt.id, {k: round(v[0] / max(v[1], 1), 3) for k, v in hits.items()}, flush=True)
for name in variants:
    a, b = hits[name]
    c, d = prompt_hits[name]
    print(f"{name:14s} answers {a}/{b} = {a / b:.3f}   prompts {c}/{d} = {c / d:.3f}")
