"""Do a head's drafts during decoding equal what `rollout` (training/eval) predicts from the same states?"""
import sys, torch
import augury
from augury.proposers.heads import HeadProposer
from augury.models.head import pick_feature
from augury.train.objective import Batch, rollout
from augury.sampling import SamplingParams

head_dir, quant = sys.argv[1], sys.argv[2]
llm = augury.load(draft_method="eagle", head=head_dir, offline=True, adaptive=False, k=4, draft_quant=quant)
rec = {"fed": [], "drafts": []}
o_start, o_step, o_prop = HeadProposer.start, HeadProposer.on_step, HeadProposer.propose_batch
def start(self, seq, prompt_hidden=None):
    rec["fed"].append(pick_feature(self.config, prompt_hidden, self.head.target_config.hidden_size).float().clone())
    return o_start(self, seq, prompt_hidden)
def on_step(self, seq, result, hidden):
    rec["fed"].append(pick_feature(self.config, hidden, self.head.target_config.hidden_size).float().clone())
    return o_step(self, seq, result, hidden)
def propose_batch(self, seqs, ks):
    out = o_prop(self, seqs, ks)
    rec["drafts"].append((len(seqs[0].tokens), list(out[0].tokens)))
    return out
HeadProposer.start, HeadProposer.on_step, HeadProposer.propose_batch = start, on_step, propose_batch
head = llm.proposer.head
prompts = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "Explain why the sky is blue to a ten-year-old.",
           "Write a Python function that checks whether a string is a palindrome, with tests.",
           "Translate to French: The weather is nice today and we are going to the park."]
D = 4
inf_hit = [0]*D; inf_try = [0]*D; roll_hit = [0]*D; roll_try = [0]*D; agree = [0]*D; both = [0]*D
for p in prompts:
    rec["fed"].clear(); rec["drafts"].clear()
    ids = llm.encode([{"role": "user", "content": p}])
    res = llm.generate_ids(ids, SamplingParams(max_tokens=96))
    full = ids + res.token_ids
    states = torch.cat(rec["fed"])
    T = len(full)
    S = states.shape[0]
    st = torch.zeros(1, T, states.shape[1]); st[0, :S] = states
    tok = torch.tensor([full])
    b = Batch(tokens=tok, states=st.to(head.dtype if hasattr(head, "dtype") else torch.float32).float(), topk_ids=tok[..., None], topk_p=torch.ones(1, T, 1),
              lengths=torch.tensor([T]), starts=torch.tensor([len(ids)]))
    with torch.inference_mode():
        outs = rollout(head, b, D)
        pred = [head.weights.vocab[head.logits(y.to(head.dtype)).argmax(-1)][0] for y, _ in outs]  # [rows]
    for L, drafted in rec["drafts"]:
        j = L - 2
        ok = True
        for d, t in enumerate(drafted, start=1):
            if not ok or j + d + 1 >= T: break
            truth = full[j + d + 1]
            rp = int(pred[d-1][j])
            inf_try[d-1] += 1; inf_hit[d-1] += int(t == truth)
            agree[d-1] += int(t == rp)
            ok = t == truth
    # rollout's own alpha over the answer, as evaluate counts (chain conditional)
    for j in range(len(ids) - 1, T - 2):
        for d in range(1, D+1):
            if j + d + 1 >= T: break
            rp = int(pred[d-1][j]); truth = full[j + d + 1]
            roll_try[d-1] += 1; roll_hit[d-1] += int(rp == truth)
            if rp != truth: break
    print(p[:40], "tokens", len(res.token_ids), "states", S, "T", T, flush=True)
print("inference: drafted where chain so far true, hit rate by depth", [f"{h}/{n}" for h, n in zip(inf_hit, inf_try)])
print("inference draft == rollout prediction", [f"{a}/{n}" for a, n in zip(agree, inf_try)])
print("rollout conditional alpha on the same text", [f"{h}/{n}={h/max(n,1):.2f}" for h, n in zip(roll_hit, roll_try)])
