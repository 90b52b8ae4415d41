"""gpumem.Error, the exception every failed call of libgpumem_client becomes, and the checks of Python arguments."""
import os

__all__ = ["Error"]


class Error(OSError):
    """A call of libgpumem_client failed.

    ``errno`` is the positive errno the C function returned negated (``errno.EDQUOT``, ``errno.EINVAL``, ...),
    ``strerror`` its text, ``reason`` the daemon's (or the library's) explanation of this failure, "" when
    there is none, and ``call`` the C function that failed.
    """

    def __init__(self, err, reason="", call=""):
        super().__init__(err, os.strerror(err))
        self.reason = reason
        self.call = call

    def __str__(self):
        text = f"[Errno {self.errno}] {self.strerror}"
        if self.filename is not None:
            text += f": {self.filename!r}"
        if self.reason:
            text += f": {self.reason}"
        if self.call:
            text += f" ({self.call})"
        return text

    def __reduce__(self):
        return (type(self), (self.errno, self.reason, self.call))


def reason_of(err, message):
    """The reason part of gm_strerror's "strerror: reason" for @err, "" when the message has none."""
    prefix = os.strerror(err)
    if message.startswith(prefix + ": "):
        return message[len(prefix) + 2:]
    if message == prefix:
        return ""
    # a C library whose strerror text differs from Python's: keep whatever follows the first ": "
    return message.split(": ", 1)[1] if ": " in message else ""


# ---- argument checks: Python's own errors, before anything reaches C ------------------------------------

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I32_MIN, I32_MAX = -2**31, 2**31 - 1


def check_int(value, what, lo, hi):
    """@value as an int in [lo, hi]: TypeError for anything else than an int (bool included), ValueError out
    of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < lo or value > hi:
        if value < 0 and lo == 0:
            raise ValueError(f"{what} must not be negative: {value}")
        raise ValueError(f"{what} out of range [{lo}, {hi}]: {value}")
    return value


def size_arg(value, what="size"):
    """A byte count (size_t): 0 is passed on, for the library to judge."""
    return check_int(value, what, 0, U64_MAX)


def u32_arg(value, what):
    """A uint32_t argument: a GPU id, a location, flags."""
    return check_int(value, what, 0, U32_MAX)


def u64_arg(value, what):
    """A uint64_t argument: a handle, a client id, a limit."""
    return check_int(value, what, 0, U64_MAX)


def int_arg(value, what):
    """An int argument (a NUMA node, an advice value)."""
    return check_int(value, what, I32_MIN, I32_MAX)


def str_arg(value, what, allow_none=False, path=False):
    """A C string argument as bytes (a str in UTF-8, or in the file system's encoding when it is a @path);
    None only when @allow_none."""
    if value is None and allow_none:
        return None
    if isinstance(value, os.PathLike) or (path and isinstance(value, str)):
        value = os.fsencode(value)
    elif isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if b"\0" in value:
        raise ValueError(f"{what} must not contain a NUL character")
    return value
