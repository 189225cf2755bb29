#!/usr/bin/env python3
"""Tables for bench/allreduce.sh: our all-reduce (tpuctl bench --json output)
next to the best anchor of each kind (OpenMPI/Gloo CSVs from the anchors'
run.sh), as ratios. Usage: allreduce_report.py OUT_DIR "2 4 8" [why-no-anchors]

Like for like: every figure is the per-op median (p50), the anchors' primary
figure (each rank's median of its back-to-back ops, the largest over ranks;
ours: each core's median of its iterations, the largest over cores), and both
are timed by the same policy (at least 200 ms of warm-up and 700 ms of ops per
size). busbw ratio = ours / best anchor (higher is better); time ratio = ours /
best anchor (lower is better); mean ratio = the same of the means (stalls
included). A JSON without p50 (an older tpuctl) falls back to its mean."""
import csv
import glob
import json
import os
import sys

SIZES = [4096, 65536, 1 << 20, 16 << 20, 64 << 20]
KINDS = {  # our transport -> the anchors it is measured against
    "tcp": ["mpi_tcp", "mpi_tcp_recdbl", "mpi_tcp_rabenseifner", "mpi_tcp_ring",
            "mpi_tcp_segring", "gloo_ring", "gloo_bcube"],
    "shm": ["mpi_vader"],
}


def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def load_ours(out, t, n):
    try:
        with open(os.path.join(out, f"ours.{t}.n{n}.json")) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return {r["size"]: r for r in d.get("rows", [])}


def load_anchors(out, n):
    rows = {}  # (label, bytes) -> (p50_us, busbw at p50, mean_us)
    for path in glob.glob(os.path.join(out, "anchors", f"*.n{n}.csv")):
        label = os.path.basename(path).rsplit(".n", 1)[0]
        with open(path) as f:
            lines = [l for l in f if not l.startswith("#")]
        for r in csv.DictReader(lines):
            try:
                rows[(label, int(r["bytes"]))] = (float(r["op_p50_us"]), float(r["busbw_p50_GBps"]),
                                                  float(r["op_mean_us"]))
            except (KeyError, ValueError):
                pass
    return rows


def best(anchors, labels, size, key):
    cands = [(v[key], l) for (l, b), v in anchors.items() if b == size and l in labels]
    if not cands:
        return None
    return min(cands) if key == 0 else max(cands)


def main():
    out, ns = sys.argv[1], sys.argv[2].split()
    why = sys.argv[3] if len(sys.argv) > 3 else ""
    if why:
        print(f"\n(anchors not run: {why}; our figures alone)")
    for t in ("tcp", "shm"):
        for n in ns:
            ours = load_ours(out, t, n)
            if ours is None:
                if os.path.exists(os.path.join(out, f"ours.{t}.n{n}.err")):
                    print(f"\n## {t}, n={n}: our run failed (see ours.{t}.n{n}.err)")
                continue
            anchors = load_anchors(out, n)
            labels = KINDS[t]
            print(f"\n## {t}, n={n}" + ("" if why else f"  (best anchor among {', '.join(labels)})"))
            hdr = ["size", "ours p50(us)", "busbw", "mean(us)", "iters", "algo", "check"]
            if not why:
                hdr += ["best anchor", "p50(us)", "busbw", "mean(us)", "busbw ratio", "time ratio", "mean ratio"]
            rows = [hdr]
            busf = 2.0 * (int(n) - 1) / int(n)
            for s in SIZES:
                r = ours.get(s)
                if not r:
                    continue
                p50 = r.get("time_p50_us") or r["time_us"]
                bus = s / (p50 * 1e3) * busf if p50 else 0.0
                row = [size_name(s), f"{p50:.1f}", f"{bus:.3f}", f"{r['time_us']:.1f}", str(r.get("iters", "")),
                       r.get("algorithm", ""), "ok" if r.get("correct") else "WRONG"]
                if not why:
                    key = 0 if s == 4096 else 1
                    b = best(anchors, labels, s, key)
                    if b is None:
                        row += ["-"] * 7
                    else:
                        tu, bw, mu = anchors[(b[1], s)]
                        rb = bus / bw if bw else float("nan")
                        rt = p50 / tu if tu else float("nan")
                        rm = r["time_us"] / mu if mu else float("nan")
                        row += [b[1], f"{tu:.1f}", f"{bw:.3f}", f"{mu:.1f}", f"{rb:.2f}x", f"{rt:.2f}x", f"{rm:.2f}x"]
                rows.append(row)
            w = [max(len(x[i]) for x in rows) for i in range(len(hdr))]
            for x in rows:
                print("  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip())


if __name__ == "__main__":
    main()
