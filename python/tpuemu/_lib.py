"""The compiled binding (cffi, API mode) of libtpuclient."""
import logging

from ._tpuemu_cffi import ffi, lib  # noqa: F401

# The library never prints: its warnings (a batch the matrix unit pads, a
# system initialized again, elastic training's losses and recoveries) reach
# Python's logging as WARNING records of the "tpuemu" logger, as TensorFlow's
# reach its "tensorflow" logger. With no logging set up, Python prints them
# on stderr.
log = logging.getLogger("tpuemu")


def s(p):
    """A C string as str ("" for NULL)."""
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


def b(text):
    """A str (or None) for a const char * argument."""
    return ffi.NULL if text is None else str(text).encode("utf-8")


@ffi.def_extern()
def _py_warning(message, user):
    log.warning("%s", s(message))


lib.tpu_set_warning_handler(lib._py_warning, ffi.NULL)
