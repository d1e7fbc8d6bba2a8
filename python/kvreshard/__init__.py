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

import ctypes
import enum
import os
from collections import namedtuple
from typing import Any, Iterable, List, Optional, Sequence, Type, TypeVar

from . import _args, _lib, _types
from ._args import Region  # the type of a pool region, kvreshard.Region
from ._lib import (ForkError, InvalidArgument, KvreshardError, ManifestError,
                   StoreError)
from ._types import DTYPES, Layout, Model, Placement, Pool

__all__ = [
    "Store", "Model", "Placement", "Pool", "Writer", "Reader", "ReadResult",
    "WriteStatus", "Stop", "ReaderStats", "WriterStats", "Layout",
    "KvreshardError", "InvalidArgument", "StoreError", "ManifestError", "ForkError",
    "set_max_procs", "library_path", "layouts", "define_layout", "DTYPES",
]


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
    CHECKSUM = 6  # a page is damaged: bytes failed their checksums (check_parts), or a part's size is not its manifest's


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
    n = _args.int32("set_max_procs: n", n, lo=-_args.I32)
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

    An invalid declaration is InvalidArgument (a ValueError) with the
    errors kvlc gives for the same layout in a .kvl file, in its order, at
    columns of the order: 'layout "x": order "C T T H D": layout x is
    missing axis L; column 5: axis T appears twice in layout x, first at
    1:3'. Defining a layout
    again as it is returns it; another declaration under a name the
    library knows is InvalidArgument naming both. Needs libkvreshard ABI
    2.1 (kvr_define_layout)."""
    f = _lib.function("kvr_define_layout", "define_layout()")
    n, k, o = (_args.cstr("layout name", name), _args.cstr("layout kind", kind),
               _args.cstr("layout order", order))
    w = None if writes is None else _args.cstr("layout writes", writes)
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
    a Mooncake client in this process; see kvreshard.mooncake_url for
    the parameters). A context manager; close() it when done (writers and
    readers opened on it first).

    Store.from_mooncake(client) opens a store on a Mooncake client the
    process already has."""

    kind = "store"

    def __init__(self, url: str) -> None:
        self._h = 0
        self.url = url
        b = _args.cstr("store url", url)
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
        read's wait for Mooncake (default 5000; see kvreshard.mooncake_url);
        name names the store in messages (default mooncake://(client
        <its hostname>); a name that is not a mooncake:// URL is shown as
        engine:<name>)."""
        from . import mooncake
        self = cls.__new__(cls)
        self._h = 0
        self._engine = None
        if read_timeout_ms is None:
            read_timeout_ms = mooncake.DEFAULT_READ_TIMEOUT_MS
        self._h, self._engine = mooncake.open_client(client, read_timeout_ms, name)
        self.url = self._engine.name
        return self

    @property
    def engine(self) -> Any:
        """The object engine the store runs on: a
        kvreshard.mooncake.MooncakeEngine for a Mooncake store (its client,
        and its counts of calls), None for the library's own stores."""
        return self._engine

    def _handle(self) -> int:
        if not self._h:
            raise InvalidArgument("kvreshard: store %s is closed" % self.url, _lib.ECLOSED)
        return self._h

    def __repr__(self) -> str:
        return "Store(%r%s)" % (self.url, ", closed" if self.closed else "")


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
        pl = None if part_layout is None else _args.cstr("part_layout", part_layout)
        h = _lib.HANDLE()
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_writer_open(
            store._handle(), ctypes.byref(_types.c_struct(model)), ctypes.byref(_types.c_struct(placement)),
            ctypes.byref(_types.c_struct(pool)), pl, ctypes.byref(h), err, _lib.ERRLEN), err)
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
        kb, off, n = _args.pack_keys(keys)
        sp, keep = _args.pack_slots(slots, n)
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
            _lib.CReaderOptions, copy_workers=_args.opt_int("copy_workers", copy_workers, 32),
            max_pages=_args.opt_int("max_pages", max_pages, 64),
            max_bytes=_args.opt_int("max_bytes", max_bytes, 64),
            check_parts=int(check_parts))
        self.store, self.model, self.placement, self.pool = store, model, placement, pool
        h = _lib.HANDLE()
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_reader_open(
            store._handle(), ctypes.byref(_types.c_struct(model)), ctypes.byref(_types.c_struct(placement)),
            ctypes.byref(_types.c_struct(pool)), ctypes.byref(h), err, _lib.ERRLEN), err)
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
        kb, off, n = _args.pack_keys(keys)
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
        kb, off, n = _args.pack_keys(keys)
        sp, keep = _args.pack_slots(slots, n)
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


def _check_types(store: Any, model: Any, placement: Any, pool: Any) -> None:
    for what, v, cls in (("store", store, Store), ("model", model, Model),
                         ("placement", placement, Placement), ("pool", pool, Pool)):
        if not isinstance(v, cls):
            raise TypeError("kvreshard: %s must be a kvreshard.%s, not %s"
                            % (what, cls.__name__, type(v).__name__))
