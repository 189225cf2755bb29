"""Training through tpuemu.tf: Python callbacks, History, threads during fit,
zero-copy datasets, a custom loop with strategy.run and strategy.reduce."""
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tpuemu
import tpuemu.tf as tf


@pytest.fixture
def strategy(cluster):
    """A TPUStrategy on a freshly initialized system (a test may initialize it from a child process)."""
    r = tf.distribute.cluster_resolver.TPUClusterResolver("grpc://" + cluster.tpu)
    tf.config.experimental_connect_to_cluster(r)
    tf.tpu.experimental.initialize_tpu_system(r)
    return tf.distribute.TPUStrategy(r)


def _data(n=4096, dim=32, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n).astype(np.int32)
    centers = rng.normal(size=(classes, dim)).astype(np.float32)
    x = (centers[y] + 0.5 * rng.normal(size=(n, dim))).astype(np.float32)
    return x, y


def _model(strategy, classes=4, dim=None):
    with strategy.scope():
        kw = {} if dim is None else {"input_shape": (dim,)}
        m = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", **kw),
                                 tf.keras.layers.Dense(classes, activation="softmax")])
        m.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return m


def test_keras_callbacks_run_and_history_is_kerass(strategy):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=1).batch(512)
    calls = []

    class Recorder(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            calls.append(("train_begin",))

        def on_epoch_begin(self, epoch, logs=None):
            calls.append(("epoch_begin", epoch))

        def on_train_batch_end(self, batch, logs=None):
            calls.append(("batch_end", batch, sorted(logs)))

        def on_epoch_end(self, epoch, logs=None):
            calls.append(("epoch_end", epoch, dict(logs)))

        def on_train_end(self, logs=None):
            calls.append(("train_end",))

    rec = Recorder()
    m = _model(strategy)
    h = m.fit(ds, epochs=3, callbacks=[rec], verbose=0)
    assert rec.model is m
    assert calls[0] == ("train_begin",) and calls[-1] == ("train_end",)
    assert [c[1] for c in calls if c[0] == "epoch_begin"] == [0, 1, 2]
    assert [c[1] for c in calls if c[0] == "batch_end"] == list(range(8)) * 3
    assert all(c[2] == ["accuracy", "loss"] for c in calls if c[0] == "batch_end")
    ends = [c[2] for c in calls if c[0] == "epoch_end"]
    assert h.epoch == [0, 1, 2] and h.params["epochs"] == 3 and h.params["steps"] == 8
    assert h.history["loss"] == [e["loss"] for e in ends]
    assert h.history["accuracy"] == [e["accuracy"] for e in ends]
    assert h.history["loss"][2] < h.history["loss"][0]
    assert m.history is h


def test_exception_in_a_callback_stops_fit_and_is_the_same_object(strategy):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(512)
    boom = RuntimeError("boom at batch 3")
    seen = []

    class Bomb(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)
            if batch == 3:
                raise boom

    m = _model(strategy)
    with pytest.raises(RuntimeError) as ei:
        m.fit(ds, epochs=5, callbacks=[Bomb()], verbose=0)
    assert ei.value is boom
    assert seen == [0, 1, 2, 3]
    # the model and cluster are fine afterwards
    h = m.fit(ds, epochs=1, verbose=0)
    assert len(h.epoch) == 1


def test_stop_training_stops_after_the_epoch(strategy):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(512)
    m = _model(strategy)
    stop = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: setattr(m, "stop_training", epoch == 1))
    h = m.fit(ds, epochs=10, callbacks=[stop], verbose=0)
    assert h.epoch == [0, 1]


def test_progress_bar_is_kerass(strategy, capfd):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(512)
    m = _model(strategy)
    m.fit(ds, epochs=2)
    out = capfd.readouterr().out
    assert "Epoch 1/2\n" in out and "Epoch 2/2\n" in out
    assert "8/8 [==============================] - " in out and " - loss: " in out and " - accuracy: " in out
    res = m.evaluate(ds)
    out = capfd.readouterr().out
    assert out.startswith("8/8 [==============================] - ") and "loss: %.4f" % res[0] in out


def test_another_thread_keeps_running_during_fit(strategy):
    x, y = _data(n=16384)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(512)
    m = _model(strategy)
    m.fit(ds, epochs=1, verbose=0)  # compiled; the next fit only trains
    stamps, stop = [], threading.Event()

    def spin():
        while not stop.is_set():
            stamps.append(time.monotonic())
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        t0 = time.monotonic()
        m.fit(ds, epochs=4, verbose=0)
        t1 = time.monotonic()
    finally:
        stop.set()
        t.join()
    q = (t1 - t0) / 4
    inside = [s for s in stamps if t0 + q <= s <= t1 - q]
    # the middle half of fit: a held GIL would leave the thread no turn at all
    assert len(inside) >= 10, "%d iterations of the thread in the middle of a %.2f s fit" % (len(inside), t1 - t0)


ZERO_COPY = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import tpuemu.tf as tf
    r = tf.distribute.cluster_resolver.TPUClusterResolver(sys.argv[1])
    tf.config.experimental_connect_to_cluster(r)
    tf.tpu.experimental.initialize_tpu_system(r)
    strategy = tf.distribute.TPUStrategy(r)
    x = np.ones((60000, 784), dtype=np.float32)        # 188 MB
    y = np.zeros(60000, dtype=np.int32)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60000).batch(1024, drop_remainder=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model.fit(ds.prefetch(tf.data.AUTOTUNE), epochs=1, verbose=0)
    model.evaluate(ds, verbose=0)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) // 1024)
""")


def test_a_60000_x_784_float32_array_is_not_copied(cluster, tmp_path):
    p = tmp_path / "zc.py"
    p.write_text(ZERO_COPY)
    r = subprocess.run([sys.executable, str(p), "grpc://" + cluster.tpu], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    grew_mb = int(r.stdout.split()[-1])
    # a copy of the features alone would be 179 MiB
    assert grew_mb < 60, "the process grew by %d MiB during fit and evaluate" % grew_mb


def test_conversions_keep_the_values(strategy):
    # uint8 images / 255.0 (float64) and uint8 labels, as the walk-through passes them
    img = np.arange(256, dtype=np.uint8).reshape(2, 128)
    lab = np.array([3, 7], dtype=np.uint8)
    ds = tf.data.Dataset.from_tensor_slices((img / 255.0, lab))
    got = list(ds)
    assert len(got) == 2
    np.testing.assert_array_equal(got[0][0], (img[0] / 255.0).astype(np.float32))
    assert got[1][1] == 7 and got[1][1].dtype == np.int32
    batched = list(tf.data.Dataset.from_tensor_slices((img / 255.0, lab)).batch(2))
    assert batched[0][0].shape == (2, 128)


def test_custom_loop_with_run_and_reduce(strategy):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=3).batch(512)
    m = _model(strategy, dim=32)
    dist = strategy.experimental_distribute_dataset(ds)
    losses = []
    for epoch in range(3):
        total, n = 0.0, 0
        for batch in dist:
            per_replica = strategy.run(m.train_step, args=(batch,))
            assert len(strategy.experimental_local_results(per_replica)) == strategy.num_replicas_in_sync
            total += float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))
            n += 1
        losses.append(total / n)
    assert n == 8
    assert losses[2] < losses[0] * 0.8, losses
    # evaluation steps: the mean loss over the test batches matches evaluate()
    test_total, k = 0.0, 0
    for batch in strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(512)):
        test_total += float(strategy.reduce("SUM", strategy.run(m.test_step, args=(batch,)), axis=None))
        k += 1
    loss, acc = m.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(512), verbose=0)
    assert abs(test_total / k - loss) < 1e-4
    with pytest.raises(NotImplementedError, match="train_step"):
        strategy.run(lambda b: b, args=(batch,))


def test_evaluate_and_predict_take_callbacks(strategy):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(512)
    m = _model(strategy)
    m.fit(ds, epochs=1, verbose=0)
    calls = []

    class Rec(tf.keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            calls.append("test_begin")

        def on_test_batch_end(self, batch, logs=None):
            calls.append(("test_batch", batch, sorted(logs)))

        def on_test_end(self, logs=None):
            calls.append(("test_end", logs))

        def on_predict_batch_begin(self, batch, logs=None):
            calls.append(("predict_batch", batch))

        def on_predict_end(self, logs=None):
            calls.append("predict_end")

    loss, acc = m.evaluate(ds, callbacks=[Rec()], verbose=0)
    assert calls[0] == "test_begin"
    assert [c[1] for c in calls[1:-1]] == list(range(8))
    assert calls[1][2] == ["accuracy", "loss"]
    assert calls[-1][0] == "test_end" and calls[-1][1]["loss"] == loss and calls[-1][1]["accuracy"] == acc
    calls.clear()
    p = m.predict(ds, callbacks=[Rec()], verbose=0)
    assert p.shape == (4096, 4)
    assert calls == [("predict_batch", i) for i in range(8)] + ["predict_end"]
    boom = ValueError("stop predicting")

    class Bomb(tf.keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            raise boom

    with pytest.raises(ValueError) as ei:
        m.predict(ds, callbacks=[Bomb()], verbose=0)
    assert ei.value is boom


def test_library_warnings_reach_pythons_logging(strategy, caplog):
    """A global batch the matrix unit must pad earns the library's performance
    warning; Python sees it as a WARNING of the "tpuemu" logger."""
    x, y = _data(n=1200)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(100)
    m = _model(strategy)
    with caplog.at_level("WARNING", logger="tpuemu"):
        m.fit(ds, epochs=1, verbose=0)
    msgs = [r.getMessage() for r in caplog.records if r.name == "tpuemu"]
    assert any("not a multiple of 8 per core and 128 overall" in t for t in msgs), msgs


def test_logits_loss_and_the_newer_activations(strategy):
    """SparseCategoricalCrossentropy(from_logits=True) on a linear last layer, gelu and swish before it."""
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=1).batch(512)
    with strategy.scope():
        m = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="gelu", input_shape=(32,)),
                                 tf.keras.layers.Dense(16, activation="swish"),
                                 tf.keras.layers.Dense(4)])
        m.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    h = m.fit(ds, epochs=3, verbose=0)
    assert h.history["loss"][2] < 0.5 * h.history["loss"][0]
    assert h.history["accuracy"][2] > 0.9
    logits = m.predict(tf.data.Dataset.from_tensor_slices((x[:512], y[:512])).batch(512), verbose=0)
    assert (logits.max() > 1.0 or logits.min() < 0.0), "the last layer gave probabilities, not logits"
    with pytest.raises(NotImplementedError):
        tf.keras.losses.SparseCategoricalCrossentropy(reduction="none")


def _write_idx(path, arr):
    """An IDX file of unsigned bytes (the format Fashion-MNIST ships in)."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, arr.ndim]))
        for d in arr.shape:
            f.write(int(d).to_bytes(4, "big"))
        f.write(arr.tobytes())


def test_input_on_the_hosts_trains_as_the_client_fed_pipelines(strategy, tmp_path):
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 2050).astype(np.uint8)
    x = np.clip(np.repeat(y[:, None] * 60, 32, axis=1) + rng.integers(0, 40, (2050, 32)), 0, 255)
    _write_idx(tmp_path / "images-idx3-ubyte", x.reshape(2050, 4, 8))
    _write_idx(tmp_path / "labels-idx1-ubyte", y)
    files = (tpuemu.FileDataset(tmp_path / "images-idx3-ubyte", tmp_path / "labels-idx1-ubyte")
             .map("scale", 1 / 255).cache().shuffle(2050, 5).batch(32).prefetch(2))
    assert (files.num_rows, files.x_dim) == (2050, 32)
    weights, losses = [], []
    for on_hosts in (True, False):
        ds = strategy.distribute_datasets_from_files(files, on_hosts=on_hosts)
        tf.random.set_seed(11)  # the same initial weights both times
        m = _model(strategy, dim=32)
        h = m.fit(ds, epochs=2, verbose=0)
        losses.append(h.history["loss"])
        weights.append(m.get_weights())
    assert losses[0] == losses[1]
    assert losses[0][1] < losses[0][0]
    for a, b in zip(weights[0], weights[1]):
        assert np.array_equal(a, b)
    with pytest.raises(tpuemu.errors.NotFoundError) as e:
        tpuemu.FileDataset(tmp_path / "nothing", tmp_path / "labels-idx1-ubyte")
    assert "nothing" in str(e.value)
