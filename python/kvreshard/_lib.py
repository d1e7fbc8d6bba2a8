"""The ctypes binding of libkvreshard (C API version 2, kvreshard.h).

The library is looked up, in order, at the path in the environment variable
KVRESHARD_LIB and next to this file (kvreshard/libkvreshard.so, where
``make python`` and ``pip install ./python`` put it). It is loaded on first
use, not at import, so that importing kvreshard never starts a Go runtime.

Versions: the library's major version must be ABI_VERSION. Its minor may
be lower than the package's ABI_MINOR (an older library of the same major):
it loads, and only the functions added after its minor raise, when called,
a KvreshardError naming both versions (see function()).

Every function is called through ctypes.CDLL, which releases the GIL for
the length of the call: reads and writes of other threads run meanwhile.
"""

import ctypes
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

ABI_VERSION = 2  # KVR_ABI_VERSION: the major version this package needs
ABI_MINOR = 1  # KVR_ABI_MINOR of the header this package was written against

# Return codes of the C API.
OK, EINVAL, ESTORE, EMANIFEST, ECLOSED, EFORK, EINTERNAL = range(7)

ERRLEN = 1024


class KvreshardError(Exception):
    """Base class of kvreshard's errors; ``code`` is the C API's code."""

    def __init__(self, message: str, code: int = EINTERNAL) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class InvalidArgument(KvreshardError, ValueError):
    """A bad argument: model, placement, pool, keys, slots, or a closed object."""


class StoreError(KvreshardError, OSError):
    """The store failed or cannot be reached."""

    def __init__(self, message: str, code: int = ESTORE) -> None:
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


def error(code: int, message: str) -> KvreshardError:
    """The exception for a C API code and its message."""
    cls = _ERRORS.get(code, KvreshardError)
    if not message:
        message = "kvreshard: error code %d" % code
    return cls(message, code)


# The structs of kvreshard.h. Each begins with its size (the struct's
# sizeof, which sized() sets): the library reads and writes the fields
# within it.


class CModel(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("layers", ctypes.c_int32),
        ("kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("v_head_dim", ctypes.c_int32),
        ("page", ctypes.c_int32),
        ("mla", ctypes.c_int32),
        ("draft_layers", ctypes.c_int32),
        ("dtype", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("revision", ctypes.c_char_p),
        ("namespace_", ctypes.c_char_p),
        ("fingerprint", ctypes.c_char_p),
    ]


class CPlacement(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("tp", ctypes.c_int32),
        ("pp", ctypes.c_int32),
        ("tp_rank", ctypes.c_int32),
        ("pp_rank", ctypes.c_int32),
        ("cp", ctypes.c_int32),
        ("cp_rank", ctypes.c_int32),
        ("cp_interleave", ctypes.c_int32),
        ("pp_layers", ctypes.POINTER(ctypes.c_int32)),
    ]


class CPool(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("nregions", ctypes.c_int32),
        ("layout", ctypes.c_char_p),
        ("bases", ctypes.POINTER(ctypes.c_void_p)),
        ("sizes", ctypes.POINTER(ctypes.c_uint64)),
        ("slots", ctypes.c_int64),
    ]


class CReadResult(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("stop", ctypes.c_int32),
        ("hit", ctypes.c_int64),
        ("bytes", ctypes.c_int64),
        ("ops", ctypes.c_int64),
    ]


class CReaderOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("copy_workers", ctypes.c_int32),
        ("max_pages", ctypes.c_int64),
        ("max_bytes", ctypes.c_int64),
        ("check_parts", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


READER_STATS = ("requests", "pages", "hits", "misses", "bytes", "ops",
                "manifests_rejected", "fallbacks", "parts_checked", "checksum_errors")
WRITER_STATS = ("requests", "pages", "written", "complete", "refused",
                "replica", "failed", "bytes")


class CReaderStats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32)] + [(f, ctypes.c_int64) for f in READER_STATS]


class CWriterStats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32)] + [(f, ctypes.c_int64) for f in WRITER_STATS]


def sized(cls: Any, *args: Any, **kw: Any) -> Any:
    """A struct of kvreshard.h with its size field set: cls(sizeof, *args)."""
    return cls(ctypes.sizeof(cls), *args, **kw)


_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64
_p = ctypes.c_void_p
_s = ctypes.c_char_p
_n = ctypes.c_size_t
_int = ctypes.c_int
# A handle (kvr_store *, kvr_writer *, kvr_reader *): an opaque id, an int
# in Python (None for NULL).
HANDLE = ctypes.c_void_p
_h = HANDLE
_ph = ctypes.POINTER(HANDLE)

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


# The functions of kvreshard.h: name -> (the minor version that added it,
# argument types, result type). kvr_version is looked up first, to learn
# the library's version; a function of a minor above the library's is not
# looked up (an older library lacks it): function() names both versions.
_FUNCTIONS: Dict[str, Tuple[int, List[Any], Any]] = {
    "kvr_version": (0, [ctypes.POINTER(ctypes.c_int32)], _int),
    "kvr_errstr": (0, [_int], _s),
    "kvr_set_max_procs": (0, [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), _p, _n], _int),
    "kvr_model_domain": (0, [ctypes.POINTER(CModel), _p, _n, _p, _n], _int),
    "kvr_store_open": (0, [_s, _ph, _p, _n], _int),
    "kvr_store_close": (0, [_h, _p, _n], _int),
    "kvr_store_open_engine": (0, [ctypes.POINTER(CEngine), _s, _ph, _p, _n], _int),
    "kvr_writer_open": (0, [_h, ctypes.POINTER(CModel), ctypes.POINTER(CPlacement),
                            ctypes.POINTER(CPool), _s, _ph, _p, _n], _int),
    "kvr_writer_publish": (0, [_h, _p, _n], _int),
    "kvr_writer_write": (0, [_h, _s, _p, _p, _i64, _p, _p, _n], _int),
    "kvr_writer_stats_get": (0, [_h, ctypes.POINTER(CWriterStats), _p, _n], _int),
    "kvr_writer_close": (0, [_h, _p, _n], _int),
    "kvr_reader_open": (0, [_h, ctypes.POINTER(CModel), ctypes.POINTER(CPlacement),
                            ctypes.POINTER(CPool), _ph, _p, _n], _int),
    "kvr_reader_exists": (0, [_h, _s, _p, _i64, ctypes.POINTER(_i64), _p, _n], _int),
    "kvr_reader_read": (0, [_h, _s, _p, _p, _i64, ctypes.POINTER(CReadResult), _p, _n], _int),
    "kvr_reader_set_options": (0, [_h, ctypes.POINTER(CReaderOptions), _p, _n], _int),
    "kvr_reader_stats_get": (0, [_h, ctypes.POINTER(CReaderStats), _p, _n], _int),
    "kvr_reader_close": (0, [_h, _p, _n], _int),
    "kvr_layouts": (1, [_p, _n, ctypes.POINTER(_n), _p, _n], _int),
    "kvr_define_layout": (1, [_s, _s, _s, _s, _p, _n], _int),
}

_lock = threading.Lock()
_loaded: Optional[ctypes.CDLL] = None
_path: Optional[str] = None
_minor = 0  # the loaded library's minor version


def library_path() -> str:
    """The path the library is (or would be) loaded from."""
    env = os.environ.get("KVRESHARD_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkvreshard.so")


def _bind(l: ctypes.CDLL, path: str, name: str) -> None:
    _, args, res = _FUNCTIONS[name]
    try:
        f = getattr(l, name)
    except AttributeError:
        raise KvreshardError("kvreshard: %s has no function %s; it is not libkvreshard of C API version %d"
                             % (path, name, ABI_VERSION)) from None
    f.argtypes = args
    f.restype = res


def lib() -> ctypes.CDLL:
    """The loaded library, loading it on first use: the functions of its
    minor version and below, typed."""
    global _loaded, _path, _minor
    l = _loaded
    if l is not None:
        return l
    with _lock:
        if _loaded is not None:
            return _loaded
        path = library_path()
        if not os.path.exists(path):
            raise KvreshardError(
                "kvreshard: no C library at %s: run `make python` in the repository, "
                "pip install the package, or set KVRESHARD_LIB to libkvreshard.so" % path)
        try:
            l = ctypes.CDLL(path)
        except OSError as e:
            raise KvreshardError("kvreshard: cannot load %s: %s" % (path, e)) from None
        _bind(l, path, "kvr_version")
        minor = ctypes.c_int32(0)
        major = l.kvr_version(ctypes.byref(minor))
        if major != ABI_VERSION:
            raise KvreshardError("kvreshard: %s has C API version %d; this package needs %d"
                                 % (path, major, ABI_VERSION))
        m = minor.value
        for name, (since, _, _) in _FUNCTIONS.items():
            if since <= m:
                _bind(l, path, name)
        _path, _minor = path, m
        _loaded = l
        return l


def version() -> Tuple[int, int]:
    """The loaded library's ABI version, (major, minor)."""
    lib()
    return ABI_VERSION, _minor


def function(name: str, caller: str) -> Any:
    """The library's function name (a kvr_* function), for caller (a
    public name of the package, for the message): a KvreshardError naming
    both versions when the library's minor is older than the function's."""
    l = lib()
    since = _FUNCTIONS[name][0]
    if since > _minor:
        raise KvreshardError("kvreshard: %s needs libkvreshard ABI %d.%d; the library is %d.%d (%s)"
                             % (caller, ABI_VERSION, since, ABI_VERSION, _minor, _path))
    return getattr(l, name)


_tls = threading.local()


def errbuf() -> ctypes.Array:
    """This thread's error buffer (one per thread: calls run concurrently)."""
    b = getattr(_tls, "buf", None)
    if b is None:
        b = _tls.buf = ctypes.create_string_buffer(ERRLEN)
    return b


def message(buf: ctypes.Array) -> str:
    """The message a call wrote into buf."""
    return buf.value.decode("utf-8", "replace")


def check(code: int, buf: ctypes.Array) -> None:
    """Raise the error of a failed call."""
    if code != OK:
        raise error(code, message(buf))
