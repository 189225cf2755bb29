"""Training on the emulated pod: Strategy, Dataset, Model (tpuemu/model.h, data.h)."""
import math
import os
import sys
import time

import numpy as np

from . import errors
from ._lib import b as _b, ffi, lib, s as _s
from ._run import HAVE_CANCEL, Cancel, call as _call

_ACT = {None: lib.TPU_ACT_LINEAR, "linear": lib.TPU_ACT_LINEAR, "relu": lib.TPU_ACT_RELU,
        "softmax": lib.TPU_ACT_SOFTMAX, "tanh": lib.TPU_ACT_TANH, "sigmoid": lib.TPU_ACT_SIGMOID,
        "gelu": lib.TPU_ACT_GELU, "softplus": lib.TPU_ACT_SOFTPLUS, "swish": lib.TPU_ACT_SWISH,
        "silu": lib.TPU_ACT_SWISH}
_LOSS = {"sparse_categorical_crossentropy": lib.TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY,
         "categorical_crossentropy": lib.TPU_LOSS_CATEGORICAL_CROSSENTROPY,
         "mean_squared_error": lib.TPU_LOSS_MEAN_SQUARED_ERROR, "mse": lib.TPU_LOSS_MEAN_SQUARED_ERROR}


def _flush_py():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass


class Strategy:
    """TPUStrategy over a Cluster's initialized (or attached) system."""

    def __init__(self, cluster):
        p = ffi.new("tpu_strategy **")
        errors.check(lib.tpu_strategy_new(cluster._h, p), errors.FailedPreconditionError)
        self._h = ffi.gc(p[0], lib.tpu_strategy_free)
        self.cluster = cluster

    @property
    def num_replicas_in_sync(self):
        return lib.tpu_strategy_num_replicas_in_sync(self._h)


# ---------------------------------------------------------------- datasets

class Dataset:
    """An input pipeline over numpy arrays (tpu_dataset), built lazily.

    Dataset(x, y): x is (rows, features); float32 C-contiguous arrays are
    borrowed, not copied (the caller keeps them unchanged while the dataset
    lives, as TPU_BORROW says); other dtypes are converted once to float32.
    Labels: int32 class ids are borrowed, other integers converted once
    (sparse labels); float labels are dense rows (one-hot, targets).
    Transformations return a new Dataset, as tf.data's do.
    """

    def __init__(self, x, y=None, _ops=(), _src=None):
        if _src is None:
            _src = _Source(x, y)
        self._src = _src
        self._ops = tuple(_ops)
        self._c = None

    def _with(self, op):
        return Dataset(None, _ops=self._ops + (op,), _src=self._src)

    def shuffle(self, buffer_size, seed=None):
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        return self._with(("shuffle", int(buffer_size), int(seed) & (2 ** 64 - 1)))

    def batch(self, batch_size, drop_remainder=False):
        return self._with(("batch", int(batch_size), bool(drop_remainder)))

    def cache(self):
        return self._with(("cache",))

    def prefetch(self, buffer_size):
        return self._with(("prefetch", int(buffer_size)))

    @property
    def batch_size(self):
        for op in self._ops:
            if op[0] == "batch":
                return op[1]
        return 0

    @property
    def num_rows(self):
        return self._src.n

    @property
    def x_dim(self):
        return self._src.x.shape[1]

    def num_batches(self):
        return lib.tpu_dataset_num_batches(self.c())

    def c(self, sparse=None):
        """The C dataset (made once; sparse labels forced to int32 if sparse is True)."""
        if self._c is None or (sparse and not self._c_sparse):
            self._c = self._build(sparse)
        return self._c

    def _build(self, sparse):
        x, y, kind, ydim = self._src.arrays(sparse)
        p = ffi.new("tpu_dataset **")
        errors.check(lib.tpu_dataset_from_tensor_slices(
            ffi.cast("const float *", ffi.from_buffer(x)), x.shape[0], x.shape[1],
            ffi.NULL if y is None else ffi.from_buffer(y), kind, ydim, lib.TPU_BORROW, p),
            errors.InvalidArgumentValueError)
        h = ffi.gc(p[0], lib.tpu_dataset_free)
        for op in self._ops:
            if op[0] == "shuffle":
                st = lib.tpu_dataset_shuffle(h, op[1], op[2])
            elif op[0] == "batch":
                st = lib.tpu_dataset_batch(h, op[1], int(op[2]))
            elif op[0] == "cache":
                st = lib.tpu_dataset_cache(h)
            else:
                st = lib.tpu_dataset_prefetch(h, op[1])
            errors.check(st, errors.InvalidArgumentValueError)
        self._c_sparse = kind == lib.TPU_LABELS_SPARSE
        self._keep = (x, y)  # borrowed by the C dataset
        return h

    def __iter__(self):
        """Each element as numpy arrays (x, y) (copies), one epoch per iteration."""
        ds = self.c()
        self._epoch = getattr(self, "_epoch", -1) + 1
        it = ffi.new("tpu_dataset_iter **")
        errors.check(lib.tpu_dataset_iter_new(ds, self._epoch, 0, it))
        it = ffi.gc(it[0], lib.tpu_dataset_iter_free)
        bt = ffi.new("tpu_batch *")
        xd = self._src.x.shape[1]
        kind = lib.tpu_dataset_label_kind(ds)
        yd = lib.tpu_dataset_y_dim(ds)
        while True:
            errors.check(lib.tpu_dataset_iter_next(it, bt))
            if bt.rows == 0:
                return
            x = np.frombuffer(ffi.buffer(bt.x, bt.rows * xd * 4), dtype=np.float32).reshape(bt.rows, xd).copy()
            if kind == lib.TPU_LABELS_SPARSE:
                y = np.frombuffer(ffi.buffer(bt.y, bt.rows * 4), dtype=np.int32).copy()
            elif kind == lib.TPU_LABELS_DENSE:
                y = np.frombuffer(ffi.buffer(bt.y, bt.rows * yd * 4), dtype=np.float32).reshape(bt.rows, yd).copy()
            else:
                y = None
            lib.tpu_dataset_iter_release(it, bt)
            if self.batch_size == 0:
                x = x[0]
                y = None if y is None else y[0]
            yield (x, y) if y is not None else x


_MAP = {"scale": lib.TPU_MAP_SCALE, "shift": lib.TPU_MAP_SHIFT, "normalize": lib.TPU_MAP_NORMALIZE}


class FileDataset:
    """A dataset the hosts read from IDX files of unsigned bytes (tpu_file_dataset):
    images (rows x ...) and labels (one class id per row), then built-in maps
    ("scale" x*a, "shift" x+a, "normalize" (x-a)/b), shuffle, batch (the
    per-replica batch, remainder dropped), cache and prefetch, in order.
    Transformations return a new FileDataset. distribute(strategy) gives a
    dataset fit, evaluate and predict take: each core's host runs its own
    shard's pipeline (on_hosts=True: no rows through this process), or this
    process runs the same pipelines and sends the rows (on_hosts=False)."""

    def __init__(self, images, labels, _ops=()):
        self.images = os.fspath(images)
        self.labels = os.fspath(labels)
        self._ops = tuple(_ops)
        h = self._spec()  # reads the headers now: a bad file is reported here
        self.num_rows = lib.tpu_file_dataset_num_rows(h)
        self.x_dim = lib.tpu_file_dataset_x_dim(h)

    def _with(self, op):
        return FileDataset(self.images, self.labels, self._ops + (op,))

    def map(self, kind, a, b=0.0):
        if kind not in _MAP:
            raise errors.InvalidArgumentValueError(None, None, "FileDataset.map: %r is not one of %s" % (
                kind, ", ".join(sorted(_MAP))))
        return self._with(("map", _MAP[kind], float(a), float(b)))

    def shuffle(self, buffer_size, seed):
        return self._with(("shuffle", int(buffer_size), int(seed) & (2 ** 64 - 1)))

    def batch(self, per_replica_batch, drop_remainder=True):
        return self._with(("batch", int(per_replica_batch), int(bool(drop_remainder))))

    def cache(self):
        return self._with(("cache",))

    def prefetch(self, n):
        return self._with(("prefetch", int(n)))

    def _spec(self):
        p = ffi.new("tpu_file_dataset **")
        errors.check(lib.tpu_file_dataset_from_idx(_b(self.images), _b(self.labels), p))
        h = ffi.gc(p[0], lib.tpu_file_dataset_free)
        for op in self._ops:
            if op[0] == "map":
                st = lib.tpu_file_dataset_map(h, op[1], op[2], op[3])
            elif op[0] == "shuffle":
                st = lib.tpu_file_dataset_shuffle(h, op[1], op[2])
            elif op[0] == "batch":
                st = lib.tpu_file_dataset_batch(h, op[1], op[2])
            elif op[0] == "cache":
                st = lib.tpu_file_dataset_cache(h)
            else:
                st = lib.tpu_file_dataset_prefetch(h, op[1])
            errors.check(st, errors.InvalidArgumentValueError)
        return h

    def distribute(self, strategy, on_hosts=True):
        """tpu_strategy_distribute_datasets_from_files: one pipeline per replica."""
        return DistributedFiles(self, strategy, on_hosts)


class DistributedFiles:
    """A FileDataset distributed over a strategy's replicas (what fit takes)."""

    def __init__(self, files, strategy, on_hosts):
        p = ffi.new("tpu_dataset **")
        errors.check(lib.tpu_strategy_distribute_datasets_from_files(
            strategy._h, files._spec(), lib.TPU_INPUT_ON_HOSTS if on_hosts else lib.TPU_INPUT_ON_CLIENT, p),
            errors.InvalidArgumentValueError)
        self._c = ffi.gc(p[0], lib.tpu_dataset_free)
        self.files = files
        self.on_hosts = bool(on_hosts)
        self.num_rows = files.num_rows
        self.x_dim = files.x_dim

    @property
    def batch_size(self):
        return lib.tpu_dataset_batch_size(self._c)

    def num_batches(self):
        return lib.tpu_dataset_num_batches(self._c)

    def c(self, sparse=None):
        return self._c


class _Source:
    """The arrays of a dataset, converted at most once."""

    def __init__(self, x, y):
        x = np.asarray(x)
        if x.ndim == 0:
            raise errors.InvalidArgumentValueError(None, None, "from_tensor_slices: a scalar has no rows to slice")
        if x.ndim == 1:
            x = x.reshape(-1, 1)
        if x.ndim != 2:
            x = x.reshape(x.shape[0], -1)
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise errors.InvalidArgumentValueError(None, None, "from_tensor_slices: an empty array %s" % (x.shape,))
        self.x = np.ascontiguousarray(x, dtype=np.float32)  # a copy only when not float32 C-contiguous
        self.y_raw = None if y is None else np.asarray(y)
        self.n = self.x.shape[0]
        if self.y_raw is not None and self.y_raw.shape[0] != self.n:
            raise errors.InvalidArgumentValueError(
                None, None, "from_tensor_slices: x has %d rows and y %d; every component must have the same "
                "size in its first dimension" % (self.n, self.y_raw.shape[0]))
        self._y = {}

    def arrays(self, sparse):
        y = self.y_raw
        if y is None:
            return self.x, None, lib.TPU_LABELS_NONE, 0
        if sparse or (sparse is None and y.ndim == 1 and np.issubdtype(y.dtype, np.integer)):
            if "sparse" not in self._y:
                yy = y.reshape(-1)
                if not np.issubdtype(yy.dtype, np.integer):
                    yy = yy.astype(np.int32)
                self._y["sparse"] = np.ascontiguousarray(yy, dtype=np.int32)
            return self.x, self._y["sparse"], lib.TPU_LABELS_SPARSE, 1
        if "dense" not in self._y:
            self._y["dense"] = np.ascontiguousarray(y.reshape(self.n, -1), dtype=np.float32)
        yd = self._y["dense"]
        return self.x, yd, lib.TPU_LABELS_DENSE, yd.shape[1]


# ---------------------------------------------------------------- callbacks from Python

class _Hooks:
    """One C callback dispatching to Python objects with Keras' methods
    (on_epoch_begin(epoch, logs), on_train_batch_end(batch, logs), ...)."""

    FIT = {"begin": "on_train_begin", "epoch_begin": "on_epoch_begin", "batch_begin": "on_train_batch_begin",
           "batch_end": "on_train_batch_end", "epoch_end": "on_epoch_end", "end": "on_train_end"}
    EVALUATE = {"begin": "on_test_begin", "batch_begin": "on_test_batch_begin", "batch_end": "on_test_batch_end",
                "end": "on_test_end"}
    PREDICT = {"begin": "on_predict_begin", "batch_begin": "on_predict_batch_begin",
               "batch_end": "on_predict_batch_end", "end": "on_predict_end"}

    def __init__(self, model, callbacks, cancel, batches=True, names=FIT):
        self.model = model
        self.names = names
        self.callbacks = list(callbacks)
        self.cancel = cancel
        self.exc = None
        self.handle = ffi.new_handle(self)
        self.c = ffi.new("tpu_callback *")
        self.c.user = self.handle
        self.c.on_train_begin = lib._py_on_train_begin
        self.c.on_epoch_begin = lib._py_on_epoch_begin
        self.c.on_epoch_end = lib._py_on_epoch_end
        self.c.on_train_end = lib._py_on_train_end
        if batches:
            self.c.on_batch_begin = lib._py_on_batch_begin
            self.c.on_batch_end = lib._py_on_batch_end

    def dispatch(self, kind, *args):
        method = self.names.get(kind)
        if method is None:
            return lib.TPU_OK
        if self.exc is not None:
            return lib.TPU_ABORTED
        if self.cancel is not None and self.cancel.requested:
            return lib.TPU_ABORTED  # Ctrl-C: the call raises KeyboardInterrupt
        try:
            for cb in self.callbacks:
                fn = getattr(cb, method, None)
                if fn is not None:
                    fn(*args)
        except BaseException as e:  # re-raised by fit as the same object
            self.exc = e
            return lib.TPU_ABORTED
        if getattr(self.model, "stop_training", False):
            return lib.TPU_CANCELLED
        return lib.TPU_OK


def _logs(self, lg):
    return {} if self.names is _Hooks.PREDICT else logs_dict(lg)


_Hooks.logs = _logs


def logs_dict(lg, prefix=""):
    d = {prefix + "loss": lg.loss}
    if not math.isnan(lg.accuracy):
        d[prefix + "accuracy"] = lg.accuracy
    if lg.has_val:
        d["val_loss"] = lg.val_loss
        if not math.isnan(lg.val_accuracy):
            d["val_accuracy"] = lg.val_accuracy
    return d


def _hooks(user):
    return ffi.from_handle(user)


@ffi.def_extern(error=lib.TPU_ABORTED)
def _py_on_train_begin(m, user):
    return _hooks(user).dispatch("begin", {})


@ffi.def_extern(error=lib.TPU_ABORTED)
def _py_on_epoch_begin(m, epoch, user):
    return _hooks(user).dispatch("epoch_begin", epoch, {})


@ffi.def_extern(error=lib.TPU_ABORTED)
def _py_on_batch_begin(m, epoch, batch, user):
    return _hooks(user).dispatch("batch_begin", batch, {})


@ffi.def_extern(error=lib.TPU_ABORTED)
def _py_on_batch_end(m, epoch, batch, logs, user):
    return _hooks(user).dispatch("batch_end", batch, _hooks(user).logs(logs))


@ffi.def_extern(error=lib.TPU_ABORTED)
def _py_on_epoch_end(m, epoch, logs, user):
    return _hooks(user).dispatch("epoch_end", epoch, logs_dict(logs))


@ffi.def_extern(error=lib.TPU_ABORTED)
def _py_on_train_end(m, logs, user):
    return _hooks(user).dispatch("end", _hooks(user).logs(logs))


# ---------------------------------------------------------------- history

class History:
    """What fit did: per epoch logs (Keras' History.history)."""

    def __init__(self):
        self.history = {}
        self.epoch = []
        self.params = {}
        self.model = None

    def _fill(self, h):
        lg = ffi.new("tpu_logs *")
        for i in range(lib.tpu_history_num_epochs(h)):
            errors.check(lib.tpu_history_epoch(h, i, lg))
            self.epoch.append(lg.epoch)
            for k, v in logs_dict(lg).items():
                self.history.setdefault(k, []).append(v)
        self.events = []
        ev = ffi.new("tpu_elastic_event *")
        for i in range(lib.tpu_history_num_events(h)):
            errors.check(lib.tpu_history_event(h, i, ev))
            self.events.append({"kind": _s(lib.tpu_elastic_event_kind_name(ev.kind)), "step": ev.step,
                                "restored_step": ev.restored_step, "replicas_before": ev.replicas_before,
                                "replicas_after": ev.replicas_after, "from": _s(getattr(ev, "from")),
                                "cause": _s(ev.cause)})


# ---------------------------------------------------------------- model

class Model:
    """A Sequential model of Dense layers on the cores of a strategy (tpu_model)."""

    def __init__(self, strategy, input_dim, layers, seed=None):
        p = ffi.new("tpu_model **")
        errors.check(lib.tpu_model_new(strategy._h, int(input_dim), p), errors.InvalidArgumentValueError)
        self._h = ffi.gc(p[0], lib.tpu_model_free)
        self.strategy = strategy
        self.input_dim = int(input_dim)
        for units, act in layers:
            errors.check(lib.tpu_model_add_dense(self._h, int(units), _ACT[act]), errors.InvalidArgumentValueError)
        if seed is not None:
            errors.check(lib.tpu_model_set_seed(self._h, int(seed)))
        self.units = [u for u, _ in layers]
        self.stop_training = False
        self.loss_kind = None

    def compile(self, optimizer=None, loss="sparse_categorical_crossentropy", metrics_accuracy=True,
                steps_per_execution=1, policy="float32", batch_size=0, infeed_depth=0, deterministic=False,
                from_logits=False):
        """optimizer: a filled tpu_optimizer (tpu_optimizer_adam(...)) or None for Adam()."""
        co = ffi.new("tpu_compile_options *")
        lib.tpu_compile_options_init(co)
        if optimizer is not None:
            co.optimizer = optimizer
        if isinstance(loss, str):
            if loss not in _LOSS:
                raise errors.InvalidArgumentValueError(None, None, "unknown loss %r (the cores have: %s)" % (
                    loss, ", ".join(sorted(_LOSS))))
            loss = _LOSS[loss]
        co.loss = loss
        self.loss_kind = loss
        co.metrics_accuracy = int(bool(metrics_accuracy))
        co.steps_per_execution = int(steps_per_execution)
        co.policy = lib.TPU_POLICY_MIXED_BFLOAT16 if policy == "mixed_bfloat16" else lib.TPU_POLICY_FLOAT32
        co.batch_size = int(batch_size)
        if infeed_depth:
            co.infeed_depth = int(infeed_depth)
        co.deterministic = int(bool(deterministic))
        co.from_logits = int(bool(from_logits))
        self._co = co
        errors.check(lib.tpu_model_compile(self._h, co), errors.InvalidArgumentValueError
                     if lib.tpu_last_status() == errors.INVALID_ARGUMENT else None)

    def _sparse(self):
        return self.loss_kind == lib.TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY

    def num_params(self):
        return lib.tpu_model_num_params(self._h)

    def summary_text(self):
        buf = ffi.new("char[8192]")
        lib.tpu_model_summary(self._h, buf, 8192)
        return _s(buf)

    def fit(self, dataset, epochs=1, initial_epoch=0, callbacks=(), c_callbacks=(), validation_data=None,
            progress=True, preemption_checkpoint=None, resume=False, stop_owner=None):
        """tpu_model_fit; Python callbacks get Keras' hooks. Returns a History."""
        cancel = Cancel(self.strategy.cluster._h)
        want_batches = not HAVE_CANCEL or any(
            _overrides(cb, ("on_train_batch_begin", "on_train_batch_end")) for cb in callbacks)
        hooks = _Hooks(stop_owner or self, callbacks, cancel, batches=want_batches)
        cbs = ffi.new("tpu_callback[]", 2 + len(c_callbacks))
        n = 0
        keep = []
        if progress:
            errors.check(lib.tpu_callback_progress(lib.stdout, cbs + n))
            n += 1
        for c in c_callbacks:
            cbs[n] = c[0]
            n += 1
        cbs[n] = hooks.c[0]
        n += 1
        fo = ffi.new("tpu_fit_options *")
        fo.epochs = int(epochs)
        fo.initial_epoch = int(initial_epoch)
        fo.resume = int(bool(resume))
        fo.callbacks = cbs
        fo.num_callbacks = n
        if validation_data is not None:
            fo.validation_data = validation_data.c(self._sparse())
        if preemption_checkpoint is not None:
            keep.append(ffi.new("char[]", _b(preemption_checkpoint)))
            fo.preemption_checkpoint = keep[-1]
        hp = ffi.new("tpu_history **")
        ds = dataset.c(self._sparse())
        self.stop_training = False
        _flush_py()
        err = None
        try:
            _call(lib.tpu_model_fit, self._h, ds, fo, hp, cancel=cancel)
        except errors.OpError as e:
            err = e
        finally:
            lib.fflush(lib.stdout)
            if progress:
                lib.tpu_callback_free(cbs)
        history = History()
        if hp[0] != ffi.NULL:
            history._fill(hp[0])
            lib.tpu_history_free(hp[0])
        if hooks.exc is not None:
            raise hooks.exc
        if err is not None:
            err.history = history
            raise err
        return history

    def _eval_hooks(self, callbacks, names, cancel):
        want = not HAVE_CANCEL or any(
            _overrides(cb, (names["batch_begin"], names["batch_end"])) for cb in callbacks)
        hooks = _Hooks(self, callbacks, cancel, batches=want, names=names)
        eo = ffi.new("tpu_eval_options *")
        lib.tpu_eval_options_init(eo)
        eo.callbacks = hooks.c
        eo.num_callbacks = 1
        return hooks, eo

    def evaluate(self, dataset, callbacks=()):
        """(loss, accuracy) over the dataset (accuracy NaN when not computed); Python
        callbacks get Keras' on_test_* hooks."""
        loss, acc = ffi.new("double *"), ffi.new("double *")
        cancel = Cancel(self.strategy.cluster._h)
        hooks, eo = self._eval_hooks(callbacks, _Hooks.EVALUATE, cancel)
        try:
            _call(lib.tpu_model_evaluate_with, self._h, dataset.c(self._sparse()), eo, loss, acc, cancel=cancel)
        except errors.OpError:
            if hooks.exc is not None:
                raise hooks.exc
            raise
        return loss[0], acc[0]

    def predict(self, dataset, callbacks=()):
        """The last layer's outputs (rows x units); Python callbacks get on_predict_* hooks."""
        rows = dataset.num_rows
        out = np.empty((rows, self.units[-1]), dtype=np.float32)
        got = ffi.new("size_t *")
        cancel = Cancel(self.strategy.cluster._h)
        hooks, eo = self._eval_hooks(callbacks, _Hooks.PREDICT, cancel)
        try:
            _call(lib.tpu_model_predict_with, self._h, dataset.c(), eo, ffi.cast("float *", ffi.from_buffer(out)),
                  rows, got, cancel=cancel)
        except errors.OpError:
            if hooks.exc is not None:
                raise hooks.exc
            raise
        return out[:got[0]]

    def get_weights(self, replica=0):
        """The weights, layer by layer: [kernel (in x units), bias, ...] as numpy arrays."""
        flat = np.empty(self.num_params(), dtype=np.float32)
        errors.check(lib.tpu_model_get_weights(self._h, int(replica), ffi.cast("float *", ffi.from_buffer(flat)),
                                               flat.size))
        res, off, prev = [], 0, self.input_dim
        for u in self.units:
            res.append(flat[off:off + prev * u].reshape(prev, u))
            off += prev * u
            res.append(flat[off:off + u])
            off += u
            prev = u
        return res

    def save_checkpoint(self, path):
        errors.check(lib.tpu_model_save_checkpoint(self._h, _b(path)))

    def load_checkpoint(self, path):
        errors.check(lib.tpu_model_load_checkpoint(self._h, _b(path)))

    @property
    def step(self):
        return lib.tpu_model_step(self._h)

    @property
    def epoch(self):
        return lib.tpu_model_epoch(self._h)

    def notice(self):
        """(kind name, replica) of the notice the last training answers carried."""
        nt = ffi.new("tpu_notice *")
        r = ffi.new("int *")
        errors.check(lib.tpu_model_notice(self._h, nt, r))
        return _s(lib.tpu_notice_kind_name(nt.kind)), r[0]

    def last_step_stats(self):
        st = ffi.new("tpu_step_stats *")
        errors.check(lib.tpu_model_last_step_stats(self._h, st))
        return {"step": st.step, "wall_ns": st.wall_ns, "input_wait_ns": st.input_wait_ns,
                "compute_ns": st.compute_ns, "rows": st.rows}


class Callback:
    """Keras' Callback: override the hooks wanted; self.model is the model."""

    def __init__(self):
        self.model = None
        self.params = {}

    def set_model(self, model):
        self.model = model

    def set_params(self, params):
        self.params = params

    def on_train_begin(self, logs=None): pass
    def on_train_end(self, logs=None): pass
    def on_epoch_begin(self, epoch, logs=None): pass
    def on_epoch_end(self, epoch, logs=None): pass
    def on_train_batch_begin(self, batch, logs=None): pass
    def on_train_batch_end(self, batch, logs=None): pass
    def on_test_begin(self, logs=None): pass
    def on_test_end(self, logs=None): pass
    def on_test_batch_begin(self, batch, logs=None): pass
    def on_test_batch_end(self, batch, logs=None): pass
    def on_predict_begin(self, logs=None): pass
    def on_predict_end(self, logs=None): pass
    def on_predict_batch_begin(self, batch, logs=None): pass
    def on_predict_batch_end(self, batch, logs=None): pass


def _overrides(cb, names):
    """Does cb define one of these hooks (beyond Callback's no-ops)?"""
    for name in names:
        fn = getattr(type(cb), name, None)
        if fn is not None and fn is not getattr(Callback, name, None):
            return True
    return False


# ---------------------------------------------------------------- C callbacks and IDX files

def callback_progress():
    """Keras' progress bar on C's stdout (tpu_callback_progress)."""
    cb = ffi.gc(ffi.new("tpu_callback *"), lib.tpu_callback_free)
    errors.check(lib.tpu_callback_progress(lib.stdout, cb))
    return cb


def callback_tensorboard(log_dir, first=0, last=0):
    """TensorBoard(log_dir, profile_batch='first,last') (tpu_callback_tensorboard)."""
    cb = ffi.gc(ffi.new("tpu_callback *"), lib.tpu_callback_free)
    errors.check(lib.tpu_callback_tensorboard(_b(log_dir), int(first), int(last), cb))
    return cb


def callback_checkpoint(path, save_every_steps=0):
    """ModelCheckpoint to path (tpu_callback_checkpoint)."""
    cb = ffi.gc(ffi.new("tpu_callback *"), lib.tpu_callback_free)
    errors.check(lib.tpu_callback_checkpoint(_b(path), int(save_every_steps), cb))
    return cb


def callback_profiler_dir(cb):
    return _s(lib.tpu_callback_profiler_dir(cb))


def _idx(path):
    a = ffi.gc(ffi.new("tpu_idx *"), lib.tpu_idx_free)
    errors.check(lib.tpu_idx_read(_b(path), a))
    return a


def idx_images(path, scale):
    """An IDX file of unsigned-byte images as float32 rows scaled by scale
    (tpu_idx_read, tpu_idx_to_float): (items, pixels), no further copy."""
    a = _idx(path)
    p = ffi.new("float **")
    errors.check(lib.tpu_idx_to_float(a, scale, p))
    buf = ffi.gc(p[0], lib.free)
    n = a.dims[0]
    return np.frombuffer(ffi.buffer(buf, a.count * 4), dtype=np.float32).reshape(n, a.count // n)


def idx_labels(path):
    """An IDX file of unsigned-byte labels as int32 class ids (tpu_idx_to_labels)."""
    a = _idx(path)
    p = ffi.new("int32_t **")
    errors.check(lib.tpu_idx_to_labels(a, p))
    buf = ffi.gc(p[0], lib.free)
    return np.frombuffer(ffi.buffer(buf, a.count * 4), dtype=np.int32)
