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


def cells(out, t, n, labels, with_anchors):
    """Per size: our p50/mean/iters/algo/check and the best anchor's figures
    with the ratios; None when our run failed or is missing."""
    ours = load_ours(out, t, n)
    if ours is None:
        return None
    anchors = load_anchors(out, n) if with_anchors else {}
    busf = 2.0 * (int(n) - 1) / int(n)
    res = {}
    for s in SIZES:
        r = ours.get(s)
        if not r:
            continue
        p50 = r.get("time_p50_us") or r["time_us"]
        c = {"p50": p50, "bus": s / (p50 * 1e3) * busf if p50 else 0.0, "mean": r["time_us"],
             "iters": r.get("iters", ""), "algo": r.get("algorithm", ""), "ok": bool(r.get("correct"))}
        b = best(anchors, labels, s, 0 if s == 4096 else 1) if with_anchors else None
        if b is not None:
            tu, bw, mu = anchors[(b[1], s)]
            c.update(label=b[1], a_p50=tu, a_bus=bw, a_mean=mu,
                     rb=c["bus"] / bw if bw else float("nan"), rt=p50 / tu if tu else float("nan"),
                     rm=r["time_us"] / mu if mu else float("nan"))
        res[s] = c
    return res


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def show(rows):
    w = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    for x in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip())


def main():
    out, ns = sys.argv[1], sys.argv[2].split()
    why = sys.argv[3] if len(sys.argv) > 3 else ""
    rounds = sorted((d for d in glob.glob(os.path.join(out, "r[0-9]*")) if os.path.isdir(d)),
                    key=lambda d: int(os.path.basename(d)[1:]))
    dirs = rounds or [out]
    if why:
        print(f"\n(anchors not run: {why}; our figures alone)")
    if len(dirs) > 1:
        print(f"\n(medians over {len(dirs)} rounds, ours and then the anchors in each; "
              "'ratio range': the busbw ratio's lowest and highest round)")
    for t in ("tcp", "shm"):
        labels = KINDS[t]
        for n in ns:
            per = [cells(d, t, n, labels, not why) for d in dirs]
            if any(p is None for p in per):
                bad = [d for d, p in zip(dirs, per) if p is None]
                print(f"\n## {t}, n={n}: our run failed (see ours.{t}.n{n}.err in {', '.join(bad)})")
                continue
            print(f"\n## {t}, n={n}" + ("" if why else f"  (best anchor among {', '.join(labels)})"))
            hdr = ["size", "ours p50(us)", "busbw", "mean(us)", "iters", "algo", "check"]
            if not why:
                hdr += ["best anchor", "p50(us)", "busbw", "mean(us)", "busbw ratio", "time ratio", "mean ratio"]
                if len(dirs) > 1:
                    hdr += ["ratio range"]
            rows = [hdr]
            for s in SIZES:
                cs = [p[s] for p in per if s in p]
                if not cs:
                    continue
                algos = sorted({c["algo"] for c in cs})
                row = [size_name(s), f"{med([c['p50'] for c in cs]):.1f}", f"{med([c['bus'] for c in cs]):.3f}",
                       f"{med([c['mean'] for c in cs]):.1f}", str(cs[0]["iters"]) if len(cs) == 1 else "-",
                       "/".join(algos), "ok" if all(c["ok"] for c in cs) else "WRONG"]
                if not why:
                    ac = [c for c in cs if "label" in c]
                    if not ac:
                        row += ["-"] * (8 if len(dirs) > 1 else 7)
                    else:
                        names = [c["label"] for c in ac]
                        row += [max(set(names), key=names.count), f"{med([c['a_p50'] for c in ac]):.1f}",
                                f"{med([c['a_bus'] for c in ac]):.3f}", f"{med([c['a_mean'] for c in ac]):.1f}",
                                f"{med([c['rb'] for c in ac]):.2f}x", f"{med([c['rt'] for c in ac]):.2f}x",
                                f"{med([c['rm'] for c in ac]):.2f}x"]
                        if len(dirs) > 1:
                            row += [f"{min(c['rb'] for c in ac):.2f}-{max(c['rb'] for c in ac):.2f}x"]
                rows.append(row)
            show(rows)


if __name__ == "__main__":
    main()
