"""Every status is TensorFlow's exception class with the library's message;
where TensorFlow raises a plain Python exception, the class is both."""
import numpy as np
import pytest

import tpuemu
import tpuemu.tf as tf
from tpuemu import errors, lib


def test_every_status_has_tfs_class():
    names = {1: "CancelledError", 2: "UnknownError", 3: "InvalidArgumentError", 4: "DeadlineExceededError",
             5: "NotFoundError", 6: "AlreadyExistsError", 7: "PermissionDeniedError", 8: "ResourceExhaustedError",
             9: "FailedPreconditionError", 10: "AbortedError", 11: "OutOfRangeError", 12: "UnimplementedError",
             13: "InternalError", 14: "UnavailableError", 15: "DataLossError", 16: "UnauthenticatedError"}
    for code, name in names.items():
        cls = errors.exception_type_from_error_code(code)
        assert cls.__name__ == name
        assert getattr(tf.errors, name) is cls
        e = cls(None, None, "msg")
        assert isinstance(e, tf.errors.OpError) and e.error_code == code and e.message == "msg"
        assert errors.error_code_from_exception_type(cls) == code
        assert tpuemu.status_name(code).replace("_", "") == name[:-5].upper()


def test_unavailable_names_the_address():
    r = tf.distribute.cluster_resolver.TPUClusterResolver("grpc://127.0.0.1:1")
    with pytest.raises(tf.errors.UnavailableError, match="127.0.0.1:1"):
        tf.config.experimental_connect_to_cluster(r)


def test_bad_tpu_address_is_invalid_argument_and_value_error():
    with pytest.raises(tf.errors.InvalidArgumentError) as ei:
        tf.distribute.cluster_resolver.TPUClusterResolver("grpc://host:notaport")
    assert isinstance(ei.value, ValueError)


def test_unknown_tpu_name_is_not_found_and_value_error(cluster, monkeypatch):
    monkeypatch.setenv("TPUEMU_TPU_API", cluster.tpu)
    r = tf.distribute.cluster_resolver.TPUClusterResolver("no-such-tpu")
    with pytest.raises(tf.errors.NotFoundError) as ei:
        tf.config.experimental_connect_to_cluster(r)
    assert isinstance(ei.value, ValueError)
    assert "no-such-tpu" in str(ei.value)


def test_not_found_when_cores_are_missing(cluster):
    c = tpuemu.Cluster(cluster.tpu)
    with pytest.raises(tf.errors.NotFoundError, match="TPUs not found in the cluster"):
        c.initialize_system(expect=64, timeout_ms=300)


def test_failed_precondition_after_another_client_initializes(cluster):
    a = tpuemu.Cluster(cluster.tpu)
    a.initialize_system()
    b = tpuemu.Cluster(cluster.tpu)
    b.initialize_system()
    with pytest.raises(tf.errors.FailedPreconditionError):
        a.system_check()


def test_resource_exhausted_has_xlas_oom_text(tpu_env):
    r = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.tpu.experimental.initialize_tpu_system(r)
    strategy = tf.distribute.TPUStrategy(r)
    # 99 % of core host0/0's HBM taken until the next initialize (tpuctl chaos hbm)
    tpuemu.Cluster(tpu_env.tpu).inject_fault("host0", 0, "hbm", percent=99)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(4096, activation="relu"), tf.keras.layers.Dense(4096)])
        model.compile(optimizer="adam", loss="mse")
    x = np.zeros((512, 4096), np.float32)
    with pytest.raises(tf.errors.ResourceExhaustedError) as ei:
        model.fit(x, x, batch_size=512, verbose=0)
    assert "Ran out of memory in memory space hbm" in str(ei.value)


def test_invalid_argument_for_a_batch_that_does_not_split(tpu_env):
    import numpy as np
    r = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.tpu.experimental.initialize_tpu_system(r)
    strategy = tf.distribute.TPUStrategy(r)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((100, 8), np.float32), np.zeros(100, np.int32))).batch(10)
    with pytest.raises(tf.errors.InvalidArgumentError):
        model.fit(ds, epochs=1, verbose=0)


def test_names_not_offered_say_why():
    with pytest.raises(NotImplementedError, match="Conv2D"):
        tf.keras.layers.Conv2D(3, 3)
    with pytest.raises(NotImplementedError, match="schedule"):
        tf.keras.callbacks.LearningRateScheduler(lambda e: 0.1)
    with pytest.raises(NotImplementedError, match="tf.image"):
        tf.image
    assert not hasattr(tf, "image")
    with pytest.raises(NotImplementedError):
        tf.data.Dataset.from_tensor_slices([1.0, 2.0]).map(lambda x: x)
