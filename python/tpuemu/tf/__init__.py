"""TensorFlow's names over the emulated pod: `import tpuemu.tf as tf`.

The walk-through's program runs with only its import line changed. Every
name offered behaves as TensorFlow documents it (with the emulated cores'
limits: Sequential models of Dense layers, the cores' built-in step
functions); every other name of TensorFlow raises NotImplementedError (also
an AttributeError) naming the C way or saying why.
"""
import contextlib
import os
import sys

import numpy as np

from .. import errors as _errors
from .. import Cluster as _Cluster, Resolver as _Resolver, Topology as _Topology, Profile as _Profile
from .._lib import ffi as _ffi, lib as _lib, s as _s
from .._train import Dataset as _CDataset, Strategy as _CStrategy
from ._ns import Namespace as _Namespace, not_offered as _not_offered

errors = _errors
__version__ = "2.15.0"  # the TensorFlow API this follows


class Tensor(np.ndarray):
    """What an eager op returns: a numpy array with .numpy()."""

    def numpy(self):
        return np.asarray(self)


def constant(value, dtype=None):
    return np.asarray(value, dtype=dtype).view(Tensor)


def _tensor(v):
    return np.asarray(v).view(Tensor)


float32 = np.float32
float64 = np.float64
int32 = np.int32
int64 = np.int64
uint8 = np.uint8
bfloat16 = "bfloat16"

# ---------------------------------------------------------------- random seeds

_seed = [None]


def _set_seed(seed):
    _seed[0] = None if seed is None else int(seed)


def _next_seed():
    if _seed[0] is None:
        return int.from_bytes(os.urandom(8), "little")
    _seed[0] = (_seed[0] * 6364136223846793005 + 1442695040888963407) % (2 ** 64)
    return _seed[0]


random = _Namespace("tf.random", set_seed=_set_seed)

from . import _keras as _k  # noqa: E402
from . import _distribute as _d  # noqa: E402
from . import _data  # noqa: E402

keras = _k.keras
data = _data.data
distribute = _d.distribute
config = _Namespace("tf.config", experimental_connect_to_cluster=_d.experimental_connect_to_cluster,
                    experimental=_Namespace("tf.config.experimental"))
tpu = _Namespace("tf.tpu", experimental=_Namespace(
    "tf.tpu.experimental", initialize_tpu_system=_d.initialize_tpu_system,
    shutdown_tpu_system=_d.shutdown_tpu_system, Topology=_d.Topology))
train = _Namespace("tf.train", Checkpoint=_d.Checkpoint)


def _trace(service_addr, logdir, duration_ms, worker_list="", num_tracing_attempts=3, options=None):
    """tf.profiler.experimental.client.trace: every core of the hosts at
    service_addr ("grpc://HOST:8466", a comma list) for duration_ms, written
    under LOGDIR/plugins/profile/RUN/ as TensorBoard's profile plugin reads it."""
    p = _Profile.capture_hosts(service_addr.replace("grpc://", ""), duration_ms)
    return p.write(logdir)


profiler = _Namespace("tf.profiler", experimental=_Namespace(
    "tf.profiler.experimental", client=_Namespace("tf.profiler.experimental.client", trace=_trace),
    start=_not_offered("tf.profiler.experimental.start",
                       "the cores are profiled from outside: tf.keras.callbacks.TensorBoard(profile_batch=...), "
                       "tf.profiler.experimental.client.trace, or tpu_profile_capture in C"),
    stop=_not_offered("tf.profiler.experimental.stop", "see tf.profiler.experimental.start")))


def function(fn=None, **kwargs):
    """tf.function: the program already runs on the cores; fn is returned as is."""
    if fn is None:
        return lambda f: f
    return fn


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _not_offered("tf." + name, "tpuemu.tf offers the names of TensorFlow's TPU walk-through "
                       "(docs/api: the TensorFlow names table)")()
