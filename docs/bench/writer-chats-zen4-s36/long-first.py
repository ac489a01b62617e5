"""The chat suite of section 23a, built at run time from Spec-Bench in place (never copied into the repository):
its first two summarization and first two RAG questions, first turns only, into a JSONL file for --suite."""
import json
import sys

rows = [json.loads(line) for line in open("../shared/data/spec_bench/question.jsonl")]
picked = [r for r in rows if r["category"] == "summarization"][:2] + [r for r in rows if r["category"] == "rag"][:2]
with open(sys.argv[1], "w") as out:
    for r in picked:
        out.write(json.dumps({"question_id": r["question_id"], "category": r["category"], "turns": r["turns"][:1]}) + "\n")
