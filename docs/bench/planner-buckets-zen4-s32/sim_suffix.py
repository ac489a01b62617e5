"""Offline simulation of suffix drafting policies on recorded greedy outputs (not part of the repo)."""
import json, sys
from pathlib import Path
from augury.models.tokenizer import Tokenizer
from augury.bench.suites import load_suite
from augury.proposers.suffix import SuffixAutomaton, SuffixCorpus

folder = Path("/root/.cache/augury/converted/qwen2.5-coder-1.5b-instruct.gguf-ff09d4b9964b2cd4")
tok = Tokenizer.load(folder)
suite = load_suite("spec-bench:2")
records = [json.loads(l) for l in open(sys.argv[1])]
plain = {r["prompt_id"]: r["token_ids"][0] for r in records if r["method"] == "plain"}
curve = json.load(open(folder / "costs-a8bba1d98f52e932.json"))["rows_ms"]
c = {int(k): v for k, v in curve.items()}
corpus = SuffixCorpus()
events = []  # per prompt: list of (pos, own_len, corpus_len, draft, accepted)
for p in suite.prompts:
    ids = tok.encode_chat([{"role": "user", "content": p.turns[0]}])
    out = plain[p.id]
    own = SuffixAutomaton(); own.extend_all(ids)
    cs, cl = 0, 0
    for t in ids:
        cs, cl = corpus.automaton.follow(cs, cl, t)
    ev = []
    for j in range(len(out)):
        st, ln = own.repeated_suffix()
        best = max([(ln, 1, own, st), (cl, 0, corpus.automaton, cs)], key=lambda m: m[:2])
        draft = best[2].continuation(best[3], 8) if best[0] >= 1 else []
        a = 0
        while a < len(draft) and j + a < len(out) and draft[a] == out[j + a]:
            a += 1
        ev.append((best[0], draft, a))
        own.extend(out[j]); cs, cl = corpus.automaton.follow(cs, cl, out[j])
    corpus.add(out)
    events.append((p, ev, len(out)))

def run(policy):
    tot_t = tot_plain = 0.0
    per = []
    for p, ev, n in events:
        j, t = 0, 0.0
        while j < n:
            L, draft, a = ev[j]
            k = min(policy(L, len(draft)), len(draft), n - j - 1) if draft else 0
            k = max(k, 0)
            acc = min(a, k)
            t += c.get(1 + k, c[max(c)])
            j += acc + 1
        tot_t += t; tot_plain += n * c[1]; per.append(n * c[1] / t)
    return tot_plain / tot_t, min(per)

print("curve", c)
print("K0", run(lambda L, d: 0))
for K in (1, 2, 3, 4, 5, 7):
    print("always K", K, run(lambda L, d, K=K: K))
for Lmin in (2, 3, 4, 6, 8, 12, 16):
    for K in (2, 3, 4, 5, 7):
        print("L>=", Lmin, "K", K, run(lambda L, d, Lmin=Lmin, K=K: K if L >= Lmin else 0))
# acceptance by match-length bucket
import collections
b = collections.defaultdict(lambda: [0, 0, 0])
for p, ev, n in events:
    for L, d, a in ev:
        if d:
            key = min(L, 16).bit_length()
            b[key][0] += 1; b[key][1] += (a >= 1); b[key][2] += min(a, 4)
for k in sorted(b):
    n, a1, am = b[k]
    print("match bucket", 2 ** (k - 1), "steps", n, "alpha1 %.2f" % (a1 / n), "mean acc@4 %.2f" % (am / n))

# per-bucket policy: K by bucket octave
def by_bucket(Ks):
    return lambda L, d: Ks[min(max(L, 1), 16).bit_length() - 1]
for Ks in ((0, 2, 4, 4, 4), (1, 3, 4, 4, 4), (0, 3, 4, 7, 7), (1, 3, 4, 7, 7), (1, 4, 4, 4, 7), (0, 2, 4, 5, 7), (1,2,3,4,5)):
    print("by bucket", Ks, run(by_bucket(Ks)))
