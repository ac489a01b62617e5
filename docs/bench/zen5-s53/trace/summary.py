"""Reads the step logs sitecustomize.py wrote (steps.<pid>: wall start, wall seconds, forward rows, forward
seconds, prompt rows per step) and prints the step shapes and the 16-row steps' times."""
import collections, glob, json, statistics, sys
for path in sorted(glob.glob(sys.argv[1] + ".*")):
    rec = json.load(open(path))
    shapes = collections.Counter((rows - prompt, prompt > 0) for _, _, rows, _, prompt in rec)
    print(path, len(rec), "steps; (decode rows, with prompt rows):", shapes.most_common(8))
    full = [r for r in rec if r[4] == 0 and r[2] == 16]
    walls = sorted(r[1] * 1e3 for r in full)
    print(f"  16 decode rows, no prompt: {len(full)} steps, wall p50 {statistics.median(walls):.1f} p90 "
          f"{walls[int(0.9 * len(walls))]:.1f} max {walls[-1]:.1f} ms, forward p50 {statistics.median(r[3] for r in full) * 1e3:.1f} ms")
    mixed = [r for r in rec if r[4] > 0 and r[2] - r[4] >= 12]
    if mixed:
        print(f"  >= 12 decode rows with prompt rows: {len(mixed)} steps, prompt rows p50 {statistics.median(r[4] for r in mixed)} "
              f"max {max(r[4] for r in mixed)}, wall p50 {statistics.median(r[1] for r in mixed) * 1e3:.1f} ms")
