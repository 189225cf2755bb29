"""Preemption as on Cloud TPU: a preemption notice makes fit (with Keras'
BackupAndRestore) stop every core at the same step, save, and exit with
status 42; the program started again resumes from the backup."""
import os
import select
import subprocess
import sys
import textwrap
import time

import tpuemu

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tpuemu.tf as tf
    r = tf.distribute.cluster_resolver.TPUClusterResolver(sys.argv[1])
    tf.config.experimental_connect_to_cluster(r)
    tf.tpu.experimental.initialize_tpu_system(r)
    strategy = tf.distribute.TPUStrategy(r)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16384, 64)).astype(np.float32)
    y = rng.integers(0, 10, 16384).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16384, seed=5).batch(512)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"),
                                     tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    said = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: print("epoch", e, flush=True))
    backup = tf.keras.callbacks.BackupAndRestore(sys.argv[2])
    h = model.fit(ds, epochs=int(sys.argv[3]), callbacks=[backup, said], verbose=0)
    print("done", h.epoch, flush=True)
""")


def test_preemption_saves_exits_42_and_resumes(cluster, tmp_path):
    prog = tmp_path / "train.py"
    prog.write_text(CHILD)
    backup = tmp_path / "backup"
    args = [sys.executable, str(prog), "grpc://" + cluster.tpu, str(backup), "30"]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r, _, _ = select.select([child.stdout], [], [], 60)
        line = child.stdout.readline() if r else ""
        assert line == "epoch 0\n", line + (child.stderr.read() if child.poll() is not None else "")
        # tpuctl chaos preempt host1/1 --notice-ms 500: the notice now, the core gone 0.5 s later
        tpuemu.Cluster(cluster.tpu).inject_fault("host1", 1, "preempt", notice_ms=500)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 42, out + err[-2000:]
    assert "done" not in out
    assert "preemption" in err.lower() and "42" in err
    assert os.path.exists(backup / "ckpt"), "no backup saved at the notice"

    # the preempted worker terminates at the event; a new one takes its place
    w = cluster.workers[(1, 1)]
    w.wait(timeout=30)
    cluster.start_worker(1, 1)
    cluster.tpuctl("init", "--expect", "4", "--timeout-ms", "20000")

    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    done = [l for l in again.stdout.splitlines() if l.startswith("done")]
    assert done, again.stdout
    epochs = eval(done[0][len("done "):])
    assert epochs and epochs[0] >= 1 and epochs[-1] == 29, "resumed history %s" % epochs
    assert not os.path.exists(backup / "ckpt"), "BackupAndRestore deletes its backup when fit ends"


def test_custom_loop_preemption_handler_exits_42_and_resumes(cluster, tmp_path):
    """examples/python/custom_loop.py: PreemptionCheckpointHandler.run saves at a
    notice and exits 42; started again, the loop goes on from the saved step."""
    from conftest import DATA
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        import pytest
        pytest.skip("needs dataset-fashion-mnist")
    src = os.environ.get("TPUEMU_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    prog = os.path.join(src, "examples", "python", "custom_loop.py")
    env = dict(os.environ, TPU_NAME="grpc://" + cluster.tpu, CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    args = [sys.executable, prog, "4"]
    child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r, _, _ = select.select([child.stdout], [], [], 120)
        line = child.stdout.readline() if r else ""
        assert line.startswith("Epoch 1, Loss: "), line + (child.stderr.read() if child.poll() is not None else "")
        tpuemu.Cluster(cluster.tpu).inject_fault("host0", 1, "preempt", notice_ms=500)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 42, out + err[-2000:]
    assert "test accuracy" not in out
    assert os.path.exists(tmp_path / "ckpt" / "ckpt")
    w = cluster.workers[(0, 1)]
    w.wait(timeout=30)
    cluster.start_worker(0, 1)
    cluster.tpuctl("init", "--expect", "4", "--timeout-ms", "20000")
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    epochs = [l.split(",")[0] for l in again.stdout.splitlines() if l.startswith("Epoch ")]
    assert "Epoch 1" not in epochs and epochs[-1] == "Epoch 4", again.stdout
    acc = float(again.stdout.split("test accuracy: ")[1])
    assert acc > 0.8, again.stdout
