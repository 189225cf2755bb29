"""Ctrl-C (SIGINT to a child process) during fit and during initialize raises
KeyboardInterrupt within a second or two, and the cluster stays usable."""
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    import tpuemu.tf as tf
    what = sys.argv[2]
    r = tf.distribute.cluster_resolver.TPUClusterResolver(sys.argv[1])
    tf.config.experimental_connect_to_cluster(r)
    tf.tpu.experimental.initialize_tpu_system(r)
    strategy = tf.distribute.TPUStrategy(r)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8192, 64)).astype(np.float32)
    y = rng.integers(0, 10, 8192).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(512)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu"),
                                     tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    started = tf.keras.callbacks.LambdaCallback(on_train_begin=lambda logs: print("started", flush=True))
    t0 = None
    try:
        if what == "fit":
            model.fit(ds, epochs=1000, callbacks=[started], verbose=0)
        else:
            import tpuemu
            c = tpuemu.Cluster(sys.argv[1])
            print("started", flush=True)
            c.initialize_system(expect=64, timeout_ms=60000)   # 64 cores never come
        print("not interrupted", flush=True)
        sys.exit(3)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    # the cluster is usable: initialize again if needed, then train and evaluate
    if what != "fit":
        tf.tpu.experimental.initialize_tpu_system(r)
        strategy = tf.distribute.TPUStrategy(r)
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.layers.Dense(10, activation="softmax")])
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    h = model.fit(ds, epochs=1, verbose=0)
    loss, acc = model.evaluate(ds, verbose=0)
    print("usable", len(h.epoch), loss, flush=True)
""")


def _interrupt(cluster, tmp_path, what):
    p = tmp_path / "child.py"
    p.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(p), "grpc://" + cluster.tpu, what], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        lines = []

        def readline(deadline):
            r, _, _ = select.select([child.stdout], [], [], max(0, deadline - time.monotonic()))
            return child.stdout.readline() if r else None

        line = readline(time.monotonic() + 60)
        assert line == "started\n", (line, child.stderr.read() if child.poll() is not None else "")
        time.sleep(0.5)  # well into the call
        t0 = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = readline(t0 + 30)
        took = time.monotonic() - t0
        assert line == "KeyboardInterrupt\n", line
        # the call was 1000 epochs (minutes) or a 60 s wait: a second or two is the cancel
        assert took < 3.0, "KeyboardInterrupt %.1f s after SIGINT" % took
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-2000:]
        assert out.startswith("usable 1 "), out + err[-2000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_ctrl_c_during_fit(cluster, tmp_path):
    _interrupt(cluster, tmp_path, "fit")


def test_ctrl_c_during_initialize(cluster, tmp_path):
    _interrupt(cluster, tmp_path, "initialize")
