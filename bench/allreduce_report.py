#!/usr/bin/env python3
"""Tables for bench/allreduce.sh: our all-reduce (tpuctl bench --json output)
next to the best anchor of each kind (OpenMPI/Gloo CSVs from the anchors'
run.sh), as ratios. Usage: allreduce_report.py OUT_DIR "2 4 8" [why-no-anchors]

busbw ratio = ours / best anchor (higher is better); 4 KiB time ratio =
ours / best anchor (lower is better). Our time is the slowest core's average
per iteration of back-to-back runs; the anchors' is the per-op median (p50)."""
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
    rows = {}  # (label, bytes) -> (time_us, busbw)
    for path in glob.glob(os.path.join(out, "anchors", f"*.n{n}.csv")):
        label = os.path.basename(path).rsplit(".n", 1)[0]
        with open(path) as f:
            lines = [l for l in f if not l.startswith("#")]
        for r in csv.DictReader(lines):
            try:
                rows[(label, int(r["bytes"]))] = (float(r["op_p50_us"]), float(r["busbw_p50_GBps"]))
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
            hdr = ["size", "ours busbw", "ours time(us)", "algo", "check"]
            if not why:
                hdr += ["best anchor", "its busbw", "its time(us)", "busbw ratio", "time ratio"]
            rows = [hdr]
            for s in SIZES:
                r = ours.get(s)
                if not r:
                    continue
                row = [size_name(s), f"{r['busbw_gbps']:.3f}", f"{r['time_us']:.1f}",
                       r.get("algorithm", ""), "ok" if r.get("correct") else "WRONG"]
                if not why:
                    key = 0 if s == 4096 else 1
                    b = best(anchors, labels, s, key)
                    if b is None:
                        row += ["-", "-", "-", "-", "-"]
                    else:
                        tu, bw = anchors[(b[1], s)]
                        rb = r["busbw_gbps"] / bw if bw else float("nan")
                        rt = r["time_us"] / tu if tu else float("nan")
                        row += [b[1], f"{bw:.3f}", f"{tu:.1f}", f"{rb:.2f}x", f"{rt:.2f}x"]
                rows.append(row)
            w = [max(len(x[i]) for x in rows) for i in range(len(hdr))]
            for x in rows:
                print("  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip())


if __name__ == "__main__":
    main()
