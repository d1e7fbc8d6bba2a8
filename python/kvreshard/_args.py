"""Argument packing: the Python values of the public API checked and turned
into what the C API takes (int32 fields, NUL-free UTF-8 strings, optional
ints, pool regions, keys as one buffer and offsets, slots as an int64
array), with the messages the library would give.

A private module: the package's modules share these helpers, so their
names have no leading underscore; users call the public API instead.
"""

import array
import ctypes
from itertools import accumulate
from typing import Any, Iterable, Optional, Tuple

from . import _lib
from ._lib import InvalidArgument

I32 = (1 << 31) - 1

# A pool region: a writable C-contiguous buffer (numpy array, bytearray,
# mmap), or an (address, nbytes) pair.
Region = Any


def int32(what: str, v: Any, lo: int = 0) -> int:
    """v, an int from lo to 2**31-1 (an int32 field of the C API): TypeError
    or InvalidArgument naming what otherwise."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError("kvreshard: %s must be an int, not %s" % (what, type(v).__name__))
    v = v.__index__()
    if v < lo or v > I32:
        raise InvalidArgument("kvreshard: %s=%d is out of range" % (what, v), _lib.EINVAL)
    return v


def cstr(what: str, v: Any) -> bytes:
    """v, a str, as the UTF-8 bytes of a C string: TypeError or
    InvalidArgument (a NUL byte) naming what otherwise."""
    if not isinstance(v, str):
        raise TypeError("kvreshard: %s must be a str, not %s" % (what, type(v).__name__))
    b = v.encode("utf-8")
    if b"\0" in b:
        raise InvalidArgument("kvreshard: %s contains a NUL byte" % what, _lib.EINVAL)
    return b


def opt_int(what: str, v: Optional[int], bits: int) -> int:
    """An optional int argument of the C API: None is 0; the library
    checks the range it accepts and names the argument."""
    if v is None:
        return 0
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError("kvreshard: %s must be an int or None, not %s" % (what, type(v).__name__))
    v = v.__index__()
    if not -(1 << bits - 1) <= v < 1 << bits - 1:
        raise InvalidArgument("kvreshard: %s=%d is out of range" % (what, v), _lib.EINVAL)
    return v


def region(i: int, r: Region) -> Tuple[int, int, Any]:
    """(address, nbytes, keepalive) of pool region i."""
    if isinstance(r, tuple):
        if len(r) != 2:
            raise InvalidArgument("kvreshard: pool region %d: a tuple must be (address, nbytes)" % i,
                                  _lib.EINVAL)
        addr, n = r
        for what, v in (("address", addr), ("nbytes", n)):
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise TypeError("kvreshard: pool region %d: %s must be an int, not %s"
                                % (i, what, type(v).__name__))
        addr, n = addr.__index__(), n.__index__()
        if addr <= 0 or addr >= 1 << 64:
            raise InvalidArgument("kvreshard: pool region %d: address %#x is not a valid address"
                                  % (i, addr), _lib.EINVAL)
        if n <= 0 or n >= 1 << 63:
            raise InvalidArgument("kvreshard: pool region %d: nbytes=%d is not positive" % (i, n),
                                  _lib.EINVAL)
        return addr, n, None
    try:
        mv = memoryview(r)
    except TypeError:
        raise TypeError("kvreshard: pool region %d: %s is neither a buffer (numpy array, bytearray, "
                        "mmap) nor an (address, nbytes) pair" % (i, type(r).__name__)) from None
    with mv:
        if mv.readonly:
            raise InvalidArgument("kvreshard: pool region %d: the buffer is read-only" % i, _lib.EINVAL)
        if not mv.c_contiguous:
            raise InvalidArgument("kvreshard: pool region %d: the buffer is not C-contiguous" % i,
                                  _lib.EINVAL)
        n = mv.nbytes
    if n == 0:
        raise InvalidArgument("kvreshard: pool region %d: the buffer is empty" % i, _lib.EINVAL)
    # from_buffer exports the buffer for as long as the ctypes object lives:
    # a bytearray cannot be resized, an mmap not closed, while the pool holds it.
    keep = (ctypes.c_char * n).from_buffer(r)
    return ctypes.addressof(keep), n, keep


_EMPTY_OFFSETS = array.array("q", [0])


def pack_keys(keys: Iterable[str]) -> Tuple[bytes, "array.array[int]", int]:
    """keys, any iterable of str (read once), as one buffer and n+1
    offsets. A key with a NUL byte is refused here, in the library's words
    (the library refuses it too, and '_' and empty keys)."""
    if isinstance(keys, (str, bytes)):
        raise TypeError("kvreshard: keys must be a sequence of str, not one %s" % type(keys).__name__)
    if not isinstance(keys, (list, tuple)):
        keys = list(keys)
    if not keys:
        return b"", _EMPTY_OFFSETS, 0
    try:
        s = "".join(keys)
    except TypeError:
        bad = next(k for k in keys if not isinstance(k, str))
        raise TypeError("kvreshard: keys must be str, not %s" % type(bad).__name__) from None
    if "\0" in s:
        i = next(i for i, k in enumerate(keys) if "\0" in k)
        raise InvalidArgument("kvreshard: key %d contains a NUL byte" % i, _lib.EINVAL)
    b = s.encode("utf-8")
    if len(b) == len(s):  # ASCII (page hashes are hex): str lengths are byte lengths
        return b, array.array("q", accumulate(map(len, keys), initial=0)), len(keys)
    enc = [k.encode("utf-8") for k in keys]
    return b, array.array("q", accumulate(map(len, enc), initial=0)), len(keys)


def pack_slots(slots: Iterable[int], n: int) -> Tuple[Optional[int], Any]:
    """slots as an address of n int64 values, and what keeps them alive.
    slots is any iterable of ints, read once; a numpy array of integers is
    converted at once, without a loop in Python."""
    if n == 0 and isinstance(slots, (list, tuple)) and not slots:
        return None, None
    np = numpy()
    if np is not None and isinstance(slots, np.ndarray) and slots.dtype.kind != "O":
        if slots.dtype.kind not in "iu":
            raise TypeError("kvreshard: slots must be integers, not %s" % slots.dtype)
        # before ascontiguousarray, which makes a 0-d array 1-d
        if slots.ndim != 1:
            raise InvalidArgument("kvreshard: slots must be one-dimensional", _lib.EINVAL)
        if slots.dtype.kind == "u" and slots.size and slots.max() > (1 << 63) - 1:
            raise InvalidArgument("kvreshard: slot %d is out of range" % int(slots.max()), _lib.EINVAL)
        a = np.ascontiguousarray(slots, dtype=np.int64)
        if len(a) != n:
            raise InvalidArgument("kvreshard: %d keys but %d slots" % (n, len(a)), _lib.EINVAL)
        return a.ctypes.data if n else None, a
    if isinstance(slots, (bytes, bytearray)):
        # array.array would read their bytes as raw int64 values, not as
        # the ints they hold
        slots = iter(slots)
    if not isinstance(slots, (list, tuple)):
        slots = list(slots) if hasattr(slots, "__iter__") else slots
    if isinstance(slots, (list, tuple)) and any(type(x) is bool for x in slots):
        raise TypeError("kvreshard: slots must be ints, not bool")
    try:
        a = array.array("q", slots)
    except TypeError:
        raise TypeError("kvreshard: slots must be a sequence of int") from None
    except OverflowError:
        raise InvalidArgument("kvreshard: a slot is out of range", _lib.EINVAL) from None
    if len(a) != n:
        raise InvalidArgument("kvreshard: %d keys but %d slots" % (n, len(a)), _lib.EINVAL)
    return (a.buffer_info()[0] if n else None), a


_np: Any = False


def numpy() -> Any:
    """The numpy module, or None when it cannot be imported (numpy is
    optional): imported once, on first use."""
    global _np
    if _np is False:
        try:
            import numpy as np
            _np = np
        except ImportError:
            _np = None
    return _np

