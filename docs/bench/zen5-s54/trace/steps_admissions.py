"""Reads the step logs of sitecustomize.py (this folder's: steps, admissions marked -1, releases -2) and prints,
for the 16-client phase, what admissions and releases cost and the gaps between steps."""
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + ".*")):
    rec = sorted(json.load(open(p)))
    adm = [r for r in rec if r[2] == -1]; rel = [r for r in rec if r[2] == -2]; steps = [r for r in rec if r[2] >= 0]
    big = [r for r in steps if r[2] - r[4] >= 12]
    t0, t1 = big[0][0], big[-1][0]
    a = sorted(r[1] * 1e3 for r in adm if t0 <= r[0] <= t1); l = sorted(r[1] * 1e3 for r in rel if t0 <= r[0] <= t1)
    q = lambda xs, f: xs[int(f * (len(xs) - 1))]
    ss = [r for r in steps if t0 <= r[0] <= t1]
    gaps = sorted((ss[i + 1][0] - ss[i][0] - ss[i][1]) * 1e3 for i in range(len(ss) - 1))
    print(f"{p}: 16-client phase {t1 - t0:.1f} s; {len(a)} admissions, ms p50 {q(a, .5):.2f} p90 {q(a, .9):.2f} max {a[-1]:.2f}, "
          f"total {sum(a) / 1e3:.2f} s; {len(l)} releases, ms p50 {q(l, .5):.2f} p90 {q(l, .9):.2f}, total {sum(l) / 1e3:.2f} s; "
          f"gaps between steps total {sum(gaps) / 1e3:.2f} s, p90 {q(gaps, .9):.2f} ms")
