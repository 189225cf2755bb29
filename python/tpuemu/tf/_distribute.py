"""tf.distribute, tf.config and tf.tpu over the library (tpuemu.h, model.h)."""
import contextlib
import os
import sys
import threading

import numpy as np

from .. import errors
from .. import Cluster as _Cluster, Resolver as _Resolver, Topology as _CTopology
from .._lib import ffi, lib
from .._train import Strategy as _CStrategy
from ._ns import Namespace, Offered, not_offered


class TPUClusterResolver(Offered):
    """tf.distribute.cluster_resolver.TPUClusterResolver(tpu=None): $TPU_NAME,
    "grpc://HOST:8470", a comma list of hosts, or a TPU name."""

    def __init__(self, tpu=None, zone=None, project=None, job_name="worker", coordinator_name=None,
                 coordinator_address=None, credentials="default", service=None, discovery_url=None):
        if isinstance(tpu, (list, tuple)):
            tpu = ",".join(tpu)
        self._r = _Resolver(tpu or None)
        self._cluster = None
        self.task_type = job_name
        self.task_id = 0
        self.rpc_layer = "grpc"
        self.environment = ""

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        return self._r.master()

    def get_master(self):
        return self._r.master()

    def _connected(self):
        if self._cluster is None:
            self._cluster = _Cluster(self._r)
        return self._cluster

    def cluster_spec(self):
        return ClusterSpec(self._connected().spec().as_dict())

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        return {"TPU": self._connected().num_accelerators()}

    def get_tpu_system_metadata(self):
        m = self._connected().system_metadata()
        return TPUSystemMetadata(m["num_cores"], m["num_hosts"], m["num_of_cores_per_host"], self.topology)

    @property
    def topology(self):
        c = self._cluster
        return None if c is None or c.topology is None else Topology(c.topology)

    @staticmethod
    def connect(tpu=None, zone=None, project=None):
        r = TPUClusterResolver(tpu, zone, project)
        experimental_connect_to_cluster(r)
        initialize_tpu_system(r)
        return r


class TPUSystemMetadata:
    def __init__(self, num_cores, num_hosts, num_of_cores_per_host, topology):
        self.num_cores, self.num_hosts, self.num_of_cores_per_host = num_cores, num_hosts, num_of_cores_per_host
        self.topology = topology


class ClusterSpec:
    """tf.train.ClusterSpec (of a resolver): as_dict(), jobs, num_tasks, task_address."""

    def __init__(self, d):
        self._d = d

    def as_dict(self):
        return dict(self._d)

    @property
    def jobs(self):
        return list(self._d)

    def num_tasks(self, job):
        return len(self._d[job])

    def task_address(self, job, i):
        return self._d[job][i]


class Topology(Offered):
    """tf.tpu.experimental.Topology."""

    def __init__(self, t=None, serialized=None, mesh_shape=None, device_coordinates=None):
        if t is None:
            if serialized is None:
                raise not_offered("Topology(mesh_shape=, device_coordinates=)", "pass serialized=")()
            t = _CTopology.from_serialized(serialized)
        self._t = t

    @property
    def mesh_shape(self):
        return self._t.mesh_shape

    @property
    def mesh_rank(self):
        return len(self._t.mesh_shape)

    @property
    def device_coordinates(self):
        return self._t.device_coordinates

    @property
    def num_tasks(self):
        return self._t.num_tasks

    @property
    def num_tpus_per_task(self):
        return self._t.num_tpus_per_task

    def serialized(self):
        return self._t.serialized()


def _resolver(r):
    if r is None:
        r = TPUClusterResolver()
    if not isinstance(r, TPUClusterResolver):
        raise errors.InvalidArgumentValueError(None, None, "expected a TPUClusterResolver, got %r" % (r,))
    return r


def experimental_connect_to_cluster(cluster_spec_or_resolver, job_name="localhost", task_index=0, protocol=None,
                                    make_master_device_default=True, cluster_device_filters=None):
    """tf.config.experimental_connect_to_cluster(resolver)."""
    _resolver(cluster_spec_or_resolver)._connected()


def initialize_tpu_system(cluster_resolver=None):
    """tf.tpu.experimental.initialize_tpu_system(resolver): the Topology."""
    r = _resolver(cluster_resolver)
    return Topology(r._connected().initialize_system())


def shutdown_tpu_system(cluster_resolver=None):
    _resolver(cluster_resolver)._connected().shutdown_system()


class ReduceOp:
    SUM = "SUM"
    MEAN = "MEAN"


_REDUCE = {"SUM": lib.TPU_SUM, "MEAN": lib.TPU_MEAN}
_current = threading.local()


def get_strategy():
    return getattr(_current, "strategy", None) or _DEFAULT


class PerReplica(Offered):
    """A value per replica (tpu_per_replica): an input's shards or a step's outputs."""

    def __init__(self, h, owner=None, x_dim=None, strategy=None):
        self._h = h
        self._strategy = strategy
        self._owner = owner  # keeps the memory of h alive
        self.x_dim = x_dim

    @property
    def values(self):
        return tuple(self._local())

    def _local(self):
        n = lib.tpu_per_replica_num_replicas(self._h)
        out = ffi.new("tpu_local_value[]", n)
        got = ffi.new("size_t *")
        errors.check(lib.tpu_strategy_experimental_local_results(self._strategy._s._h, self._h, out, n, got))
        res = []
        for i in range(got[0]):
            lv = out[i]
            if lv.v != ffi.NULL:
                size = 1 if lv.rank == 0 else lv.dims[0] * (lv.dims[1] if lv.rank == 2 else 1)
                a = np.frombuffer(ffi.buffer(lv.v, size * 8), dtype=np.float64).copy()
                res.append(a.reshape(()) if lv.rank == 0 else a.reshape(tuple(lv.dims[j] for j in range(lv.rank))))
            else:
                res.append(np.frombuffer(ffi.buffer(lv.x, lv.dims[0] * lv.dims[1] * 4), dtype=np.float32).reshape(
                    lv.dims[0], lv.dims[1]).copy())
        return res


class _Outputs:
    def __init__(self):
        self.o = ffi.new("tpu_step_outputs *")

    def __del__(self):
        lib.tpu_step_outputs_free(self.o)


class _PerReplicaInput(PerReplica):
    def __del__(self):
        lib.tpu_per_replica_free(self._h)


class DistributedDataset(Offered):
    """What experimental_distribute_dataset returns: iterate it once per epoch."""

    def __init__(self, strategy, dataset):
        self._strategy = strategy
        self._dataset = dataset
        p = ffi.new("tpu_dist_dataset **")
        errors.check(lib.tpu_strategy_experimental_distribute_dataset(strategy._s._h, dataset._d.c(), p),
                     errors.InvalidArgumentValueError)
        self._h = ffi.gc(p[0], lib.tpu_dist_dataset_free)

    def __iter__(self):
        p = ffi.new("tpu_dist_iter **")
        errors.check(lib.tpu_dist_dataset_iter(self._h, p))
        it = ffi.gc(p[0], lib.tpu_dist_iter_free)
        x = ffi.new("tpu_per_replica **")
        xd = self._dataset._d.x_dim
        try:
            while True:
                errors.check(lib.tpu_dist_iter_next(it, x))
                if x[0] == ffi.NULL:
                    return
                # the shards are copies: they outlive the iterator
                yield _PerReplicaInput(x[0], x_dim=xd, strategy=self._strategy)
        finally:
            ffi.release(it)  # one iterator at a time: the next epoch may begin


class TPUStrategy(Offered):
    """tf.distribute.TPUStrategy(resolver): data-parallel over the initialized system's cores."""

    def __init__(self, tpu_cluster_resolver=None, experimental_device_assignment=None,
                 experimental_spmd_xla_partitioning=False):
        if experimental_device_assignment is not None:
            raise not_offered("TPUStrategy(experimental_device_assignment=)",
                              "every core is one replica (model parallelism is not emulated)")()
        r = _resolver(tpu_cluster_resolver)
        self.cluster_resolver = r
        self._s = _CStrategy(r._connected())
        self.extended = Namespace("TPUExtended", experimental_enable_get_next_as_optional=True)

    @property
    def num_replicas_in_sync(self):
        return self._s.num_replicas_in_sync

    @contextlib.contextmanager
    def scope(self):
        prev = getattr(_current, "strategy", None)
        _current.strategy = self
        try:
            yield self
        finally:
            _current.strategy = prev

    def experimental_distribute_dataset(self, dataset, options=None):
        return DistributedDataset(self, dataset)

    def distribute_datasets_from_files(self, files, on_hosts=True):
        """Not a TensorFlow name: what a dataset_fn over files does, as a
        description the hosts can run (tpu_strategy_distribute_datasets_from_files).
        files is a tpuemu.FileDataset batched by the per-replica batch; each
        core's host runs its shard's pipeline (on_hosts=False: this process
        runs them and sends the rows). model.fit, evaluate and predict take it."""
        from . import _data
        return _data.Dataset(files.distribute(self._s, on_hosts))

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        raise not_offered("strategy.distribute_datasets_from_function",
                          "use experimental_distribute_dataset, or for files every host can read "
                          "distribute_datasets_from_files(tpuemu.FileDataset(...)) "
                          "(C: tpu_strategy_distribute_datasets_from_function)")()

    def run(self, fn, args=(), kwargs=None, options=None):
        """strategy.run(model.train_step | model.test_step | model.predict_step, args=(x,)):
        the model's built-in step on every core with its shard of x."""
        model = getattr(fn, "__self__", None)
        step = getattr(fn, "_tpu_step", None)
        if model is None or step is None:
            raise not_offered("strategy.run(a Python function)",
                              "the emulated cores run the model's built-in steps: pass model.train_step, "
                              "model.test_step or model.predict_step (C: tpu_strategy_run with "
                              "TPU_STEP_TRAIN, _EVALUATE, _PREDICT)")()
        if len(args) != 1 or not isinstance(args[0], PerReplica):
            raise errors.InvalidArgumentValueError(
                None, None, "strategy.run: args must be (x,), x from an experimental_distribute_dataset")
        x = args[0]
        model._build(x.x_dim)
        out = _Outputs()
        errors.check(lib.tpu_strategy_run(self._s._h, step, model._m._h, x._h, out.o),
                     errors.InvalidArgumentValueError if lib.tpu_last_status() == errors.INVALID_ARGUMENT else None)
        if step == lib.TPU_STEP_PREDICT:
            return PerReplica(out.o.predictions, out, strategy=self)
        return PerReplica(out.o.loss, out, strategy=self)

    def reduce(self, reduce_op, value, axis=None):
        """strategy.reduce(ReduceOp.SUM|MEAN, per_replica, axis=None|0)."""
        op = _REDUCE.get(getattr(reduce_op, "name", reduce_op))
        if op is None:
            raise errors.InvalidArgumentValueError(None, None, "reduce: ReduceOp.SUM or ReduceOp.MEAN, not %r"
                                                   % (reduce_op,))
        if not isinstance(value, PerReplica):
            return np.asarray(value)
        got = ffi.new("size_t *")
        ax = lib.TPU_AXIS_NONE if axis is None else int(axis)
        buf = ffi.new("double[]", 1)
        st = lib.tpu_strategy_reduce(self._s._h, op, value._h, ax, buf, 1, got)
        if st and got[0] > 1:
            buf = ffi.new("double[]", got[0])
            st = lib.tpu_strategy_reduce(self._s._h, op, value._h, ax, buf, got[0], got)
        errors.check(st, errors.InvalidArgumentValueError)
        from . import Tensor
        a = np.array([buf[i] for i in range(got[0])], dtype=np.float32)
        return (a.reshape(()) if got[0] == 1 and value.values[0].ndim <= (0 if axis is None else 1) else a).view(Tensor)

    def experimental_local_results(self, value):
        if isinstance(value, PerReplica):
            return value.values
        return (value,)

    def gather(self, value, axis):
        return np.concatenate(self.experimental_local_results(value), axis=axis)


class _DefaultStrategy:
    num_replicas_in_sync = 1
    _s = None

    def scope(self):
        return contextlib.nullcontext(self)


_DEFAULT = _DefaultStrategy()


class Checkpoint(Offered):
    """tf.train.Checkpoint(model=...): the model's whole training state (weights,
    optimizer slots, step) in the library's checkpoint file (tpu_model_save_checkpoint)."""

    def __init__(self, root=None, model=None, optimizer=None, **kwargs):
        self.model = model if model is not None else root
        self.save_counter = 0

    def write(self, file_prefix, options=None):
        self.model._m.save_checkpoint(file_prefix)
        return file_prefix

    def save(self, file_prefix, options=None):
        self.save_counter += 1
        return self.write("%s-%d" % (file_prefix, self.save_counter))

    def read(self, save_path, options=None):
        self.model._restore_from(save_path)
        return self

    restore = read


def _latest(directory):
    p = os.path.join(directory, "ckpt")
    return p if os.path.exists(p) else None


EXIT_PREEMPTED = 42  # TensorFlow's _RESTARTABLE_EXIT_CODE


class PreemptionCheckpointHandler(Offered):
    """tf.distribute.experimental.PreemptionCheckpointHandler(resolver, checkpoint, checkpoint_dir):
    restores the checkpoint in checkpoint_dir if there is one; run(fn, *args) runs a
    training step and, when the cores carried a preemption or maintenance notice,
    saves the checkpoint and exits with status 42 (restart the program to resume)."""

    def __init__(self, cluster_resolver, checkpoint, checkpoint_dir=None, termination_config=None):
        if checkpoint_dir is None:
            raise not_offered("PreemptionCheckpointHandler(checkpoint_dir=None)",
                              "give the directory the checkpoint is saved to")()
        self._ckpt = checkpoint
        self._dir = checkpoint_dir
        os.makedirs(checkpoint_dir, exist_ok=True)
        self._runs = 0
        p = _latest(checkpoint_dir)
        if p:
            checkpoint.read(p)
            self._runs = None  # the model's step, once restored

    @property
    def total_run_calls(self):
        if self._runs is None:
            return int(self._ckpt.model._pending_step())
        return self._runs

    def run(self, distributed_train_function, *args, **kwargs):
        if self._runs is None:
            self._runs = self.total_run_calls
        r = distributed_train_function(*args, **kwargs)
        self._runs += 1
        kind, replica = self._ckpt.model._m.notice()
        if kind != "NONE":
            path = os.path.join(self._dir, "ckpt")
            self._ckpt.write(path)
            print("tpuemu: %s notice on replica %d: saved %s at step %d; exiting with status %d to be "
                  "restarted" % (kind.lower(), replica, path, self._ckpt.model._m.step, EXIT_PREEMPTED),
                  file=sys.stderr, flush=True)
            sys.exit(EXIT_PREEMPTED)
        return r

    @contextlib.contextmanager
    def watch_preemption_scope(self):
        yield


distribute = Namespace(
    "tf.distribute",
    TPUStrategy=TPUStrategy, ReduceOp=ReduceOp, get_strategy=get_strategy,
    cluster_resolver=Namespace("tf.distribute.cluster_resolver", TPUClusterResolver=TPUClusterResolver),
    experimental=Namespace("tf.distribute.experimental", PreemptionCheckpointHandler=PreemptionCheckpointHandler,
                           TPUStrategy=TPUStrategy),
)._not(MirroredStrategy="one TPU pod: TPUStrategy", MultiWorkerMirroredStrategy="one TPU pod: TPUStrategy")
