"""tf.data over the library's input pipelines (tpuemu/data.h)."""
import numpy as np

from .. import errors
from .._train import Dataset as _CDataset
from ._ns import Namespace, Offered, not_offered

AUTOTUNE = -1


class Dataset(Offered):
    """tf.data.Dataset of rows (x) or (x, y), on the library's pipeline:
    from_tensor_slices, shuffle, batch, cache, prefetch. float32 features
    and int32 labels are used in place (not copied); others are converted once."""

    def __init__(self, c):
        self._d = c

    @staticmethod
    def from_tensor_slices(tensors, name=None):
        if isinstance(tensors, dict):
            raise not_offered("Dataset.from_tensor_slices(dict)", "the cores take (features, labels): pass a tuple")()
        if isinstance(tensors, tuple):
            if len(tensors) == 1:
                return Dataset(_CDataset(tensors[0]))
            if len(tensors) != 2:
                raise errors.InvalidArgumentValueError(
                    None, None, "from_tensor_slices: (features, labels) expected, got %d components" % len(tensors))
            return Dataset(_CDataset(tensors[0], tensors[1]))
        return Dataset(_CDataset(tensors))

    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=None, name=None):
        if reshuffle_each_iteration is False:
            raise not_offered("Dataset.shuffle(reshuffle_each_iteration=False)",
                              "the pipeline reshuffles every epoch (put cache() after the shuffle to freeze it)")()
        from . import _next_seed
        return Dataset(self._d.shuffle(buffer_size, _next_seed() if seed is None else seed))

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        return Dataset(self._d.batch(batch_size, drop_remainder))

    def cache(self, filename="", name=None):
        if filename:
            raise not_offered("Dataset.cache(filename)", "the cache is kept in memory (tpu_dataset_cache)")()
        return Dataset(self._d.cache())

    def prefetch(self, buffer_size, name=None):
        return Dataset(self._d.prefetch(buffer_size))

    def cardinality(self):
        return np.int64(self._d.num_batches())

    def __len__(self):
        return int(self._d.num_batches())

    def __iter__(self):
        return iter(self._d)

    def as_numpy_iterator(self):
        return iter(self._d)


for _name, _why in [("map", "the pipeline runs in C; transform the numpy arrays before from_tensor_slices "
                             "(or tpu_dataset_map in C)"),
                    ("repeat", "fit runs epochs over the dataset; pass epochs="),
                    ("take", "slice the numpy arrays before from_tensor_slices"),
                    ("skip", "slice the numpy arrays before from_tensor_slices"),
                    ("filter", "filter the numpy arrays before from_tensor_slices"),
                    ("unbatch", "batch once"), ("from_generator", "the pipeline takes arrays"),
                    ("zip", "pass (features, labels) to from_tensor_slices"),
                    ("range", "pass a numpy array to from_tensor_slices")]:
    setattr(Dataset, _name, not_offered("tf.data.Dataset." + _name, _why))

data = Namespace("tf.data", Dataset=Dataset, AUTOTUNE=AUTOTUNE,
                 experimental=Namespace("tf.data.experimental", AUTOTUNE=AUTOTUNE))
