"""The library's statuses as exceptions, with TensorFlow's classes and names.

Every failed call raises the class of its tpu_status (NotFoundError for
TPU_NOT_FOUND, ...) with the library's message. The classes are
tf.errors' (tpuemu.tf.errors is this module): OpError with .message,
.error_code (the canonical code, as tf.errors.NOT_FOUND), .node_def and .op
(None here). Where TensorFlow raises a plain Python exception for the same
situation, the class raised is both (NotFoundValueError is a NotFoundError
and a ValueError).
"""
from ._lib import ffi, lib

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16
PREEMPTED = 17  # not a TensorFlow code: fit stopped for a preemption notice


class OpError(Exception):
    """tf.errors.OpError: a call of the library failed."""

    def __init__(self, node_def, op, message, error_code=UNKNOWN, *args):
        super().__init__(message, *args)
        self._node_def = node_def
        self._op = op
        self._message = message
        self._error_code = error_code

    @property
    def message(self):
        return self._message

    @property
    def error_code(self):
        return self._error_code

    @property
    def node_def(self):
        return self._node_def

    @property
    def op(self):
        return self._op

    def __str__(self):
        return self._message

    def __reduce__(self):
        return (type(self), (self._node_def, self._op, self._message) + (
            (self._error_code,) if type(self) is OpError else ()))


def _cls(name, code, doc):
    def __init__(self, node_def, op, message, *args):
        OpError.__init__(self, node_def, op, message, code, *args)
    return type(name, (OpError,), {"__init__": __init__, "__doc__": doc})


CancelledError = _cls("CancelledError", CANCELLED, "The call was cancelled.")
UnknownError = _cls("UnknownError", UNKNOWN, "An unknown error.")
InvalidArgumentError = _cls("InvalidArgumentError", INVALID_ARGUMENT, "A bad argument.")
DeadlineExceededError = _cls("DeadlineExceededError", DEADLINE_EXCEEDED, "A deadline passed.")
NotFoundError = _cls("NotFoundError", NOT_FOUND, "Something named was not found.")
AlreadyExistsError = _cls("AlreadyExistsError", ALREADY_EXISTS, "It exists already.")
PermissionDeniedError = _cls("PermissionDeniedError", PERMISSION_DENIED, "Not allowed.")
ResourceExhaustedError = _cls("ResourceExhaustedError", RESOURCE_EXHAUSTED,
                              "Out of a resource: a core's HBM (XLA's OOM report), memory.")
FailedPreconditionError = _cls("FailedPreconditionError", FAILED_PRECONDITION,
                               "The system is not in the state the call needs.")
AbortedError = _cls("AbortedError", ABORTED, "The call was aborted.")
OutOfRangeError = _cls("OutOfRangeError", OUT_OF_RANGE, "Past the end.")
UnimplementedError = _cls("UnimplementedError", UNIMPLEMENTED, "Not implemented.")
InternalError = _cls("InternalError", INTERNAL, "An internal error.")
UnavailableError = _cls("UnavailableError", UNAVAILABLE, "A core or the resolver is unavailable.")
DataLossError = _cls("DataLossError", DATA_LOSS, "Damaged data (a checkpoint).")
UnauthenticatedError = _cls("UnauthenticatedError", UNAUTHENTICATED, "A wrong or missing cluster token.")
PreemptedError = _cls("PreemptedError", PREEMPTED,
                      "fit stopped for a preemption notice after saving its checkpoint.")


class NotFoundValueError(NotFoundError, ValueError):
    """NotFoundError that is also the ValueError TensorFlow raises (an unknown TPU name)."""


class InvalidArgumentValueError(InvalidArgumentError, ValueError):
    """InvalidArgumentError that is also the ValueError TensorFlow raises for a bad argument."""


class FailedPreconditionRuntimeError(FailedPreconditionError, RuntimeError):
    """FailedPreconditionError that is also the RuntimeError TensorFlow raises."""


_BY_CODE = {code: c for code, c in [
    (CANCELLED, CancelledError), (UNKNOWN, UnknownError), (INVALID_ARGUMENT, InvalidArgumentError),
    (DEADLINE_EXCEEDED, DeadlineExceededError), (NOT_FOUND, NotFoundError),
    (ALREADY_EXISTS, AlreadyExistsError), (PERMISSION_DENIED, PermissionDeniedError),
    (RESOURCE_EXHAUSTED, ResourceExhaustedError), (FAILED_PRECONDITION, FailedPreconditionError),
    (ABORTED, AbortedError), (OUT_OF_RANGE, OutOfRangeError), (UNIMPLEMENTED, UnimplementedError),
    (INTERNAL, InternalError), (UNAVAILABLE, UnavailableError), (DATA_LOSS, DataLossError),
    (UNAUTHENTICATED, UnauthenticatedError), (PREEMPTED, PreemptedError)]}


def exception_type_from_error_code(code):
    """tf.errors.exception_type_from_error_code."""
    return _BY_CODE.get(int(code), UnknownError)


def error_code_from_exception_type(cls):
    """tf.errors.error_code_from_exception_type."""
    for code, c in _BY_CODE.items():
        if issubclass(cls, c):
            return code
    return UNKNOWN


def make(status, message, cls=None):
    """The exception for status and message (cls: a subclass to use instead)."""
    return (cls or exception_type_from_error_code(status))(None, None, message)


def last(status=None, cls=None):
    """The exception of this thread's last failed call."""
    if status is None:
        status = lib.tpu_last_status()
    return make(status, ffi.string(lib.tpu_last_error()).decode("utf-8", "replace"), cls)


def check(status, cls=None):
    """Raises the exception of a failed status (the message of this thread's last error)."""
    if status != 0:
        raise last(status, cls)
