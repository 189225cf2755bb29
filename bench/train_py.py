#!/usr/bin/python3
"""bench_train's measurement through the Python package: the same model,
data, batch, warm-up and measured seconds, trained by tpuemu.tf's
Sequential.fit as a Keras program does it (a Keras Callback counts the
steps, as bench_train's C callback does). One markdown row:

  | cores | batch/core | global | examples/s | step ms | steps |

  train_py.py --tpu HOST:PORT --cores N --batch PER_CORE [--seconds S] [--warmup STEPS] [--data DIR]
"""
import argparse
import os
import sys
import time

import numpy as np

import tpuemu.tf as tf


class Meter(tf.keras.callbacks.Callback):
    def __init__(self, warmup, seconds):
        super().__init__()
        self.warmup, self.seconds = warmup, seconds
        self.seen = self.steps = 0
        self.t_start = self.t_end = None

    def on_train_batch_end(self, batch, logs=None):
        t = time.perf_counter()
        self.seen += 1
        if self.t_start is None:
            if self.seen >= self.warmup:
                self.t_start = t
            return
        self.steps += 1
        self.t_end = t
        if t - self.t_start >= self.seconds and self.steps >= 5:
            self.model.stop_training = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tpu", required=True)
    ap.add_argument("--cores", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--data", default=os.environ.get("DATA") or "/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    os.environ["TPUEMU_FASHION_MNIST"] = a.data
    r = tf.distribute.cluster_resolver.TPUClusterResolver("grpc://" + a.tpu)
    tf.config.experimental_connect_to_cluster(r)
    tf.tpu.experimental.initialize_tpu_system(r)
    strategy = tf.distribute.TPUStrategy(r)
    if strategy.num_replicas_in_sync != a.cores:
        sys.exit("train_py: the system has %d replicas, not %d" % (strategy.num_replicas_in_sync, a.cores))
    glob = a.batch * a.cores
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    (x, y), _ = tf.keras.datasets.fashion_mnist.load_data()
    x = x.reshape(-1, 784).astype(np.float32) / np.float32(255.0)
    ds = tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32))).shuffle(len(x), seed=1).batch(
        glob, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(128, activation="relu"),
                                     tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=tf.keras.optimizers.Adam(0.001), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    m = Meter(a.warmup, a.seconds)
    model.fit(ds, epochs=100000, callbacks=[m], verbose=0)
    if not m.steps:
        sys.exit("train_py: no step was measured")
    el = m.t_end - m.t_start
    print("| %5d | %10d | %6d | %10.0f | %7.3f | %5d |" % (a.cores, a.batch, glob, m.steps * glob / el,
                                                          el * 1e3 / m.steps, m.steps), flush=True)


if __name__ == "__main__":
    main()
