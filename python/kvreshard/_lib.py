"""The ctypes binding of libkvreshard (C API version 1).

The library is looked up, in order, at the path in the environment variable
KVRESHARD_LIB and next to this file (kvreshard/libkvreshard.so, where
``make python`` and ``pip install ./python`` put it). It is loaded on first
use, not at import, so that importing kvreshard never starts a Go runtime.

Every function is called through ctypes.CDLL, which releases the GIL for
the length of the call: reads and writes of other threads run meanwhile.
"""

import ctypes
import os
import threading

ABI_VERSION = 1

# Return codes of the C API.
OK, EINVAL, ESTORE, EMANIFEST, ECLOSED, EFORK, EINTERNAL = range(7)

ERRLEN = 1024


class KvreshardError(Exception):
    """Base class of kvreshard's errors; ``code`` is the C API's code."""

    def __init__(self, message, code=EINTERNAL):
        super().__init__(message)
        self.code = code

    def __str__(self):
        return self.args[0] if self.args else ""


class InvalidArgument(KvreshardError, ValueError):
    """A bad argument: model, placement, pool, keys, slots, or a closed object."""


class StoreError(KvreshardError, OSError):
    """The store failed or cannot be reached."""

    def __init__(self, message, code=ESTORE):
        KvreshardError.__init__(self, message, code)


class ManifestError(KvreshardError):
    """A manifest was rejected (for example publish read back other bytes)."""


class ForkError(KvreshardError, RuntimeError):
    """Called in a forked child of the process that loaded the library.

    Go does not survive fork: load kvreshard in each process (SGLang starts
    its ranks with spawn), never use it in a child made by os.fork.
    """


_ERRORS = {
    EINVAL: InvalidArgument,
    ESTORE: StoreError,
    EMANIFEST: ManifestError,
    ECLOSED: InvalidArgument,
    EFORK: ForkError,
}


def error(code, message):
    """The exception for a C API code and its message."""
    cls = _ERRORS.get(code, KvreshardError)
    if not message:
        message = "kvreshard: error code %d" % code
    return cls(message, code)


class CModel(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_int32),
        ("kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("v_head_dim", ctypes.c_int32),
        ("page", ctypes.c_int32),
        ("mla", ctypes.c_int32),
        ("dtype", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("revision", ctypes.c_char_p),
        ("namespace_", ctypes.c_char_p),
        ("fingerprint", ctypes.c_char_p),
        ("draft_layers", ctypes.c_int32),
    ]


class CPlacement(ctypes.Structure):
    _fields_ = [
        ("tp", ctypes.c_int32),
        ("pp", ctypes.c_int32),
        ("tp_rank", ctypes.c_int32),
        ("pp_rank", ctypes.c_int32),
        ("pp_layers", ctypes.POINTER(ctypes.c_int32)),
        ("cp", ctypes.c_int32),
        ("cp_rank", ctypes.c_int32),
        ("cp_interleave", ctypes.c_int32),
    ]


class CPool(ctypes.Structure):
    _fields_ = [
        ("layout", ctypes.c_char_p),
        ("nregions", ctypes.c_int32),
        ("bases", ctypes.POINTER(ctypes.c_void_p)),
        ("sizes", ctypes.POINTER(ctypes.c_uint64)),
        ("slots", ctypes.c_int64),
    ]


class CReadResult(ctypes.Structure):
    _fields_ = [
        ("hit", ctypes.c_int64),
        ("bytes", ctypes.c_int64),
        ("ops", ctypes.c_int64),
        ("stop", ctypes.c_int32),
    ]


class CReaderOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("copy_workers", ctypes.c_int32),
        ("max_pages", ctypes.c_int64),
        ("max_bytes", ctypes.c_int64),
        ("check_parts", ctypes.c_int32),
    ]


READER_STATS = ("requests", "pages", "hits", "misses", "bytes", "ops",
                "manifests_rejected", "fallbacks", "parts_checked", "checksum_errors")
WRITER_STATS = ("requests", "pages", "written", "complete", "refused",
                "replica", "failed", "bytes")


class CReaderStats(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int64) for f in READER_STATS]


class CWriterStats(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int64) for f in WRITER_STATS]


_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64
_p = ctypes.c_void_p
_s = ctypes.c_char_p
_n = ctypes.c_size_t
_int = ctypes.c_int

# An object engine (kvr_engine): the callbacks' types, every pointer a
# c_void_p (an int, or None for NULL, in Python). See kvreshard.h.
ENGINE_MISSING = -1  # KVR_ENGINE_MISSING
ENGINE_PUT = ctypes.CFUNCTYPE(_int, _p, _i64, _p, _p, _p, _p, _p, _p, _p, _n)
ENGINE_GET = ctypes.CFUNCTYPE(_int, _p, _i64, _p, _p, _p, _p, _p, _p, _n)
ENGINE_EXISTS = ctypes.CFUNCTYPE(_int, _p, _i64, _p, _p, _p, _p, _n)
ENGINE_SIZES = ctypes.CFUNCTYPE(_int, _p, _i64, _p, _p, _p, _p, _n)
ENGINE_READ = ctypes.CFUNCTYPE(_int, _p, _i64, _p, _p, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _n)
ENGINE_REMOVE = ctypes.CFUNCTYPE(_int, _p, _i64, _p, _p, _p, _n)
ENGINE_MEMORY = ctypes.CFUNCTYPE(_int, _p, _p, _u64, _p, _n)
ENGINE_CLOSE = ctypes.CFUNCTYPE(None, _p)


class CEngine(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("ctx", _p),
        ("put", ENGINE_PUT),
        ("get", ENGINE_GET),
        ("exists", ENGINE_EXISTS),
        ("sizes", ENGINE_SIZES),
        ("read", ENGINE_READ),
        ("remove", ENGINE_REMOVE),
        ("register_memory", ENGINE_MEMORY),
        ("unregister_memory", ENGINE_MEMORY),
        ("close", ENGINE_CLOSE),
        ("read_timeout_ms", _i64),
        ("lease_ms", _i64),
    ]

_SIGNATURES = {
    "kvr_version": ([], _int),
    "kvr_set_max_procs": ([ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)], _int),
    "kvr_model_domain": ([ctypes.POINTER(CModel), _p, _n, _p, _n], _int),
    "kvr_store_open": ([_s, ctypes.POINTER(_u64), _p, _n], _int),
    "kvr_store_close": ([_u64, _p, _n], _int),
    "kvr_store_open_engine": ([ctypes.POINTER(CEngine), _s, ctypes.POINTER(_u64), _p, _n], _int),
    "kvr_writer_open": ([_u64, ctypes.POINTER(CModel), ctypes.POINTER(CPlacement),
                         ctypes.POINTER(CPool), _s, ctypes.POINTER(_u64), _p, _n], _int),
    "kvr_writer_publish": ([_u64, _p, _n], _int),
    "kvr_writer_write": ([_u64, _s, _p, _p, _i64, _p, _p, _n], _int),
    "kvr_writer_close": ([_u64, _p, _n], _int),
    "kvr_reader_open": ([_u64, ctypes.POINTER(CModel), ctypes.POINTER(CPlacement),
                         ctypes.POINTER(CPool), ctypes.POINTER(_u64), _p, _n], _int),
    "kvr_reader_exists": ([_u64, _s, _p, _i64, ctypes.POINTER(_i64), _p, _n], _int),
    "kvr_reader_read": ([_u64, _s, _p, _p, _i64, ctypes.POINTER(CReadResult), _p, _n], _int),
    "kvr_reader_set_options": ([_u64, ctypes.POINTER(CReaderOptions), _p, _n], _int),
    "kvr_reader_stats_get": ([_u64, ctypes.POINTER(CReaderStats)], _int),
    "kvr_writer_stats_get": ([_u64, ctypes.POINTER(CWriterStats)], _int),
    "kvr_reader_close": ([_u64, _p, _n], _int),
}

_lock = threading.Lock()
_lib = None
_path = None


def library_path():
    """The path the library is (or would be) loaded from."""
    env = os.environ.get("KVRESHARD_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkvreshard.so")


def lib():
    """The loaded library, loading it on first use."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not os.path.exists(path):
            raise KvreshardError(
                "kvreshard: no C library at %s: run `make python` in the repository, "
                "pip install the package, or set KVRESHARD_LIB to libkvreshard.so" % path)
        try:
            l = ctypes.CDLL(path)
        except OSError as e:
            raise KvreshardError("kvreshard: cannot load %s: %s" % (path, e)) from None
        for name, (args, res) in _SIGNATURES.items():
            try:
                f = getattr(l, name)
            except AttributeError:
                raise KvreshardError("kvreshard: %s has no function %s; it is not libkvreshard "
                                     "of C API version %d" % (path, name, ABI_VERSION)) from None
            f.argtypes = args
            f.restype = res
        v = l.kvr_version()
        if v != ABI_VERSION:
            raise KvreshardError("kvreshard: %s has C API version %d; this package needs %d"
                                 % (path, v, ABI_VERSION))
        _path = path
        _lib = l
        return l


_tls = threading.local()


def errbuf():
    """This thread's error buffer (one per thread: calls run concurrently)."""
    b = getattr(_tls, "buf", None)
    if b is None:
        b = _tls.buf = ctypes.create_string_buffer(ERRLEN)
    return b


def check(code, buf):
    """Raise the error of a failed call."""
    if code != OK:
        raise error(code, buf.value.decode("utf-8", "replace"))
