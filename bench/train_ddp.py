#!/usr/bin/python3
"""The anchor of bench/train.sh: the same model trained by PyTorch's
DistributedDataParallel over Gloo on this machine, one process per core
(one thread each, as an emulated core's matrix unit runs), so that the
emulator's examples/s stand next to what a real data-parallel framework
does on the same CPUs.

Model: 784 -> Linear(128) -> ReLU -> Linear(10), Adam (lr 0.001), cross
entropy, under torch.autocast("cpu", bfloat16) as mixed_bfloat16 is (the
forward's matmuls in bfloat16 through oneDNN; what autocast leaves in
float32 runs on the BLAS Debian's alternatives point to), per-process
batch PER_CORE from synthetic rows shuffled once, warm-up steps, then the
measured seconds. Prints one line: "EXAMPLES_PER_SECOND STEPS".

  train_ddp.py --procs N --batch PER_CORE [--seconds S] [--warmup STEPS]

Needs Debian's python3-torch; without it prints "not installed" and exits 3.
"""
import argparse
import os
import socket
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, n, port, batch, seconds, warmup, out):
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.001)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(42 + rank)
    rows = 60000 // n
    x = torch.rand(rows, 784, generator=g)
    y = torch.randint(0, 10, (rows,), generator=g)
    perm = torch.randperm(rows, generator=g)
    pos, steps, t0 = 0, 0, None
    stop = torch.zeros(1)
    while True:
        if pos + batch > rows:
            perm, pos = torch.randperm(rows, generator=g), 0
        idx = perm[pos:pos + batch]
        pos += batch
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(ddp(xb), yb)
        loss.backward()
        opt.step()
        steps += 1
        if t0 is None and steps == warmup:
            dist.barrier()
            t0 = time.perf_counter()
            steps = 0
        elif t0 is not None and steps % 10 == 0:
            # every rank stops at the same step: rank 0 decides
            stop[0] = 1.0 if rank == 0 and time.perf_counter() - t0 >= seconds else 0.0
            dist.broadcast(stop, 0)
            if stop[0] > 0:
                break
    elapsed = time.perf_counter() - t0
    if rank == 0:
        out.put((steps, elapsed))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    if not (1 <= a.procs <= 64 and 1 <= a.batch <= 65536 and 0 < a.seconds <= 600 and 1 <= a.warmup <= 100000):
        ap.error("--procs 1..64, --batch 1..65536, --seconds up to 600, --warmup 1..100000")
    try:
        import torch  # noqa: F401
        import torch.multiprocessing as mp
    except ImportError:
        print("not installed")
        return 3
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a.procs, port, a.batch, a.seconds, a.warmup, q))
             for r in range(a.procs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=a.seconds + 120)
    if any(p.exitcode != 0 for p in procs) or q.empty():
        for p in procs:
            if p.is_alive():
                p.kill()
        print("failed", file=sys.stderr)
        return 1
    steps, elapsed = q.get()
    print(f"{steps * a.batch * a.procs / elapsed:.0f} {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
