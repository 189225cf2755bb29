"""The compiled binding (cffi, API mode) of libtpuclient."""
from ._tpuemu_cffi import ffi, lib  # noqa: F401


def s(p):
    """A C string as str ("" for NULL)."""
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


def b(text):
    """A str (or None) for a const char * argument."""
    return ffi.NULL if text is None else str(text).encode("utf-8")
