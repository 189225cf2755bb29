"""tf.keras over the library's models (tpuemu/model.h): Sequential models of
Dense layers, trained on every core of the strategy in scope."""
import math
import os
import sys
import time

import numpy as np

from .. import errors
from .._lib import b as _b, ffi, lib, s as _s
from .._train import Callback, Dataset as _CDataset, History as _CHistory, Model as _CModel, _flush_py
from ._ns import Namespace, Offered, not_offered
from . import _data, _distribute

EXIT_PREEMPTED = 42

# ---------------------------------------------------------------- mixed precision


class Policy:
    """tf.keras.mixed_precision.Policy('float32' | 'mixed_bfloat16')."""

    def __init__(self, name):
        if name not in ("float32", "mixed_bfloat16"):
            raise errors.InvalidArgumentValueError(
                None, None, "Cannot convert value %r to a mixed precision Policy: the cores have float32 and "
                "mixed_bfloat16" % (name,))
        self.name = name
        self.compute_dtype = "bfloat16" if name == "mixed_bfloat16" else "float32"
        self.variable_dtype = "float32"

    def __repr__(self):
        return '<Policy "%s">' % self.name


_policy = [Policy("float32")]


def set_global_policy(policy):
    _policy[0] = policy if isinstance(policy, Policy) else Policy(policy if policy is not None else "float32")


def global_policy():
    return _policy[0]


mixed_precision = Namespace("tf.keras.mixed_precision", Policy=Policy, set_global_policy=set_global_policy,
                            global_policy=global_policy)

# ---------------------------------------------------------------- optimizers and schedules


class LearningRateSchedule:
    def _c(self):
        raise NotImplementedError

    def __call__(self, step):
        s = self._c()
        return np.float32(lib.tpu_lr_schedule_value(s, int(step)))


class ExponentialDecay(LearningRateSchedule):
    def __init__(self, initial_learning_rate, decay_steps, decay_rate, staircase=False, name=None):
        self.args = (initial_learning_rate, decay_steps, decay_rate, staircase)

    def _c(self):
        a = self.args
        return lib.tpu_exponential_decay(a[0], int(a[1]), a[2], int(bool(a[3])))


class CosineDecay(LearningRateSchedule):
    def __init__(self, initial_learning_rate, decay_steps, alpha=0.0, name=None, warmup_target=None,
                 warmup_steps=0):
        self.args = (initial_learning_rate, decay_steps, alpha, warmup_target, warmup_steps)

    def _c(self):
        a = self.args
        if a[3] is None:
            return lib.tpu_cosine_decay(a[0], int(a[1]), a[2])
        return lib.tpu_cosine_decay_warmup(a[0], int(a[1]), a[2], a[3], int(a[4]))


class PiecewiseConstantDecay(LearningRateSchedule):
    def __init__(self, boundaries, values, name=None):
        self.args = (list(boundaries), list(values))

    def _c(self):
        out = ffi.new("tpu_lr_schedule *")
        b, v = self.args
        errors.check(lib.tpu_piecewise_constant_decay(ffi.new("uint64_t[]", [int(x) for x in b]), len(b),
                                                      ffi.new("float[]", [float(x) for x in v]), out),
                     errors.InvalidArgumentValueError)
        return out[0]


class Adam:
    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-07, amsgrad=False, **kwargs):
        if amsgrad:
            raise not_offered("Adam(amsgrad=True)", "the cores run Adam")()
        self.learning_rate, self.beta_1, self.beta_2, self.epsilon = learning_rate, beta_1, beta_2, epsilon

    def _c(self):
        lr = self.learning_rate
        o = lib.tpu_optimizer_adam_schedule(lr._c()) if isinstance(lr, LearningRateSchedule) else \
            lib.tpu_optimizer_adam(float(lr))
        o.beta_1, o.beta_2, o.epsilon = self.beta_1, self.beta_2, self.epsilon
        return o


class SGD:
    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, **kwargs):
        self.learning_rate, self.momentum, self.nesterov = learning_rate, momentum, nesterov

    def _c(self):
        lr = self.learning_rate
        o = lib.tpu_optimizer_sgd_schedule(lr._c(), self.momentum) if isinstance(lr, LearningRateSchedule) else \
            lib.tpu_optimizer_sgd(float(lr), self.momentum)
        o.nesterov = int(bool(self.nesterov))
        return o


optimizers = Namespace("tf.keras.optimizers", Adam=Adam, SGD=SGD, schedules=Namespace(
    "tf.keras.optimizers.schedules", ExponentialDecay=ExponentialDecay, CosineDecay=CosineDecay,
    PiecewiseConstantDecay=PiecewiseConstantDecay, LearningRateSchedule=LearningRateSchedule))._not(
    RMSprop="the cores run Adam and SGD", Adagrad="the cores run Adam and SGD")

# ---------------------------------------------------------------- layers


class Dense:
    """tf.keras.layers.Dense(units, activation)."""

    def __init__(self, units, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", input_shape=None, input_dim=None, dtype=None, name=None, **kwargs):
        if activation not in (None, "linear", "relu", "softmax", "tanh", "sigmoid", "gelu", "softplus", "swish",
                              "silu"):
            raise errors.InvalidArgumentValueError(
                None, None, "Dense: activation %r is not one of the cores' (relu, softmax, tanh, sigmoid, gelu, "
                "softplus, swish, linear)"
                % (activation,))
        if not use_bias or kernel_initializer != "glorot_uniform" or bias_initializer != "zeros" or kwargs:
            raise not_offered("Dense(%s)" % ", ".join(sorted(kwargs) or ["use_bias/initializers"]),
                              "the cores' Dense has a bias, glorot-uniform kernels and zero biases")()
        self.units = int(units)
        self.activation = activation
        self.dtype_policy = Policy(dtype) if isinstance(dtype, str) else _policy[0]
        self.input_dim = input_dim or (int(np.prod(input_shape)) if input_shape is not None else None)
        self.name = name or "dense"


class InputSpec:
    def __init__(self, shape):
        self.shape = shape


def Input(shape=None, batch_size=None, name=None, dtype=None, **kwargs):
    return InputSpec(tuple(shape))


layers = Namespace("tf.keras.layers", Dense=Dense, Input=Input)._not(
    Conv2D="the cores run Dense layers", Dropout="the cores run Dense layers",
    Flatten="pass rows: x.reshape(-1, features)", BatchNormalization="the cores run Dense layers")

# ---------------------------------------------------------------- callbacks


class TensorBoard(Callback):
    """TensorBoard(log_dir, profile_batch='10,20'): epoch scalars under
    log_dir/train and the profile of the batches given (tpu_callback_tensorboard)."""

    def __init__(self, log_dir="logs", histogram_freq=0, write_graph=True, write_images=False,
                 write_steps_per_second=False, update_freq="epoch", profile_batch=0, embeddings_freq=0,
                 embeddings_metadata=None, **kwargs):
        super().__init__()
        if histogram_freq or embeddings_freq:
            raise not_offered("TensorBoard(histogram_freq/embeddings_freq)", "the epoch scalars and the profile")()
        self.log_dir = str(log_dir)
        pb = profile_batch
        if isinstance(pb, str):
            parts = [p.strip() for p in pb.split(",")]
            if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
                raise errors.InvalidArgumentValueError(
                    None, None, "profile_batch must be a non-negative integer or 2-tuple of positive integers. "
                    "A pair of positive integers signifies a range of batches to profile. Found: %s" % pb)
            pb = [int(p) for p in parts]
        if isinstance(pb, int):
            pb = [pb, pb]
        self.first, self.last = int(pb[0]), int(pb[-1])
        self._cb = None

    def _c(self):
        self._cb = ffi.gc(ffi.new("tpu_callback *"), lib.tpu_callback_free)
        errors.check(lib.tpu_callback_tensorboard(_b(self.log_dir), self.first, self.last, self._cb))
        return self._cb

    @property
    def profile_dir(self):
        return "" if self._cb is None else _s(lib.tpu_callback_profiler_dir(self._cb))


class ModelCheckpoint(Callback):
    """ModelCheckpoint(filepath, save_freq='epoch' | N steps): the library's
    checkpoint file (weights, optimizer state, step), saved atomically."""

    def __init__(self, filepath, monitor="val_loss", verbose=0, save_best_only=False, save_weights_only=False,
                 mode="auto", save_freq="epoch", **kwargs):
        super().__init__()
        if save_best_only:
            raise not_offered("ModelCheckpoint(save_best_only=True)", "it saves every epoch or every N steps")()
        self.filepath = str(filepath)
        self.every = 0 if save_freq == "epoch" else int(save_freq)
        self._cb = None

    def _c(self):
        self._cb = ffi.gc(ffi.new("tpu_callback *"), lib.tpu_callback_free)
        errors.check(lib.tpu_callback_checkpoint(_b(self.filepath), self.every, self._cb))
        return self._cb


class BackupAndRestore(Callback):
    """BackupAndRestore(backup_dir): fit resumes from the backup when there is
    one; on a preemption or maintenance notice every core stops at the same
    step, the backup is saved and the program exits with status 42 (TensorFlow's
    restartable exit code), as PreemptionCheckpointHandler does on Cloud TPU."""

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True, save_before_preemption=True):
        super().__init__()
        self.backup_dir = str(backup_dir)
        self.delete_checkpoint = delete_checkpoint
        self.every = 0 if save_freq == "epoch" else int(save_freq)
        os.makedirs(self.backup_dir, exist_ok=True)
        self.path = os.path.join(self.backup_dir, "ckpt")
        self._cb = None

    def _c(self):
        self._cb = ffi.gc(ffi.new("tpu_callback *"), lib.tpu_callback_free)
        errors.check(lib.tpu_callback_checkpoint(_b(self.path), self.every, self._cb))
        return self._cb


class EarlyStopping(Callback):
    def __init__(self, monitor="val_loss", min_delta=0, patience=0, verbose=0, mode="auto", baseline=None,
                 restore_best_weights=False, start_from_epoch=0):
        super().__init__()
        if restore_best_weights:
            raise not_offered("EarlyStopping(restore_best_weights=True)",
                              "keep the best epoch's ModelCheckpoint and load it")()
        self.monitor, self.min_delta, self.patience = monitor, abs(min_delta), patience
        self.mode = mode if mode != "auto" else ("max" if "acc" in monitor else "min")
        self.baseline, self.start_from_epoch = baseline, start_from_epoch
        self.stopped_epoch = 0

    def on_train_begin(self, logs=None):
        self.wait, self.best = 0, (math.inf if self.mode == "min" else -math.inf)
        if self.baseline is not None:
            self.best = self.baseline

    def on_epoch_end(self, epoch, logs=None):
        v = (logs or {}).get(self.monitor)
        if v is None or epoch < self.start_from_epoch:
            return
        better = v < self.best - self.min_delta if self.mode == "min" else v > self.best + self.min_delta
        if better:
            self.best, self.wait = v, 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.stopped_epoch = epoch
                self.model.stop_training = True


class LambdaCallback(Callback):
    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_batch_begin=None, on_batch_end=None,
                 on_train_begin=None, on_train_end=None, **kwargs):
        super().__init__()
        for name, fn in [("on_epoch_begin", on_epoch_begin), ("on_epoch_end", on_epoch_end),
                         ("on_train_batch_begin", on_batch_begin), ("on_train_batch_end", on_batch_end),
                         ("on_train_begin", on_train_begin), ("on_train_end", on_train_end)]:
            if fn is not None:
                setattr(self, name, fn)
        for k, fn in kwargs.items():
            setattr(self, k, fn)


class TerminateOnNaN(Callback):
    def on_train_batch_end(self, batch, logs=None):
        if math.isnan((logs or {}).get("loss", 0.0)) or math.isinf((logs or {}).get("loss", 0.0)):
            print("Batch %d: Invalid loss, terminating training" % batch)
            self.model.stop_training = True


class History(Callback):
    """What fit returns: .history {'loss': [...], 'accuracy': [...]}, .epoch, .params."""

    def __init__(self):
        super().__init__()
        self.history = {}
        self.epoch = []


callbacks = Namespace("tf.keras.callbacks", Callback=Callback, TensorBoard=TensorBoard,
                      ModelCheckpoint=ModelCheckpoint, BackupAndRestore=BackupAndRestore,
                      EarlyStopping=EarlyStopping, LambdaCallback=LambdaCallback, TerminateOnNaN=TerminateOnNaN,
                      History=History)._not(
    LearningRateScheduler="the cores evaluate the learning rate: give the optimizer a "
                          "tf.keras.optimizers.schedules schedule (tpu_lr_schedule in C)",
    ReduceLROnPlateau="give the optimizer a tf.keras.optimizers.schedules schedule (tpu_lr_schedule)",
    CSVLogger="read the History fit returns")

# ---------------------------------------------------------------- models

_LOSSES = {"sparse_categorical_crossentropy", "categorical_crossentropy", "mean_squared_error", "mse"}


class Sequential(Offered):
    """tf.keras.Sequential([Dense, ...]) built in the strategy in scope; compiled
    onto every core of it at the first fit, evaluate or predict (or at once
    when its input shape is known)."""

    def __init__(self, layers=None, name=None):
        self._strategy = _distribute.get_strategy()
        if self._strategy._s is None:
            raise errors.FailedPreconditionRuntimeError(
                None, None, "tpuemu.tf: build the model inside `with strategy.scope():` of a TPUStrategy "
                "(the cores of the initialized TPU system hold it)")
        self.layers = []
        self.name = name or "sequential"
        self._input_dim = None
        self._m = None
        self._compiled = None
        self._restore = None
        self.stop_training = False
        self.history = None
        for layer in layers or []:
            self.add(layer)

    def add(self, layer):
        if isinstance(layer, InputSpec):
            self._input_dim = int(np.prod(layer.shape))
            return
        if not isinstance(layer, Dense):
            raise not_offered("Sequential.add(%s)" % type(layer).__name__, "the cores run Dense layers")()
        if not self.layers and layer.input_dim:
            self._input_dim = layer.input_dim
        self.layers.append(layer)
        if self._m is None and self._input_dim and self._compiled:
            self._build(self._input_dim)

    def build(self, input_shape=None):
        self._build(int(np.prod(input_shape[1:])))

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None, weighted_metrics=None,
                run_eagerly=None, steps_per_execution=None, jit_compile=None, **kwargs):
        if isinstance(optimizer, str):
            opt = {"adam": Adam, "sgd": SGD}.get(optimizer.lower())
            if opt is None:
                raise errors.InvalidArgumentValueError(
                    None, None, "Could not interpret optimizer identifier: %s (the cores run adam and sgd)" % optimizer)
            optimizer = opt()
        if not isinstance(optimizer, (Adam, SGD)):
            raise errors.InvalidArgumentValueError(None, None, "Could not interpret optimizer: %r" % (optimizer,))
        from_logits = isinstance(loss, _Loss) and loss.from_logits
        lname = loss.name if isinstance(loss, _Loss) else getattr(loss, "__name__", loss)
        if lname not in _LOSSES:
            raise errors.InvalidArgumentValueError(
                None, None, "Could not interpret loss identifier: %r (the cores compute %s)" % (
                    loss, ", ".join(sorted(_LOSSES))))
        metrics = list(metrics or [])
        for mt in metrics:
            if mt not in ("accuracy", "acc", "sparse_categorical_accuracy", "categorical_accuracy"):
                raise not_offered("metrics=[%r]" % (mt,), "the cores compute the loss and accuracy")()
        self.optimizer = optimizer
        self.loss = lname
        self._compiled = dict(optimizer=optimizer, loss=lname, from_logits=from_logits, acc=bool(metrics),
                              spe=int(steps_per_execution or 1))
        if self._input_dim:
            self._build(self._input_dim)

    def _build(self, input_dim):
        if self._m is not None:
            if input_dim != self._m.input_dim:
                raise errors.InvalidArgumentValueError(
                    None, None, "Input 0 of layer \"%s\" is incompatible with the layer: expected shape=(None, %d), "
                    "found shape=(None, %d)" % (self.layers[0].name, self._m.input_dim, input_dim))
            return
        if self._compiled is None:
            raise errors.FailedPreconditionRuntimeError(
                None, None, "You must compile your model before training/testing. Use `model.compile(optimizer, loss)`.")
        if not self.layers:
            raise errors.InvalidArgumentValueError(None, None, "the Sequential model has no layers")
        from . import _seed, _next_seed
        seed = _next_seed() if _seed[0] is not None else None
        m = _CModel(self._strategy._s, input_dim, [(l.units, l.activation) for l in self.layers], seed=seed)
        c = self._compiled
        policy = self.layers[0].dtype_policy.name
        m.compile(optimizer=c["optimizer"]._c(), loss=c["loss"], from_logits=c["from_logits"],
                  metrics_accuracy=c["acc"], steps_per_execution=c["spe"], policy=policy)
        self._m = m
        self._m.stop_training = False
        self._input_dim = input_dim
        if self._restore:
            m.load_checkpoint(self._restore)
            self._restore = None

    def _restore_from(self, path):
        if self._m is not None:
            self._m.load_checkpoint(path)
        else:
            self._restore = path

    def _pending_step(self):
        if self._m is None:
            raise errors.FailedPreconditionRuntimeError(
                None, None, "the model is not built yet: give its input shape (Dense(input_shape=...)) "
                "so that the checkpoint can be restored")
        return self._m.step

    # the cores' built-in steps, for strategy.run
    def train_step(self, data):
        raise not_offered("model.train_step(data)", "call it through strategy.run(model.train_step, args=(x,))")()

    def test_step(self, data):
        raise not_offered("model.test_step(data)", "call it through strategy.run(model.test_step, args=(x,))")()

    def predict_step(self, data):
        raise not_offered("model.predict_step(data)", "call it through strategy.run(model.predict_step, args=(x,))")()

    train_step._tpu_step = lib.TPU_STEP_TRAIN
    test_step._tpu_step = lib.TPU_STEP_EVALUATE
    predict_step._tpu_step = lib.TPU_STEP_PREDICT

    @staticmethod
    def _dataset(x, y, batch_size, what, shuffle=False):
        if isinstance(x, _data.Dataset):
            if y is not None:
                raise errors.InvalidArgumentValueError(
                    None, None, "`y` argument is not supported when using dataset as input.")
            return x
        if x is None:
            raise errors.InvalidArgumentValueError(None, None, "%s: no data (x is None)" % what)
        d = _data.Dataset(_CDataset(x, y))
        if shuffle:
            from . import _next_seed
            d = _data.Dataset(d._d.shuffle(d._d.num_rows, _next_seed()))
        return _data.Dataset(d._d.batch(batch_size or 32))

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1, **kwargs):
        for name, v, default in [("validation_split", validation_split, 0.0), ("class_weight", class_weight, None),
                                 ("sample_weight", sample_weight, None), ("steps_per_epoch", steps_per_epoch, None),
                                 ("validation_freq", validation_freq, 1)]:
            if v != default:
                raise not_offered("fit(%s=)" % name, "fit runs whole epochs over the dataset given, "
                                  "validating after each")()
        ds = self._dataset(x, y, batch_size, "fit", shuffle=shuffle)
        self._build(ds._d.x_dim)
        val = None
        if validation_data is not None:
            val = validation_data if isinstance(validation_data, _data.Dataset) else self._dataset(
                validation_data[0], validation_data[1], validation_batch_size or batch_size, "validation")
        c_cbs, py_cbs, backup = [], [], None
        hist = History()
        for cb in list(callbacks or []) + [hist]:
            cb.set_model(self)
            if isinstance(cb, (TensorBoard, ModelCheckpoint, BackupAndRestore)):
                c_cbs.append(cb._c())
                if isinstance(cb, BackupAndRestore):
                    backup = cb
            else:
                py_cbs.append(cb)
        params = {"verbose": 1 if verbose == "auto" else verbose, "epochs": epochs, "steps": len(ds)}
        for cb in py_cbs:
            cb.set_params(params)
        resume = False
        if backup is not None and os.path.exists(backup.path):
            self._m.load_checkpoint(backup.path)
            resume = True
        self._m.stop_training = False
        try:
            h = self._m.fit(ds._d, epochs=epochs, initial_epoch=initial_epoch, callbacks=py_cbs,
                            c_callbacks=[c for c in c_cbs], validation_data=None if val is None else val._d,
                            progress=verbose not in (0, False), resume=resume,
                            preemption_checkpoint=None if backup is None else backup.path, stop_owner=self)
        except errors.PreemptedError as e:
            print("tpuemu: %s; exiting with status %d to be restarted" % (e, EXIT_PREEMPTED),
                  file=sys.stderr, flush=True)
            sys.exit(EXIT_PREEMPTED)
        if backup is not None and backup.delete_checkpoint and os.path.exists(backup.path):
            os.remove(backup.path)
        hist.history, hist.epoch, hist.params, hist.model = h.history, h.epoch, params, self
        self.history = hist
        return hist

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 callbacks=None, return_dict=False, **kwargs):
        ds = self._dataset(x, y, batch_size, "evaluate")
        self._build(ds._d.x_dim)
        cbs = list(callbacks or [])
        for cb in cbs:
            cb.set_model(self)
        t0 = time.monotonic()
        loss, acc = self._m.evaluate(ds._d, callbacks=cbs)
        dt = time.monotonic() - t0
        logs = {"loss": loss}
        if not math.isnan(acc):
            logs["accuracy"] = acc
        if verbose not in (0, False):
            n = len(ds)
            _flush_py()
            print("%d/%d [==============================] - %ds %dms/step - %s" % (
                n, n, int(dt), int(dt * 1000 / max(n, 1)), " - ".join("%s: %.4f" % kv for kv in logs.items())),
                flush=True)
        if return_dict:
            return logs
        return loss if len(logs) == 1 else [loss, acc]

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None, **kwargs):
        ds = self._dataset(x, None, batch_size, "predict") if not isinstance(x, _data.Dataset) else x
        self._build(ds._d.x_dim)
        cbs = list(callbacks or [])
        for cb in cbs:
            cb.set_model(self)
        return self._m.predict(ds._d, callbacks=cbs)

    def get_weights(self):
        if self._m is None:
            return []
        return self._m.get_weights()

    def count_params(self):
        return self._m.num_params() if self._m is not None else 0

    def summary(self, print_fn=None):
        text = self._m.summary_text() if self._m is not None else \
            'Model: "%s"\nThis model has not yet been built.\n' % self.name
        (print_fn or print)(text.rstrip("\n"))

    def save_weights(self, filepath, **kwargs):
        self._m.save_checkpoint(filepath)

    def load_weights(self, filepath, **kwargs):
        self._restore_from(filepath)

    def save(self, *args, **kwargs):
        raise not_offered("model.save", "save the training state with save_weights (tpu_model_save_checkpoint)")()


Model = Sequential

# ---------------------------------------------------------------- datasets


def _idx(path):
    a = ffi.new("tpu_idx *")
    errors.check(lib.tpu_idx_read(_b(path), a))
    try:
        if a.dtype != 0x08:
            raise errors.DataLossError(None, None, "%s: not unsigned bytes" % path)
        shape = tuple(a.dims[i] for i in range(a.rank))
        return np.frombuffer(ffi.buffer(a.data, a.count), dtype=np.uint8).reshape(shape).copy()
    finally:
        lib.tpu_idx_free(a)


def _load(default_dir, env):
    def load_data(path=None):
        d = path or os.environ.get(env) or default_dir
        if not os.path.exists(os.path.join(d, "train-images-idx3-ubyte.gz")):
            raise errors.NotFoundError(None, None, "%s has no train-images-idx3-ubyte.gz (Debian: apt-get install "
                                       "dataset-fashion-mnist; or set $%s)" % (d, env))
        return ((_idx(os.path.join(d, "train-images-idx3-ubyte.gz")), _idx(os.path.join(d, "train-labels-idx1-ubyte.gz"))),
                (_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz")), _idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz"))))
    return load_data


datasets = Namespace("tf.keras.datasets", fashion_mnist=Namespace(
    "tf.keras.datasets.fashion_mnist",
    load_data=_load("/usr/share/datasets/fashion-mnist", "TPUEMU_FASHION_MNIST")))


def _set_random_seed(seed):
    from . import _set_seed
    _set_seed(seed)
    np.random.seed(int(seed) % (2 ** 32))


utils = Namespace("tf.keras.utils", set_random_seed=_set_random_seed)


class _Loss:
    """A Keras loss object: its name and from_logits, which the cores compute."""
    name = None

    def __init__(self, from_logits=False, reduction="auto", name=None):
        if reduction not in ("auto", "sum_over_batch_size"):
            raise not_offered("%s(reduction=%r)" % (type(self).__name__, reduction),
                              "the cores average the loss over the global batch")()
        self.from_logits = bool(from_logits)


class SparseCategoricalCrossentropy(_Loss):
    """tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)."""
    name = "sparse_categorical_crossentropy"


class CategoricalCrossentropy(_Loss):
    """tf.keras.losses.CategoricalCrossentropy(from_logits=False)."""
    name = "categorical_crossentropy"


class MeanSquaredError(_Loss):
    """tf.keras.losses.MeanSquaredError()."""
    name = "mean_squared_error"


losses = Namespace("tf.keras.losses", SparseCategoricalCrossentropy=SparseCategoricalCrossentropy,
                   CategoricalCrossentropy=CategoricalCrossentropy, MeanSquaredError=MeanSquaredError)

keras = Namespace("tf.keras", Sequential=Sequential, Model=Model, Input=Input, layers=layers,
                  optimizers=optimizers, callbacks=callbacks, mixed_precision=mixed_precision, datasets=datasets,
                  utils=utils, losses=losses)
