"""Does turn 2's prompt start with turn 1's prompt + reply tokens (what a prefix cache could serve)?"""
import json, augury
llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="plain", offline=True)
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
FOLLOW_UP = "Thank you. Now explain the most important step of that in more detail."
for q in qs[:4]:
    m1 = [{"role": "user", "content": q["turns"][0]}]
    ids1 = llm.encode(m1, chat=True)
    r = llm.generate(m1, max_tokens=64)
    out = r.token_ids if hasattr(r, "token_ids") else None
    text = r.text
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UP}]
    ids2 = llm.encode(m2, chat=True)
    seq1 = ids1 + list(out)
    common = 0
    while common < min(len(seq1), len(ids2)) and seq1[common] == ids2[common]:
        common += 1
    print(f"prompt1 {len(ids1)} out {len(out)} turn2 {len(ids2)} common {common} (prompt1+out {len(seq1)})",
          "| diverge at", seq1[common:common+3], ids2[common:common+3])
