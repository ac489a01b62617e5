"""Per forward of the target and the drafter during a hybrid generation: rows and ms. Usage: steptime.py PROMPT_ID [N]"""
import sys, time, collections
import augury
from augury.bench.suites import load_suite

pid = sys.argv[1]
suite = load_suite("spec-bench:2", cwd=__import__("pathlib").Path("/work/main"))
prompt = next(p for p in suite.prompts if p.id == pid)
llm = augury.load(offline=True)
plain = augury.load(llm.target, draft_method="plain")
ids = llm.encode([{"role": "user", "content": prompt.turns[0]}])
dec = llm.target.decoder
log = []
orig = dec.forward_rows
def timed(blocks, cache, *a, **kw):
    t = time.perf_counter(); out = orig(blocks, cache, *a, **kw)
    log.append((sum(len(b) for b in blocks), time.perf_counter() - t)); return out
dec.forward_rows = timed
for rep in range(2):
    log.clear(); t = time.perf_counter(); r0 = plain.generate_ids(ids, augury.SamplingParams(max_tokens=128)); tp = time.perf_counter() - t
    plog = list(log); log.clear()
    t = time.perf_counter(); r1 = llm.generate_ids(ids, augury.SamplingParams(max_tokens=128)); th = time.perf_counter() - t
    print(f"rep {rep}: plain {tp:.2f}s hybrid {th:.2f}s same={r0.token_ids == r1.token_ids}")
    print("  plain forwards:", len(plog), "median 1-row ms", sorted(x[1] for x in plog[1:])[len(plog)//2] * 1e3)
    by = collections.defaultdict(list)
    for rows, s in log[1:]:
        by[rows].append(s * 1e3)
    for rows in sorted(by):
        v = sorted(by[rows]); print(f"  hybrid {rows} rows: n {len(v)} median {v[len(v)//2]:.1f} ms  sum {sum(v):.0f} ms")
    print("  stats:", r1.stats.line() if hasattr(r1.stats, 'line') else r1.stats)

# drafter forward timing
dm = llm._engine.proposer.model
ddec = dm.decoder
dlog = []
dorig = ddec.forward
def dtimed(x, cache, *a, **kw):
    t = time.perf_counter(); out = dorig(x, cache, *a, **kw)
    dlog.append((tuple(x.shape), time.perf_counter() - t)); return out
ddec.forward = dtimed
llm2 = augury.load(llm.target, offline=True)  # fresh matcher
dm2 = llm2._engine.proposer.model
dm2.decoder.forward = dtimed
log.clear(); t = time.perf_counter(); r1 = llm2.generate_ids(ids, augury.SamplingParams(max_tokens=128)); th = time.perf_counter() - t
print(f"fresh hybrid {th:.2f}s; stats {r1.stats}")
by = collections.defaultdict(list)
for shp, s in dlog:
    by[shp].append(s * 1e3)
for shp in sorted(by):
    v = sorted(by[shp]); print(f"  draft forward {shp}: n {len(v)} median {v[len(v)//2]:.1f} ms sum {sum(v):.0f} ms")
gp = getattr(dm2, "guess_plan", None)
if gp is not None:
    from statistics import median
    print("guess plan: checked", gp.checked, "agreed", gp.agreed,
          "median ms by rows", {r: round(1e3 * median(v), 1) for r, v in gp.seconds.items() if v})
