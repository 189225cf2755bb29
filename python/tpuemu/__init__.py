"""tpuemu: the emulated TPU pod's client library (libtpuclient) in Python.

Two layers:
- tpuemu (this module): the C library one to one, for cluster tooling:
  Resolver, Cluster (spec, health, topology, initialize/shutdown, chaos,
  collectives, profile capture), and the training objects (Strategy,
  Dataset, Model) tpuemu.tf is made of.
- tpuemu.tf: TensorFlow's names over it (`import tpuemu.tf as tf`).

Every failed call raises the exception class of its status (tpuemu.errors,
tf.errors' classes) with the library's message. Blocking calls release the
GIL, and Ctrl-C interrupts the long ones (KeyboardInterrupt).
"""
import os

import numpy as np

from . import errors
from ._lib import b as _b, ffi, lib, s as _s
from ._run import Cancel, call as _call

__all__ = ["Resolver", "Cluster", "ClusterSpec", "Topology", "Profile", "Strategy", "Dataset", "FileDataset",
           "Model", "History", "errors", "version", "ffi", "lib"]

__version__ = _s(lib.tpu_version())


def version():
    """The library's version as loaded ("0.1.0")."""
    return _s(lib.tpu_version())


def status_name(code):
    """"UNAVAILABLE" for 14."""
    return _s(lib.tpu_status_name(code))


def _out(ctype):
    return ffi.new(ctype + " *")


# ---------------------------------------------------------------- resolver

class Resolver:
    """Where the cluster is (tpu_resolver): "HOST:PORT", "grpc://HOST:PORT", a
    comma list of hosts, or a TPU name; None: $TPU_NAME, else 127.0.0.1:8470."""

    def __init__(self, tpu=None, token_file=None, timeout_ms=None):
        p = ffi.new("tpu_resolver **")
        errors.check(lib.tpu_resolver_new(_b(tpu), p), errors.InvalidArgumentValueError)
        self._h = ffi.gc(p[0], lib.tpu_resolver_free)
        if token_file is not None:
            errors.check(lib.tpu_resolver_set_token_file(self._h, _b(token_file)))
        if timeout_ms is not None:
            errors.check(lib.tpu_resolver_set_timeout_ms(self._h, int(timeout_ms)))

    def master(self):
        return _s(lib.tpu_resolver_master(self._h))

    @property
    def endpoints(self):
        return [_s(lib.tpu_resolver_endpoint(self._h, i)) for i in range(lib.tpu_resolver_num_endpoints(self._h))]

    @property
    def tpu_name(self):
        p = lib.tpu_resolver_tpu_name(self._h)
        return None if p == ffi.NULL else _s(p)

    def connect(self):
        """tpu_connect_to_cluster: a Cluster."""
        return Cluster(self)


# ---------------------------------------------------------------- cluster

_STATES = {}


def core_state_name(state):
    return _s(lib.tpu_core_state_name(state))


class CoreInfo:
    """One core as the resolver sees it (tpu_core_info)."""

    _fields = ("host_id", "core", "control_addr", "data_addr", "tpu_type", "hbm_capacity", "hbm_used",
               "state", "heartbeat_age_ms", "replica_id", "pid", "version", "hbm_peak", "hbm_ooms")

    def __init__(self, ci):
        for f in self._fields:
            v = getattr(ci, f)
            setattr(self, f, _s(v) if isinstance(v, ffi.CData) else v)
        self.state_name = core_state_name(ci.state)
        self.notice = {"kind": _s(lib.tpu_notice_kind_name(ci.notice.kind)),
                       "event_in_ms": ci.notice.event_in_ms, "window_ms": ci.notice.window_ms,
                       "under_way": bool(ci.notice.under_way)}

    @property
    def name(self):
        return "%s/%d" % (self.host_id, self.core)

    def __repr__(self):
        return "CoreInfo(%s, %s, replica %d)" % (self.name, self.state_name, self.replica_id)


class ClusterSpec:
    """A snapshot of every core the resolver knows (tpu_cluster_spec)."""

    def __init__(self, h):
        self._h = ffi.gc(h, lib.tpu_cluster_spec_free)
        ci = _out("tpu_core_info")
        self.cores = []
        for i in range(lib.tpu_cluster_spec_num_cores(self._h)):
            errors.check(lib.tpu_cluster_spec_core(self._h, i, ci))
            self.cores.append(CoreInfo(ci))
        self.epoch = lib.tpu_cluster_spec_epoch(self._h)
        self.initialized = bool(lib.tpu_cluster_spec_initialized(self._h))
        self.heartbeat_ms = lib.tpu_cluster_spec_heartbeat_ms(self._h)
        self.dead_after = lib.tpu_cluster_spec_dead_after(self._h)
        self.owner = _s(lib.tpu_cluster_spec_owner(self._h))
        self.resolver_version = _s(lib.tpu_cluster_spec_resolver_version(self._h))
        self.tpu_name = _s(lib.tpu_cluster_spec_tpu_name(self._h))
        self.job_name = _s(lib.tpu_cluster_spec_job_name(self._h))
        self.tasks = [_s(lib.tpu_cluster_spec_task_address(self._h, i))
                      for i in range(lib.tpu_cluster_spec_num_tasks(self._h))]

    def health(self):
        """The cluster's health name ("HEALTHY", ...)."""
        return _s(lib.tpu_health_name(lib.tpu_cluster_spec_health(self._h)))

    def core_health(self, i):
        """(health, symptom, details) of core i."""
        h = _out("tpu_core_health")
        errors.check(lib.tpu_cluster_spec_core_health(self._h, i, h))
        return (_s(lib.tpu_health_name(h.health)), _s(lib.tpu_symptom_name(h.symptom)), _s(h.details))

    def as_dict(self):
        """TensorFlow's ClusterSpec.as_dict(): {"worker": [HOST:PORT, ...]}."""
        return {self.job_name: list(self.tasks)}


class Topology:
    """The initialized system (tpu_topology; tf.tpu.experimental.Topology)."""

    def __init__(self, h):
        self._h = ffi.gc(h, lib.tpu_topology_free)

    @classmethod
    def from_serialized(cls, data):
        p = ffi.new("tpu_topology **")
        data = bytes(data)
        errors.check(lib.tpu_topology_from_serialized(data, len(data), p), errors.InvalidArgumentValueError)
        return cls(p[0])

    @property
    def epoch(self):
        return lib.tpu_topology_epoch(self._h)

    @property
    def num_replicas(self):
        return lib.tpu_topology_num_replicas(self._h)

    @property
    def num_tasks(self):
        return lib.tpu_topology_num_tasks(self._h)

    @property
    def num_tpus_per_task(self):
        return lib.tpu_topology_num_tpus_per_task(self._h)

    @property
    def tpu_type(self):
        return _s(lib.tpu_topology_tpu_type(self._h))

    @property
    def owner(self):
        return _s(lib.tpu_topology_owner(self._h))

    @property
    def mesh_shape(self):
        out = ffi.new("int[4]")
        n = lib.tpu_topology_mesh_shape(self._h, out)
        return np.array([out[i] for i in range(n)], dtype=np.int32)

    @property
    def device_coordinates(self):
        p = ffi.new("const int **")
        shp = ffi.new("int[3]")
        errors.check(lib.tpu_topology_device_coordinates(self._h, p, shp))
        n = shp[0] * shp[1] * shp[2]
        return np.frombuffer(ffi.buffer(p[0], n * ffi.sizeof("int")), dtype=np.intc).reshape(
            shp[0], shp[1], shp[2]).astype(np.int32)

    def cores(self):
        tc = _out("tpu_topology_core")
        res = []
        for r in range(self.num_replicas):
            errors.check(lib.tpu_topology_core_get(self._h, r, tc))
            res.append({"replica_id": tc.replica_id, "host_id": _s(tc.host_id), "core": tc.core,
                        "task_id": tc.task_id, "coords": [tc.coords[i] for i in range(4)],
                        "data_addr": _s(tc.data_addr)})
        return res

    @property
    def missing(self):
        return [_s(lib.tpu_topology_missing(self._h, i)) for i in range(lib.tpu_topology_num_missing(self._h))]

    def serialized(self):
        p = ffi.new("const uint8_t **")
        n = ffi.new("size_t *")
        errors.check(lib.tpu_topology_serialized(self._h, p, n))
        return bytes(ffi.buffer(p[0], n[0]))


_DTYPES = {np.dtype(np.float32): lib.TPU_F32}
_OPS = {"sum": lib.TPU_SUM, "mean": lib.TPU_MEAN, "max": lib.TPU_MAX, "min": lib.TPU_MIN}
_ALGOS = {"auto": lib.TPU_ALGO_AUTO, "ring": lib.TPU_ALGO_RING, "hd": lib.TPU_ALGO_HD, "hier": lib.TPU_ALGO_HIER}


class Cluster:
    """A connection to the resolver (tpu_cluster): experimental_connect_to_cluster."""

    def __init__(self, resolver):
        if not isinstance(resolver, Resolver):
            resolver = Resolver(resolver)
        self.resolver = resolver
        p = ffi.new("tpu_cluster **")
        st = lib.tpu_connect_to_cluster(resolver._h, p)
        errors.check(st, errors.NotFoundValueError if st == errors.NOT_FOUND else None)
        self._h = ffi.gc(p[0], lib.tpu_cluster_free)
        self.topology = None

    @property
    def endpoint(self):
        return _s(lib.tpu_cluster_endpoint(self._h))

    @property
    def client_id(self):
        return _s(lib.tpu_cluster_client_id(self._h))

    @property
    def epoch(self):
        return lib.tpu_cluster_epoch(self._h)

    @property
    def system_epoch(self):
        return lib.tpu_cluster_system_epoch(self._h)

    @property
    def num_replicas(self):
        return lib.tpu_cluster_num_replicas(self._h)

    def spec(self):
        p = ffi.new("tpu_cluster_spec **")
        errors.check(lib.tpu_cluster_spec_get(self._h, p))
        return ClusterSpec(p[0])

    def num_accelerators(self):
        n = ffi.new("int *")
        errors.check(lib.tpu_num_accelerators(self._h, n), errors.FailedPreconditionRuntimeError)
        return n[0]

    def system_metadata(self):
        m = _out("tpu_system_metadata")
        errors.check(lib.tpu_system_metadata_get(self._h, m))
        return {"num_cores": m.num_cores, "num_hosts": m.num_hosts,
                "num_of_cores_per_host": m.num_of_cores_per_host, "tpu_type": _s(m.tpu_type)}

    def initialize_system(self, expect=0, timeout_ms=0, allow_partial=False):
        """initialize_tpu_system: a new epoch; the Topology."""
        o = _out("tpu_init_options")
        o.expect, o.timeout_ms, o.allow_partial = int(expect), int(timeout_ms), int(bool(allow_partial))
        p = ffi.new("tpu_topology **")
        _call(lib.tpu_initialize_system, self._h, o, p, cancel=Cancel(self._h))
        self.topology = Topology(p[0])
        return self.topology

    def attach_system(self):
        errors.check(lib.tpu_attach_system(self._h))

    def system_check(self):
        errors.check(lib.tpu_system_check(self._h))

    def shutdown_system(self):
        errors.check(lib.tpu_shutdown_system(self._h))

    def forget_core(self, host_id, core):
        ms = ffi.new("uint64_t *")
        errors.check(lib.tpu_forget_core(self._h, _b(host_id), int(core), ms))
        return ms[0]

    # ---- chaos
    @staticmethod
    def _fault(kind, **kw):
        f = _out("tpu_fault")
        k = ffi.new("tpu_fault_kind *")
        if isinstance(kind, str):
            errors.check(lib.tpu_fault_kind_parse(_b(kind), k), errors.InvalidArgumentValueError)
            kind = k[0]
        f.kind = kind
        keep = []
        for name, v in kw.items():
            if name == "peer_host":
                keep.append(ffi.new("char[]", _b(v)))
                f.peer_host = keep[-1]
            else:
                setattr(f, name, v)
        return f, keep

    def inject_fault(self, host_id, core, kind, **fields):
        """tpuctl chaos: kind "kill", "pause", "slow", "hbm", "preempt", ... with the
        tpu_fault fields (duration_ms=, percent=, notice_ms=, at_step=, ...)."""
        f, _keep = self._fault(kind, **fields)
        errors.check(lib.tpu_inject_fault(self._h, _b(host_id), int(core), f))

    def inject_link_fault(self, a, b, kind, **fields):
        f, _keep = self._fault(kind, **fields)
        errors.check(lib.tpu_inject_link_fault(self._h, _b(a[0]), int(a[1]), _b(b[0]), int(b[1]), f))

    def inject_resolver_fault(self, kind, **fields):
        f, _keep = self._fault(kind, **fields)
        errors.check(lib.tpu_inject_resolver_fault(self._h, f))

    # ---- collectives
    def _bufs(self, arrays, name, writable=True):
        n = self.num_replicas
        if len(arrays) != n:
            raise errors.InvalidArgumentValueError(None, None, "%s: %d arrays for %d replicas" % (name, len(arrays), n))
        a0 = arrays[0]
        for a in arrays:
            if not isinstance(a, np.ndarray) or a.dtype not in _DTYPES or not a.flags.c_contiguous or (
                    writable and not a.flags.writeable):
                raise errors.InvalidArgumentValueError(
                    None, None, "%s: each replica's buffer must be a C-contiguous, writable float32 numpy array" % name)
            if a.size != a0.size:
                raise errors.InvalidArgumentValueError(None, None, "%s: the replicas' arrays differ in size" % name)
        ptrs = ffi.new("void *[]", [ffi.from_buffer(a) for a in arrays])
        return ptrs, a0.size, _DTYPES[a0.dtype]

    @staticmethod
    def _copts(algo, reproducible, group_assignment, keep):
        o = _out("tpu_collective_options")
        o.algo = _ALGOS[algo]
        o.reproducible = int(bool(reproducible))
        if group_assignment is not None:
            ga = ffi.new("int[]", [int(g) for g in group_assignment])
            keep.append(ga)
            o.group_assignment = ga
        return o

    def all_reduce(self, arrays, op="sum", algo="auto", reproducible=False, group_assignment=None):
        """In place over every replica's float32 array (one per replica, in replica order)."""
        keep = []
        ptrs, n, dt = self._bufs(arrays, "all_reduce")
        _call(lib.tpu_all_reduce, self._h, ptrs, n, dt, _OPS[op],
              self._copts(algo, reproducible, group_assignment, keep), cancel=Cancel(self._h))
        return arrays

    def broadcast(self, arrays, root=0, algo="auto"):
        keep = []
        ptrs, n, dt = self._bufs(arrays, "broadcast")
        _call(lib.tpu_broadcast, self._h, ptrs, n, dt, int(root), self._copts(algo, False, None, keep),
              cancel=Cancel(self._h))
        return arrays

    def all_gather(self, arrays, algo="auto", group_assignment=None):
        keep = []
        ptrs, n, dt = self._bufs(arrays, "all_gather", writable=False)
        g = self.num_replicas if group_assignment is None else list(group_assignment).count(group_assignment[0])
        outs = [np.empty(n * g, dtype=arrays[0].dtype) for _ in arrays]
        optrs, _, _ = self._bufs(outs, "all_gather")
        _call(lib.tpu_all_gather, self._h, ptrs, optrs, n, dt, self._copts(algo, False, group_assignment, keep),
              cancel=Cancel(self._h))
        return outs

    def reduce_scatter(self, arrays, op="sum", algo="auto"):
        keep = []
        ptrs, n, dt = self._bufs(arrays, "reduce_scatter", writable=False)
        g = self.num_replicas
        first, cnt = ffi.new("size_t *"), ffi.new("size_t *")
        outs = []
        for k in range(g):
            lib.tpu_reduce_scatter_block(n, g, k, first, cnt)
            outs.append(np.empty(cnt[0], dtype=arrays[0].dtype))
        optrs = ffi.new("void *[]", [ffi.from_buffer(a) for a in outs])
        _call(lib.tpu_reduce_scatter, self._h, ptrs, optrs, n, dt, _OPS[op], self._copts(algo, False, None, keep),
              cancel=Cancel(self._h))
        return outs

    def last_collective(self):
        st = _out("tpu_collective_stats")
        errors.check(lib.tpu_last_collective(self._h, st))
        return {"seq": st.seq, "num_replicas": st.num_replicas, "iters": st.iters, "time_ns": st.time_ns,
                "wall_ns": st.wall_ns, "algorithm": _s(st.algorithm), "transport": _s(st.transport),
                "num_failed": st.num_failed, "time_p50_ns": st.time_p50_ns}

    # ---- profile
    def profile(self, duration_ms):
        """tpu_profile_capture: every core's events for duration_ms."""
        p = ffi.new("tpu_profile **")
        _call(lib.tpu_profile_capture, self._h, int(duration_ms), p, cancel=Cancel(self._h))
        return Profile(p[0])


class Profile:
    """A captured profile (tpu_profile)."""

    def __init__(self, h):
        self._h = ffi.gc(h, lib.tpu_profile_free)

    @classmethod
    def capture_hosts(cls, service_addr, duration_ms, resolver=None):
        """capture_tpu_profile --service_addr."""
        r = resolver if resolver is not None else Resolver()
        p = ffi.new("tpu_profile **")
        _call(lib.tpu_profile_capture_hosts, r._h, _b(service_addr), int(duration_ms), p)
        return cls(p[0])

    @property
    def num_cores(self):
        return lib.tpu_profile_num_cores(self._h)

    @property
    def num_events(self):
        return lib.tpu_profile_num_events(self._h)

    def write(self, logdir):
        """The trace under LOGDIR/plugins/profile/RUN/; returns its path."""
        buf = ffi.new("char[4096]")
        errors.check(lib.tpu_profile_write(self._h, _b(logdir), buf, 4096))
        return _s(buf)

    def print_overview(self):
        _flush_py()
        lib.tpu_profile_print_overview(self._h, lib.stdout)
        lib.fflush(lib.stdout)


def _flush_py():
    import sys
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # a closed stream
            pass


from ._train import (Callback, Dataset, DistributedFiles, FileDataset, History, Model, Strategy,  # noqa: E402,F401
                     callback_checkpoint, callback_profiler_dir, callback_progress, callback_tensorboard, idx_images, idx_labels)
