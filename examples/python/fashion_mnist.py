#!/usr/bin/python3
"""examples/fashion_mnist.c in Python, on the tpuemu package's C layer (one
call of the library for each of the C program's): the walk-through's
"Putting It All Together" with the C example's recipe. With the same flags,
seed and --deterministic it trains bit for bit as the C binary does
(--history writes the same epochs' losses and accuracies).

  fashion_mnist.py [--tpu ADDR] [--epochs N] [--data DIR] [--logdir DIR]
                   [--learning-rate LR] [--lr-schedule cosine|exponential|constant]
                   [--warmup-epochs N] [--decay-rate R] [--deterministic] [--seed N]
                   [--checkpoint FILE [--checkpoint-every N]] [--history FILE]

With --checkpoint it acts on a preemption or maintenance notice as the C
program does: the checkpoint is saved and it exits with status 42; started
again with the same flags, it goes on from there. (The C program's --recover
and --elastic are not ported.)
"""
import argparse
import math
import os
import sys

import numpy as np

import tpuemu
from tpuemu import errors, lib

EXIT_PREEMPTED = 42


def main():
    ap = argparse.ArgumentParser(description="the walk-through's example on the emulated pod")
    ap.add_argument("--tpu", default=None)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--logdir", default="logs")
    ap.add_argument("--learning-rate", type=float, default=0.0)
    ap.add_argument("--lr-schedule", choices=("cosine", "exponential", "constant"), default="cosine")
    ap.add_argument("--warmup-epochs", type=int, default=1)
    ap.add_argument("--decay-rate", type=float, default=0.7)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--checkpoint")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--history")
    a = ap.parse_args()
    if not 1 <= a.epochs <= 1000:
        ap.error("--epochs: a number from 1 to 1000")

    # data: floats in [0, 1] and int32 class ids, as the C program reads them
    f32 = np.float32
    scale = f32(1.0) / f32(255.0)
    x_train = tpuemu.idx_images(os.path.join(a.data, "train-images-idx3-ubyte.gz"), scale)
    y_train = tpuemu.idx_labels(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))
    x_test = tpuemu.idx_images(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"), scale)
    y_test = tpuemu.idx_labels(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))

    # 1. TPU setup
    resolver = tpuemu.Resolver(a.tpu)
    cluster = tpuemu.Cluster(resolver)
    topology = cluster.initialize_system()
    strategy = tpuemu.Strategy(cluster)
    replicas = strategy.num_replicas_in_sync
    print("Running on %s with %d replicas (%s)" % (resolver.master(), replicas, topology.tpu_type), flush=True)

    # 2. performance settings; 3. the input pipeline
    batch_size = 128 * replicas
    n_train = x_train.shape[0]
    train = tpuemu.Dataset(x_train, y_train).shuffle(n_train, 1).batch(batch_size, True).prefetch(-1)
    test = tpuemu.Dataset(x_test, y_test).batch(batch_size, False).prefetch(-1)

    # 4. the model, in the strategy, with the C program's learning-rate recipe
    model = tpuemu.Model(strategy, 784, [(128, "relu"), (10, "softmax")], seed=a.seed)
    steps_per_epoch = n_train // batch_size
    total = steps_per_epoch * a.epochs
    warmup = steps_per_epoch * min(a.warmup_epochs, a.epochs - 1)
    lr = float(f32(a.learning_rate))
    if not lr > 0:
        lr = float(f32(0.001) * np.sqrt(f32(batch_size) / f32(128.0))) if a.lr_schedule == "constant" \
            else float(f32(0.001) * f32(batch_size) / f32(32.0))
    det = ", deterministic" if a.deterministic else ""
    if a.lr_schedule == "cosine":
        sched = lib.tpu_cosine_decay_warmup(0.0, total - warmup, 0.0, lr, warmup) if warmup else \
            lib.tpu_cosine_decay(lr, total, 0.0)
        opt = lib.tpu_optimizer_adam_schedule(sched)
        print("global batch %d (128 x %d replicas), mixed_bfloat16, Adam(CosineDecay(0, decay_steps=%d, "
              "warmup_target=%.4g, warmup_steps=%d))%s" % (batch_size, replicas, total - warmup, lr, warmup, det))
    elif a.lr_schedule == "exponential":
        opt = lib.tpu_optimizer_adam_schedule(lib.tpu_exponential_decay(lr, steps_per_epoch, a.decay_rate, 0))
        print("global batch %d (128 x %d replicas), mixed_bfloat16, Adam(ExponentialDecay(%.4g, decay_steps=%d, "
              "decay_rate=%.3g))%s" % (batch_size, replicas, lr, steps_per_epoch, a.decay_rate, det))
    else:
        opt = lib.tpu_optimizer_adam(lr)
        print("global batch %d (128 x %d replicas), mixed_bfloat16, Adam(learning_rate=%.4g)%s"
              % (batch_size, replicas, lr, det))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics_accuracy=True,
                  policy="mixed_bfloat16", batch_size=batch_size, deterministic=a.deterministic)
    print(model.summary_text(), end="", flush=True)

    # 5. train with profiling (and checkpoints)
    tb = tpuemu.callback_tensorboard(a.logdir, 10, 20)
    cbs = [tb]
    if a.checkpoint:
        cbs.append(tpuemu.callback_checkpoint(a.checkpoint, a.checkpoint_every))
    resume = False
    if a.checkpoint and os.path.exists(a.checkpoint):  # started again after a preemption (or any stop)
        model.load_checkpoint(a.checkpoint)
        resume = True
        print("resuming from %s: epoch %d, step %d" % (a.checkpoint, model.epoch + 1, model.step), flush=True)
    try:
        history = model.fit(train, epochs=a.epochs, c_callbacks=cbs, preemption_checkpoint=a.checkpoint,
                            resume=resume)
    except errors.PreemptedError as e:
        print("fashion_mnist: training: PREEMPTED: %s" % e, file=sys.stderr)
        print("preempted: exiting with status %d; start again with the same flags to go on" % EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    if a.history:
        with open(a.history, "a") as f:
            for i, ep in enumerate(history.epoch):
                f.write("%d %s %s\n" % (ep, history.history["loss"][i].hex(), history.history["accuracy"][i].hex()))
    loss, accuracy = model.evaluate(test)
    if tpuemu.callback_profiler_dir(tb):
        print("profile of batches 10-20 in %s; tensorboard --logdir %s shows it and the epoch scalars"
              % (tpuemu.callback_profiler_dir(tb), a.logdir))
    print("test loss: %.4f\ntest accuracy: %.4f" % (loss, accuracy))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except errors.OpError as e:
        print("fashion_mnist: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(1)
