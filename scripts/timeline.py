#!/usr/bin/env python3
"""Per-kernel slots of a decode step from a timeline CSV (docs/cuda.md, v13).

Record one with a diagnostic build on the GPU machine:
  cmake -B build-tl -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHOAL_CUDA_TIMELINE=ON && ninja -C build-tl cuda_kernels
  SHOAL_TIMELINE=tl.csv build-tl/bench/cuda_kernels --only qwen-f16
then: scripts/timeline.py tl.csv [graph index, default the last] [--all]

A kernel's blocks are told apart by their grid and by block indices repeating. For each kernel:
first arrival at the PDL wait, first and last release (us from the step's first arrival), how
many blocks arrived before the release ("early": resident while the previous kernel ran), and
its slot: from its release to the next kernel's release, i.e. its share of the step's critical
path. Marks (SHOAL_MARK in a kernel) are averaged per grid signature.
"""
import collections
import sys


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    graphs, cur = [], None
    for line in open(argv[1]):
        line = line.strip()
        if line.startswith('# graph'):
            cur = {'ms': float(line.split()[2]), 'r': [], 'm': []}
            graphs.append(cur)
        elif line and not line.startswith('arrive'):
            x = tuple(map(int, line.split(',')))
            if x[5] & 0x80000000:
                cur['m'].append((x[0], x[1], cur['r'][-1]))  # (time, id, the block's record)
            else:
                cur['r'].append(x)
    args = [a for a in argv[2:] if a != '--all']
    g = graphs[int(args[0]) if args else -1]
    recs = sorted(g['r'], key=lambda x: x[1])
    t0 = min(x[0] for x in recs)
    kernels, seen, sig = [], set(), None
    for x in recs:
        if (x[4], x[5]) != sig or x[3] in seen:
            kernels.append([])
            seen, sig = set(), (x[4], x[5])
        kernels[-1].append(x)
        seen.add(x[3])
    print(f"{g['ms']} ms per replay, {len(kernels)} kernels, {len(recs)} blocks")
    rows = []
    for i, k in enumerate(kernels):
        first_rel = min(x[1] for x in k)
        nxt = min(x[1] for x in kernels[i + 1]) if i + 1 < len(kernels) else None
        rows.append(dict(i=i, grid=k[0][4], threads=k[0][5], blocks=len(k),
                         arrive=(min(x[0] for x in k) - t0) / 1e3, release=(first_rel - t0) / 1e3,
                         last=(max(x[1] for x in k) - t0) / 1e3,
                         early=sum(1 for x in k if x[0] < first_rel - 200),
                         slot=(nxt - first_rel) / 1e3 if nxt else float('nan')))
    print('  # |   grid thr | arrive release   last (us) | early blocks | slot us')
    for r in rows:
        if '--all' in argv or r['i'] < 12 or r['i'] > len(rows) - 5:
            print(f"{r['i']:3d} | {r['grid']:6d} {r['threads']:3d} | {r['arrive']:7.2f} {r['release']:7.2f} "
                  f"{r['last']:7.2f} | {r['early']:5d} {r['blocks']:6d} | {r['slot']:7.2f}")
    agg = collections.defaultdict(list)
    for r in rows[:-1]:
        agg[(r['grid'], r['threads'])].append(r)
    print('grid thr: kernels, mean slot us, mean lead (release - arrival) us, early fraction')
    for k, v in agg.items():
        n = len(v)
        print(k, n, f"{sum(r['slot'] for r in v) / n:.2f}", f"{sum(r['release'] - r['arrive'] for r in v) / n:.2f}",
              f"{sum(r['early'] / r['blocks'] for r in v) / n:.2f}")
    if g['m']:
        index = {x: i for i, k in enumerate(kernels) for x in k}
        marks = collections.defaultdict(lambda: collections.defaultdict(list))
        for t, mid, owner in g['m']:
            r = rows[index[owner]]
            marks[(r['grid'], r['threads'])][mid].append((t - t0) / 1e3 - r['release'])
        print('marks: grid thr, id, count, mean us after the kernel\'s release, max')
        for k, d in marks.items():
            for mid in sorted(d):
                v = d[mid]
                print(k, mid, len(v), f"{sum(v) / len(v):.2f}", f"{max(v):.2f}")
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
