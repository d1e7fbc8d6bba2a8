"""kvreshard: share KV-cache pages between serving processes of different
TP, PP, CP (context parallelism) and memory layouts, from Python.

A thin ctypes layer over libkvreshard (the Go runtime built as a C library).
Standard library only; numpy is optional (numpy arrays are pools like any
other buffer). Quick start::

    import numpy as np, kvreshard as kv

    model = kv.Model(layers=6, kv_heads=4, head_dim=8, dtype="bf16", page=4)
    # TP 2 x PP 2, this process is rank (tp_rank=1, pp_rank=0): layers 0-2, heads 2-3
    place = kv.Placement(tp=2, pp=2, rank=(1, 0))
    k = np.zeros((2, 8 * 4, 3, 2, 8), np.uint16)          # SGLang page_first K|V, 8 slots
    pool = kv.Pool("page_first", [k[0], k[1]], slots=8)
    with kv.Store("file:///tmp/kv") as st:
        with kv.Reader(st, model, place, pool) as r:
            res = r.read(["a1", "b2"], [0, 1])             # res.hit pages are in slots 0, 1

Objects and their C counterparts:

- Store(url): an open store (file:///dir, redis://host:port, mem://name).
- Model(...): the --model fields of the command line, ``-`` written ``_``;
  name, revision, namespace, fingerprint and dtype enter the model domain,
  so other models, dtypes or tenants never share pages.
- Placement(tp, pp, rank=(tp_rank, pp_rank[, cp_rank]), pp_layers=None,
  cp=1, cp_interleave=1): pp_layers is the PP split (layers per stage);
  None is kvreshard's even split (the first stages get the remainder),
  which is NOT every framework's: pass the framework's own split. cp and
  cp_interleave: context parallelism (a page's tokens dealt to cp ranks in
  runs of cp_interleave); a CP rank's pool holds page // cp tokens a page.
- Pool(layout, regions, slots): the rank's host memory; regions are the
  layout's regions in order (K then V; one for MLA), each a writable
  C-contiguous buffer (numpy array, bytearray, mmap) or an (address, nbytes)
  pair (a torch tensor's data_ptr()). The pool, and every Writer or Reader
  using it, keeps the buffers alive; the caller keeps (address, nbytes)
  memory alive.
- Writer(...).write(keys, slots) -> [WriteStatus]; Reader(...).exists(keys)
  -> int and .read(keys, slots) -> ReadResult. A miss, the budget, a
  rejected manifest, a page that failed its checksums, and a store that
  failed during the read are results (ReadResult.stop), never exceptions:
  the pages before the stop (ReadResult.hit) were read in full and may be
  used, whatever stopped the read.
- layouts() -> [Layout]: the layouts the library knows (the built-ins, and
  those defined at run time); define_layout(name, kind, order) defines one
  from its order, as "C L H D/8 T D%8", for pools and writers to name.

Model, Placement and Pool are immutable: an attribute set or deleted after
construction raises AttributeError (the library has read them already).

Errors: InvalidArgument (also a ValueError), StoreError (also an OSError),
ManifestError, ForkError (also a RuntimeError; a call in a forked child of
the process that loaded the library), all KvreshardError. Every call
releases the GIL.
"""

import array
import ctypes
import enum
import os
from collections import namedtuple
from itertools import accumulate
from typing import Any, Iterable, List, NoReturn, Optional, Sequence, Tuple, Type, TypeVar

from . import _lib
from ._lib import (ForkError, InvalidArgument, KvreshardError, ManifestError,
                   StoreError)

__all__ = [
    "Store", "Model", "Placement", "Pool", "Writer", "Reader", "ReadResult",
    "WriteStatus", "Stop", "ReaderStats", "WriterStats", "Layout",
    "KvreshardError", "InvalidArgument", "StoreError", "ManifestError", "ForkError",
    "set_max_procs", "library_path", "layouts", "define_layout", "DTYPES",
]

DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

_I32 = (1 << 31) - 1

# A pool region: a writable C-contiguous buffer (numpy array, bytearray,
# mmap), or an (address, nbytes) pair.
Region = Any


class WriteStatus(enum.IntEnum):
    """What a write did with one page."""
    WRITTEN = 0   # this rank's part was written
    COMPLETE = 1  # the page was already complete (in any layout): kept
    REFUSED = 2   # an incomplete page of another layout holds the key
    REPLICA = 3   # this rank holds a replica of heads another rank writes
    FAILED = 4    # the write failed (see the writer's log and stats)


class Stop(enum.IntEnum):
    """Why a read stopped before the last page."""
    NONE = 0      # every page was read
    MISS = 1      # a page is missing or incomplete
    BUDGET = 2    # the prefetch budget was reached
    CANCELED = 3
    MANIFEST = 4  # a manifest was rejected (missing, corrupt, other model)
    FAILED = 5    # the store failed (connection, I/O, timeout)
    CHECKSUM = 6  # a page's bytes failed their checksums (check_parts)


_STATUS = tuple(WriteStatus)
_STOP = tuple(Stop)


class ReadResult(namedtuple("ReadResult", "hit bytes ops stop message")):
    """What one read did: ``hit`` leading pages were read in full (only
    they may be used), ``bytes`` and ``ops`` moved, ``stop`` says why it
    stopped early (Stop.NONE when every page was read) and ``message``
    says more (empty when every page was read)."""
    __slots__ = ()
    hit: int
    bytes: int
    ops: int
    stop: Stop
    message: str


ReaderStats = namedtuple("ReaderStats", _lib.READER_STATS)
ReaderStats.__doc__ = "A reader's counters since it was opened."
WriterStats = namedtuple("WriterStats", _lib.WRITER_STATS)
WriterStats.__doc__ = "A writer's counters since it was opened."


def library_path() -> str:
    """The path libkvreshard.so is loaded from (KVRESHARD_LIB, or next to the package)."""
    return _lib.library_path()


def set_max_procs(n: int) -> int:
    """Cap the Go runtime's threads running Go code (GOMAXPROCS) at n and
    return the previous cap; n <= 0 only returns it. One runtime runs per
    process: cap it so that eight ranks on one host do not each start a
    thread per core.

    n is at most 1024 (the C API's KVR_MAX_PROCS), or the CPUs this
    process may run on when there are more: a larger n is InvalidArgument
    (a ValueError) and changes nothing. A cap past the CPUs runs nothing
    more at once, and each unit of it costs the Go runtime memory (about
    15 KB: a cap of 100000 took 1.4 GiB)."""
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise TypeError("kvreshard: set_max_procs: n must be an int, not %s" % type(n).__name__)
    n = n.__index__()
    bound = _max_procs()
    if n > bound:
        raise InvalidArgument("kvreshard: set_max_procs: n=%d is more than %d, the bound of GOMAXPROCS "
                              "(1024, or the CPUs when more)" % (n, bound), _lib.EINVAL)
    n = _int32("set_max_procs: n", n, lo=-_I32)
    prev = ctypes.c_int32()
    err = _lib.errbuf()
    _lib.check(_lib.lib().kvr_set_max_procs(n, ctypes.byref(prev), err, _lib.ERRLEN), err)
    return prev.value


_MAX_PROCS = 1024  # KVR_MAX_PROCS


def _max_procs() -> int:
    """The library's bound of set_max_procs: _MAX_PROCS, or the CPUs this
    process may run on (as Go's runtime.NumCPU counts them) when more."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(_MAX_PROCS, cpus)


def _int32(what: str, v: Any, lo: int = 0) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError("kvreshard: %s must be an int, not %s" % (what, type(v).__name__))
    v = v.__index__()
    if v < lo or v > _I32:
        raise InvalidArgument("kvreshard: %s=%d is out of range" % (what, v), _lib.EINVAL)
    return v


def _str(what: str, v: Any) -> bytes:
    if not isinstance(v, str):
        raise TypeError("kvreshard: %s must be a str, not %s" % (what, type(v).__name__))
    b = v.encode("utf-8")
    if b"\0" in b:
        raise InvalidArgument("kvreshard: %s contains a NUL byte" % what, _lib.EINVAL)
    return b


class _Frozen:
    """An object whose attributes are set in __init__ only (by _init):
    setting or deleting one afterwards raises AttributeError naming the
    class, since the library has read them already."""

    __slots__ = ()

    def _init(self, **attrs: Any) -> None:
        for name, value in attrs.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError("kvreshard.%s is immutable: cannot set %s; make another %s"
                             % (type(self).__name__, name, type(self).__name__))

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("kvreshard.%s is immutable: cannot delete %s" % (type(self).__name__, name))


class Layout(_Frozen, str):
    """A layout the library knows: a str, its name, with the read-only
    attributes name, kind ("part": how a writer rank's share of a page lies
    in the store; "pool": how a host pool holds its pages), order (its
    axes, outermost first, as "C L H D/8 T D%8"; see kvreshard.h) and writes
    (the part layout a pool's writers store pages in when they name none;
    None for a part layout and for a pool that names none). So both
    ``"PLHD" in kv.layouts()`` and ``[l.kind for l in kv.layouts()]``
    work."""

    # attributes of the str's __dict__, set once by __new__
    _kind: str
    _order: str
    _writes: Optional[str]

    def __new__(cls, name: str, kind: str, order: str, writes: Optional[str] = None) -> "Layout":
        self = str.__new__(cls, name)
        self._init(_kind=kind, _order=order, _writes=writes or None)
        return self

    def __getnewargs__(self) -> Tuple[str, str, str, Optional[str]]:
        return str(self), self._kind, self._order, self._writes

    @property
    def name(self) -> str:
        return str(self)

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def order(self) -> str:
        return self._order

    @property
    def writes(self) -> Optional[str]:
        return self._writes

    def __repr__(self) -> str:
        s = "Layout(%r, kind=%r, order=%r" % (str(self), self._kind, self._order)
        if self._writes is not None:
            s += ", writes=%r" % self._writes
        return s + ")"


def layouts() -> List[Layout]:
    """The layouts the library knows, in the order they were registered:
    the seven built-ins first (the part layouts PLHD, LPHD, HPLD and
    SGLang's pool layouts page_first, page_first_direct, layer_first,
    page_head), then those defined with define_layout (needs libkvreshard
    ABI 2.1: kvr_layouts)."""
    f = _lib.function("kvr_layouts", "layouts()")
    err = _lib.errbuf()
    need = ctypes.c_size_t(0)
    while True:
        _lib.check(f(None, 0, ctypes.byref(need), err, _lib.ERRLEN), err)
        buf = ctypes.create_string_buffer(need.value)
        code = f(buf, len(buf), ctypes.byref(need), err, _lib.ERRLEN)
        if code == _lib.EINVAL and need.value > len(buf):
            continue  # defined meanwhile: ask again
        _lib.check(code, err)
        break
    out = []
    for line in buf.value.decode("utf-8").splitlines():
        kind, name, order, writes = line.split("\t")[:4]  # a later library may add fields
        out.append(Layout(name, kind, order, writes))
    return out


def define_layout(name: str, kind: str, order: str, writes: Optional[str] = None) -> Layout:
    """Define layout name of kind "part" or "pool" from its order (its
    axes, outermost first, as "C L H D/8 T D%8", in the words of the .kvl
    language), for the rest of the process, and return it: a Writer may
    then store pages in it (part_layout=name), a Pool hold pages in it
    (Pool(name, ...)). writes: for a pool, the part layout its writers
    store pages in when they name none (None: its writers must name one).
    Pairs with it run on the library's interpreter (no generated kernels;
    ReaderStats.fallbacks counts them).

    An invalid declaration is InvalidArgument (a ValueError) with kvlc's
    message, as 'layout "x": order "C T T H D": column 5: axis T appears
    twice in layout x, first at 1:3 (and 1 more error)'. Defining a layout
    again as it is returns it; another declaration under a name the
    library knows is InvalidArgument naming both. Needs libkvreshard ABI
    2.1 (kvr_define_layout)."""
    f = _lib.function("kvr_define_layout", "define_layout()")
    n, k, o = _str("layout name", name), _str("layout kind", kind), _str("layout order", order)
    w = None if writes is None else _str("layout writes", writes)
    err = _lib.errbuf()
    _lib.check(f(k, n, o, w, err, _lib.ERRLEN), err)
    for l in layouts():
        if l == name:
            return l
    raise KvreshardError("kvreshard: layout %s was defined but is not listed" % name)


H = TypeVar("H", bound="_Handle")


class _Handle:
    """What Store, Writer and Reader share: a handle of the library, of
    kind store, writer or reader (the C functions kvr_<kind>_...), closed
    by close(), at the end of a with block or when collected."""

    kind = "object"
    _h: Optional[int] = 0

    def _handle(self) -> int:
        h = self._h
        if not h:
            raise InvalidArgument("kvreshard: %s is closed" % self.kind, _lib.ECLOSED)
        return h

    @property
    def closed(self) -> bool:
        return not self._h

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Close the handle (kvr_<kind>_close); closing twice does nothing."""
        h, self._h = getattr(self, "_h", 0), 0
        if h:
            err = _lib.errbuf()
            _lib.check(getattr(_lib.lib(), "kvr_%s_close" % self.kind)(h, err, _lib.ERRLEN), err)

    def _stats(self, c_type: Type[ctypes.Structure], fields: Sequence[str], result: Any) -> Any:
        """The handle's counters: kvr_<kind>_stats_get into a c_type, as
        a result of those fields."""
        s = _lib.sized(c_type)
        err = _lib.errbuf()
        _lib.check(getattr(_lib.lib(), "kvr_%s_stats_get" % self.kind)(self._handle(), ctypes.byref(s), err,
                                                                      _lib.ERRLEN), err)
        return result(*(getattr(s, f) for f in fields))


class Store(_Handle):
    """An open store: file:///abs/dir, redis://host:port (Redis or Redis
    Cluster), mem:// or mem://name (in this process), or
    mooncake://HOST:PORT?... (Mooncake Store, whose master is at HOST:PORT:
    a Mooncake client in this process; see kvreshard.mooncake for the
    parameters). A context manager; close() it when done (writers and
    readers opened on it first).

    Store.from_mooncake(client) opens a store on a Mooncake client the
    process already has."""

    kind = "store"

    def __init__(self, url: str) -> None:
        self._h = 0
        self.url = url
        b = _str("store url", url)
        self._engine: Any = None
        if url[:11].lower() == "mooncake://":
            from . import mooncake
            self._h, self._engine = mooncake.open_url(url)
            return
        h = _lib.HANDLE()
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_store_open(b, ctypes.byref(h), err, _lib.ERRLEN), err)
        self._h = h.value

    @classmethod
    def from_mooncake(cls, client: Any, read_timeout_ms: Optional[int] = None, name: Optional[str] = None) -> "Store":
        """A store on a mooncake.store.MooncakeDistributedStore that is set
        up; the store does not close it. Close the client only after the
        store (and its writers and readers): Mooncake's client crashes the
        process when called after its close(). read_timeout_ms bounds a
        read's wait for Mooncake (default 5000; see kvreshard.mooncake);
        name names the store in messages (default mooncake://(client
        <its hostname>))."""
        from . import mooncake
        self = cls.__new__(cls)
        self._h = 0
        self._engine = None
        if read_timeout_ms is None:
            read_timeout_ms = mooncake.DEFAULT_READ_TIMEOUT_MS
        self._h, self._engine = mooncake.open_client(client, read_timeout_ms, name)
        self.url = self._engine.name
        return self

    def _handle(self) -> int:
        if not self._h:
            raise InvalidArgument("kvreshard: store %s is closed" % self.url, _lib.ECLOSED)
        return self._h

    def __repr__(self) -> str:
        return "Store(%r%s)" % (self.url, ", closed" if self.closed else "")


class Model(_Frozen):
    """The model whose KV pages are shared: the --model fields of the
    command line. Pages are stored under the model domain, a digest of the
    name, revision, namespace, fingerprint, dtype and shape (never of TP,
    PP or layout). The defaults of name, revision and namespace are the
    command line's, so that ``kvreshard read`` finds pages written here.

    draft_layers: how many of the last of the layers are the draft layers
    of speculative decoding (MTP) that a page holds after the model's own
    (0 to layers; the --model flag's draft-layers). They enter the model
    domain: pages with and without them never share a key.

    Immutable (AttributeError on setting an attribute): make another."""

    __slots__ = ("layers", "kv_heads", "head_dim", "v_head_dim", "page", "draft_layers", "mla", "dtype",
                 "name", "revision", "namespace", "fingerprint", "_strs", "_c")
    layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: Optional[int]
    page: int
    draft_layers: int
    mla: bool
    dtype: str
    name: str
    revision: str
    namespace: str
    fingerprint: str

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: str, page: int,
                 v_head_dim: Optional[int] = None, mla: bool = False, name: str = "model", revision: str = "0",
                 namespace: str = "kvreshard", fingerprint: str = "", draft_layers: int = 0) -> None:
        ints = dict(layers=_int32("model layers", layers), kv_heads=_int32("model kv_heads", kv_heads),
                    head_dim=_int32("model head_dim", head_dim),
                    v_head_dim=None if v_head_dim is None else _int32("model v_head_dim", v_head_dim),
                    page=_int32("model page", page), draft_layers=_int32("model draft_layers", draft_layers))
        if not isinstance(mla, bool):
            raise TypeError("kvreshard: model mla must be a bool, not %s" % type(mla).__name__)
        if mla and v_head_dim is not None:
            raise InvalidArgument("kvreshard: an mla model has one latent component; drop v_head_dim",
                                  _lib.EINVAL)
        strs = [_str("model " + f, v) for f, v in (
            ("dtype", dtype), ("name", name), ("revision", revision),
            ("namespace", namespace), ("fingerprint", fingerprint))]
        self._init(mla=mla, dtype=dtype, name=name, revision=revision, namespace=namespace,
                   fingerprint=fingerprint, _strs=strs, **ints)
        s = strs
        self._init(_c=_lib.sized(_lib.CModel, self.layers, self.kv_heads, self.head_dim, self.v_head_dim or 0,
                                 self.page, int(mla), self.draft_layers, s[0], s[1], s[2], s[3], s[4]))

    @property
    def item_size(self) -> int:
        """Bytes of one element (KeyError-free: 0 for an unknown dtype)."""
        return DTYPES.get(self.dtype, 0)

    def domain(self) -> str:
        """The model domain: 64 hex digits (InvalidArgument for a bad model)."""
        out = ctypes.create_string_buffer(80)
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_model_domain(ctypes.byref(self._c), out, len(out), err, _lib.ERRLEN), err)
        return out.value.decode("ascii")

    def __repr__(self) -> str:
        f = ["layers=%d" % self.layers, "kv_heads=%d" % self.kv_heads, "head_dim=%d" % self.head_dim]
        if self.v_head_dim is not None:
            f.append("v_head_dim=%d" % self.v_head_dim)
        f += ["dtype=%r" % self.dtype, "page=%d" % self.page]
        if self.mla:
            f.append("mla=True")
        if self.draft_layers:
            f.append("draft_layers=%d" % self.draft_layers)
        f += ["name=%r" % self.name, "revision=%r" % self.revision, "namespace=%r" % self.namespace]
        if self.fingerprint:
            f.append("fingerprint=%r" % self.fingerprint)
        return "Model(%s)" % ", ".join(f)


class Placement(_Frozen):
    """A TP x PP x CP topology and this process's rank in it: rank is
    (tp_rank, pp_rank) or (tp_rank, pp_rank, cp_rank). pp_layers lists the
    layers of each PP stage, in order, summing to the model's layers; None
    is kvreshard's even split (remainder to the first stages), which
    differs from SGLang's and vLLM's: take the split from the framework.

    Context parallelism: cp ranks hold a page's tokens, dealt in runs of
    cp_interleave tokens round-robin, so that token p of a page belongs to
    CP rank (p // cp_interleave) % cp and local token j of CP rank c is
    token ((j // cp_interleave) * cp + c) * cp_interleave + j % cp_interleave
    (SGLang's DCP: cp_interleave=1; vLLM: --cp-kv-cache-interleave-size;
    page // cp: contiguous slices). The pool of a CP rank holds page // cp
    tokens a page. The library checks the values (InvalidArgument naming
    what is wrong) when a Writer or Reader opens.

    Immutable (AttributeError on setting an attribute): make another."""

    __slots__ = ("tp", "pp", "rank", "cp_rank", "cp", "cp_interleave", "pp_layers", "_layers", "_c")
    tp: int
    pp: int
    rank: Tuple[int, ...]
    cp_rank: int
    cp: int
    cp_interleave: int
    pp_layers: Optional[Tuple[int, ...]]

    def __init__(self, tp: int, pp: int, rank: Sequence[int] = (0, 0), pp_layers: Optional[Iterable[int]] = None,
                 cp: int = 1, cp_interleave: int = 1) -> None:
        tp = _int32("placement tp", tp)
        pp = _int32("placement pp", pp)
        try:
            r = tuple(rank)
        except TypeError:
            r = ()
        if len(r) not in (2, 3):
            raise TypeError("kvreshard: placement rank must be a (tp_rank, pp_rank) or (tp_rank, pp_rank, "
                            "cp_rank) tuple, not %r" % (rank,))
        ranks = (_int32("placement tp_rank", r[0]), _int32("placement pp_rank", r[1]))
        cp_rank = _int32("placement cp_rank", r[2]) if len(r) == 3 else 0
        if len(r) == 3:
            ranks += (cp_rank,)
        cp = _int32("placement cp", cp, lo=-_I32)
        cp_interleave = _int32("placement cp_interleave", cp_interleave, lo=-_I32)
        split = None
        layers = None
        if pp_layers is not None:
            split = tuple(_int32("placement pp_layers entry", x) for x in pp_layers)
            if len(split) != pp:
                raise InvalidArgument("kvreshard: placement pp_layers has %d entries; pp is %d"
                                      % (len(split), pp), _lib.EINVAL)
            layers = (ctypes.c_int32 * len(split))(*split)
        self._init(tp=tp, pp=pp, rank=ranks, cp_rank=cp_rank, cp=cp, cp_interleave=cp_interleave,
                   pp_layers=split, _layers=layers)
        self._init(_c=_lib.sized(_lib.CPlacement, tp, pp, ranks[0], ranks[1], cp, cp_rank, cp_interleave,
                                 ctypes.cast(layers, ctypes.POINTER(ctypes.c_int32))
                                 if layers is not None else None))

    def __repr__(self) -> str:
        s = "Placement(tp=%d, pp=%d, rank=%r" % (self.tp, self.pp, self.rank)
        if self.pp_layers is not None:
            s += ", pp_layers=%r" % (list(self.pp_layers),)
        if self.cp != 1 or self.cp_interleave != 1:
            s += ", cp=%d, cp_interleave=%d" % (self.cp, self.cp_interleave)
        return s + ")"


def _region(i: int, r: Region) -> Tuple[int, int, Any]:
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


class Pool(_Frozen):
    """A rank's host pool: a pool layout (layer_first, page_first,
    page_first_direct, page_head, or any pool layout of layouts(), as
    define_layout makes them), its regions in order (K then V when the
    layout has C outermost; else one region holding every component; one
    for MLA), and the pages (slots) it holds. Only the rank's own layers,
    heads and tokens are in it: with context parallelism of cp ranks a slot
    holds page // cp tokens.

    regions is kept as a tuple, which keeps the buffers alive; sizes are
    their bytes. Immutable (AttributeError on setting an attribute): make
    another."""

    __slots__ = ("layout", "regions", "slots", "sizes", "_layout", "_keep", "_bases", "_sizes", "_c")
    layout: str
    regions: Tuple[Region, ...]
    slots: int
    sizes: Tuple[int, ...]

    def __init__(self, layout: str, regions: Sequence[Region], slots: int) -> None:
        b = _str("pool layout", layout)
        if isinstance(regions, (bytes, bytearray, memoryview)) or not hasattr(regions, "__len__"):
            raise TypeError("kvreshard: pool regions must be a list of regions, not %s"
                            % type(regions).__name__)
        if len(regions) == 0:
            raise InvalidArgument("kvreshard: pool has no regions", _lib.EINVAL)
        if isinstance(slots, bool) or not hasattr(slots, "__index__"):
            raise TypeError("kvreshard: pool slots must be an int, not %s" % type(slots).__name__)
        n = slots.__index__()
        if n <= 0 or n >= 1 << 62:
            raise InvalidArgument("kvreshard: pool slots=%d is not positive" % n, _lib.EINVAL)
        rs = [_region(i, r) for i, r in enumerate(regions)]
        sizes = tuple(size for _, size, _ in rs)
        bases = (ctypes.c_void_p * len(rs))(*(a for a, _, _ in rs))
        csizes = (ctypes.c_uint64 * len(rs))(*sizes)
        self._init(layout=layout, _layout=b, slots=n, regions=tuple(regions), _keep=[k for _, _, k in rs],
                   sizes=sizes, _bases=bases, _sizes=csizes,
                   _c=_lib.sized(_lib.CPool, len(rs), b, bases, csizes, n))

    def __repr__(self) -> str:
        return "Pool(%r, %d regions of %s bytes, slots=%d)" % (
            self.layout, len(self.sizes), "/".join(map(str, self.sizes)), self.slots)


_EMPTY_OFFSETS = array.array("q", [0])


def _keys(keys: Iterable[str]) -> Tuple[bytes, "array.array[int]", int]:
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


def _slots(slots: Iterable[int], n: int) -> Tuple[Optional[int], Any]:
    """slots as an address of n int64 values, and what keeps them alive.
    slots is any iterable of ints, read once; a numpy array of integers is
    converted at once, without a loop in Python."""
    if n == 0 and isinstance(slots, (list, tuple)) and not slots:
        return None, None
    np = _numpy()
    if np is not None and isinstance(slots, np.ndarray) and slots.dtype.kind != "O":
        if slots.dtype.kind not in "iu":
            raise TypeError("kvreshard: slots must be integers, not %s" % slots.dtype)
        # before ascontiguousarray, which makes a 0-d array 1-d
        if slots.ndim != 1:
            raise InvalidArgument("kvreshard: slots must be one-dimensional", _lib.EINVAL)
        a = np.ascontiguousarray(slots, dtype=np.int64)
        if len(a) != n:
            raise InvalidArgument("kvreshard: %d keys but %d slots" % (n, len(a)), _lib.EINVAL)
        return a.ctypes.data if n else None, a
    if isinstance(slots, (bytes, bytearray)):
        # array.array would read their bytes as raw int64 values, not as
        # the ints they hold
        slots = iter(slots)
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


def _numpy() -> Any:
    global _np
    if _np is False:
        try:
            import numpy
            _np = numpy
        except ImportError:
            _np = None
    return _np


class Writer(_Handle):
    """Writes this rank's part of pages from its pool. part_layout is the
    layout of the part in the store (PLHD, LPHD, HPLD, or any part layout
    of layouts(), as define_layout makes them); None is the one the pool's
    layout writes (Layout.writes). The first write publishes the manifest
    (publish() does it earlier, to fail fast)."""

    kind = "writer"

    def __init__(self, store: Store, model: Model, placement: Placement, pool: Pool,
                 part_layout: Optional[str] = None) -> None:
        self._h = 0
        _check_types(store, model, placement, pool)
        self.store, self.model, self.placement, self.pool = store, model, placement, pool
        self.part_layout = part_layout
        pl = None if part_layout is None else _str("part_layout", part_layout)
        h = _lib.HANDLE()
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_writer_open(
            store._handle(), ctypes.byref(model._c), ctypes.byref(placement._c),
            ctypes.byref(pool._c), pl, ctypes.byref(h), err, _lib.ERRLEN), err)
        self._h = h.value
        self._write = _lib.lib().kvr_writer_write

    def publish(self) -> None:
        """Publish the manifest: write it pinned, read it back, compare."""
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_writer_publish(self._handle(), err, _lib.ERRLEN), err)

    def write(self, keys: Iterable[str], slots: Iterable[int]) -> List[WriteStatus]:
        """Write page keys[i] from pool slot slots[i]; one WriteStatus per
        page. keys is any iterable of str, slots any iterable of ints (a
        numpy array too), each read once. Raises only for bad arguments or
        a failed batch query."""
        kb, off, n = _keys(keys)
        sp, keep = _slots(slots, n)
        st = ctypes.create_string_buffer(n or 1)
        err = _lib.errbuf()
        code = self._write(self._handle(), kb, off.buffer_info()[0], sp, n, st, err, _lib.ERRLEN)
        if code != _lib.OK:
            raise _lib.error(code, _lib.message(err))
        return [_STATUS[b] for b in st.raw[:n]]

    def stats(self) -> WriterStats:
        """The writer's counters (WriterStats)."""
        return self._stats(_lib.CWriterStats, _lib.WRITER_STATS, WriterStats)


class Reader(_Handle):
    """Reads pages into this rank's pool, whatever topology and layout wrote
    them: only the bytes of the rank's layers, heads and tokens.

    copy_workers: the threads that copy a read's bytes into the pool, the
    calling one included (None or 0: the library's GOMAXPROCS, see
    set_max_procs; 1: the calling thread only; at most 1024).
    max_pages, max_bytes: the prefetch budget of one read, in pages and in
    bytes of this rank's pool (None or 0: no limit); a read stops there
    with Stop.BUDGET.
    check_parts: check every byte a read copies into the pool against the
    checksums its part was stored with, which bind it to its page, its
    manifest and its part number; a page that fails (corrupt, or a part
    copied from another page) is not a hit: the read stops there with
    Stop.CHECKSUM and says why. Checked reads are staged and read the 1 KiB
    checksum blocks around the bytes needed; see the README for what it
    costs."""

    kind = "reader"

    def __init__(self, store: Store, model: Model, placement: Placement, pool: Pool,
                 copy_workers: Optional[int] = None, max_pages: Optional[int] = None,
                 max_bytes: Optional[int] = None, check_parts: bool = False) -> None:
        self._h = 0
        _check_types(store, model, placement, pool)
        if not isinstance(check_parts, bool):
            raise TypeError("kvreshard: check_parts must be a bool, not %s" % type(check_parts).__name__)
        opts = _lib.sized(
            _lib.CReaderOptions, copy_workers=_opt("copy_workers", copy_workers, 32),
            max_pages=_opt("max_pages", max_pages, 64), max_bytes=_opt("max_bytes", max_bytes, 64),
            check_parts=int(check_parts))
        self.store, self.model, self.placement, self.pool = store, model, placement, pool
        h = _lib.HANDLE()
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_reader_open(
            store._handle(), ctypes.byref(model._c), ctypes.byref(placement._c),
            ctypes.byref(pool._c), ctypes.byref(h), err, _lib.ERRLEN), err)
        self._h = h.value
        if opts.copy_workers or opts.max_pages or opts.max_bytes or opts.check_parts:
            code = _lib.lib().kvr_reader_set_options(self._h, ctypes.byref(opts), err, _lib.ERRLEN)
            if code != _lib.OK:
                e = _lib.error(code, _lib.message(err))
                self.close()
                raise e
        self._read = _lib.lib().kvr_reader_read
        self._exists = _lib.lib().kvr_reader_exists

    def exists(self, keys: Iterable[str]) -> int:
        """How many leading pages of keys (any iterable of str, read once)
        are complete in the store."""
        kb, off, n = _keys(keys)
        out = ctypes.c_int64()
        err = _lib.errbuf()
        code = self._exists(self._handle(), kb, off.buffer_info()[0], n, ctypes.byref(out), err, _lib.ERRLEN)
        if code != _lib.OK:
            raise _lib.error(code, _lib.message(err))
        return out.value

    def read(self, keys: Iterable[str], slots: Iterable[int]) -> ReadResult:
        """Read the leading run of complete pages keys[i] into pool slots
        slots[i] (keys and slots as Writer.write takes them). Misses, the
        budget, rejected manifests, checksum failures and a store that
        failed are results: see ReadResult.stop. A store failure (the C
        API's KVR_ESTORE) is Stop.FAILED with the store's message, not a
        StoreError, because the pages before it were read in full: hit of
        them may be used. Raises only for bad arguments."""
        kb, off, n = _keys(keys)
        sp, keep = _slots(slots, n)
        res = _lib.sized(_lib.CReadResult)
        err = _lib.errbuf()
        code = self._read(self._handle(), kb, off.buffer_info()[0], sp, n, ctypes.byref(res), err, _lib.ERRLEN)
        if code != _lib.OK and code != _lib.ESTORE:
            raise _lib.error(code, _lib.message(err))
        stop = res.stop
        return ReadResult(res.hit, res.bytes, res.ops, _STOP[stop] if 0 <= stop < len(_STOP) else stop,
                          _lib.message(err) if stop else "")

    def stats(self) -> ReaderStats:
        """The reader's counters (ReaderStats)."""
        return self._stats(_lib.CReaderStats, _lib.READER_STATS, ReaderStats)


def _opt(what: str, v: Optional[int], bits: int) -> int:
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


def _check_types(store: Any, model: Any, placement: Any, pool: Any) -> None:
    for what, v, cls in (("store", store, Store), ("model", model, Model),
                         ("placement", placement, Placement), ("pool", pool, Pool)):
        if not isinstance(v, cls):
            raise TypeError("kvreshard: %s must be a kvreshard.%s, not %s"
                            % (what, cls.__name__, type(v).__name__))
