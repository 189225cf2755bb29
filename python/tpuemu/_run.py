"""Blocking calls that Ctrl-C can interrupt.

A call of the library that may block for long (initialize, fit, evaluate,
predict, a collective, a profile capture) runs on a helper thread while the
main thread waits for it, so that SIGINT raises KeyboardInterrupt in the main
thread at once; the call is then cancelled (tpu_cancel where the library has
it, and the Python hooks of fit stop at the next batch) and waited for, so
the handles stay usable, and KeyboardInterrupt is raised. The GIL is
released during the C call (cffi does it), so other Python threads run.
"""
import threading

from . import errors
from ._lib import ffi, lib

HAVE_CANCEL = hasattr(lib, "tpu_cancel")


class Cancel:
    """What a running call checks (Python hooks) and what cancels it (C handles)."""

    def __init__(self, *handles):
        self.requested = False
        self.handles = [h for h in handles if h is not None]

    def __call__(self):
        self.requested = True
        if HAVE_CANCEL:
            for h in self.handles:
                lib.tpu_cancel(h)


def call(fn, *args, cancel=None):
    """fn(*args) (a C function returning a tpu_status); raises its error, or
    KeyboardInterrupt when interrupted."""
    if threading.current_thread() is not threading.main_thread():
        st = fn(*args)
        errors.check(st)
        return
    out = {}
    done = threading.Event()

    def run():
        try:
            st = fn(*args)
            out["status"] = st
            if st:
                out["error"] = errors.last(st)
        except BaseException as e:  # pragma: no cover - cffi argument errors
            out["exc"] = e
        finally:
            done.set()

    t = threading.Thread(target=run, name="tpuemu-call", daemon=True)
    t.start()
    interrupted = None
    # not t.join(timeout): a join interrupted by a signal may mark the thread
    # stopped while it still runs
    while not done.is_set():
        try:
            done.wait(0.05)
        except KeyboardInterrupt as e:
            if interrupted is None:
                interrupted = e
                if cancel is not None:
                    cancel()
    if interrupted is not None:
        raise interrupted
    if "exc" in out:
        raise out["exc"]
    if out.get("status"):
        raise out["error"]
