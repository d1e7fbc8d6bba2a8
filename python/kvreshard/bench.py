"""The Python side of kvreshard's benchmark: the 70B-size resharded read.

    python3 -m kvreshard.bench --url file:///tmp/kvbench --pages 64 [--write] [--repeat 5]

prints one JSON object:

- ``read_seconds``: the best of --repeat reads of all --pages pages of the
  70B-size page (80 layers, 8 KV heads, head dim 128, bf16, 64 tokens; 20
  MiB), written by TP 8 in PLHD, read by rank 0/0 of TP 4 x PP 2 (layers
  0-39, heads 0-1: 2.5 MiB a page) into a page_first pool, after one read
  that fills the caches; ``bytes`` and ``gbps`` of that read;
- ``call_us``: the cost of one read call with no pages, in microseconds
  (the best mean of 5 runs of --calls calls).

The pages are those of `kvreshard_<key>_<domain>` with the keys
"%016x" % (i * 0x9e3779b97f4a7c15), i < pages, of model name bench-70b
(namespace kvreshard, revision 0): what a Go writer of
content.PageKeys("kvreshard", domain, n) writes. --write writes them first,
from this process, as the eight TP ranks.

``--serve`` instead reads the same case on command, for `kvreshard bench`
(figures python_vs_go_read and python_call_us): one long-lived process, so
that Go and Python rounds alternate without the interpreter's start. It
reads one JSON object a line on stdin and answers with JSON lines on
stdout, flushed:

- ``{"op": "open", "url": U, "name": N, "domain": D, "keys": [...],
  "slots": [...]}``: opens the store and a reader of rank 0/0 of TP 4 x PP
  2 into a page_first pool of len(keys) slots (numpy arrays over
  page-aligned anonymous memory, SGLang's shape); D is the model domain
  the caller expects. Answers ``{"layout": "page_first", "slots": n,
  "regions": [bytes of K, bytes of V], "domain": D}``.
- ``{"op": "read", "rounds": k}``: k reads of all the keys into their
  slots; one line a round, ``{"round": i, "seconds": s, "hit": h,
  "bytes": b, "ops": o, "stop": "NONE"}``, s timed around the read call.
- ``{"op": "calls", "rounds": r, "calls": n}``: r rounds of n calls
  read([], []), n calls of kvr_reader_read through ctypes with its
  arguments ready (the empty read without the package's Python, on a
  reader of the same rank that this module opens through the C API
  itself, see RawReader) and n calls of the library's cheapest function
  (kvr_set_max_procs(0)); one line a round, ``{"round": i, "us": mean µs of an empty read, "raw_us":
  of the ready call, "floor_us": of the cheapest call}``.
- ``{"op": "digest"}``: ``{"sha256": [hex of K, hex of V]}`` of the pool.

At end of input it closes everything and exits 0. A bad command or a
failure answers ``{"error": "..."}`` and exits 1.

``--mooncake`` instead measures the Mooncake figures of `kvreshard bench`
(mooncake_vs_get_into, mooncake_query_cost) and prints one JSON object. It
must run in a network namespace with only loopback (Mooncake's clients
listen on every address; the Go side starts it with unshare -rn), and
starts its own mooncake_master and a memory holder process
(kvreshard.mooncake_local); this process is the reader, a client with no
memory of its own, so every byte crosses TCP (MC_STORE_MEMCPY=false). See
mooncake_main.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import hashlib
import json
import mmap
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, TextIO, Tuple

import kvreshard as kv

LAYERS, HEADS, DIM, PAGE = 80, 8, 128, 64


def model(name: str) -> kv.Model:
    return kv.Model(layers=LAYERS, kv_heads=HEADS, head_dim=DIM, dtype="bf16", page=PAGE, name=name)


def keys(n: int) -> List[str]:
    return ["%016x" % ((i * 0x9e3779b97f4a7c15) & (1 << 64) - 1) for i in range(n)]


def write(st: kv.Store, m: kv.Model, ks: Sequence[str]) -> None:
    """Every rank of TP 8 writes the pages from slot 0 of its page_first pool (PLHD parts)."""
    n = PAGE * LAYERS * 1 * DIM * 2  # one component of one slot of one head's pool
    for t in range(8):
        k, v = bytearray(n), bytearray(n)
        pattern = bytes((t * 7 + i) & 0xFF for i in range(251))
        k[:] = (pattern * (n // 251 + 1))[:n]
        v[:] = k[::-1]
        with kv.Writer(st, m, kv.Placement(8, 1, rank=(t, 0)), kv.Pool("page_first", [k, v], 1), "PLHD") as w:
            for i in range(0, len(ks), 128):
                st_ = w.write(ks[i:i + 128], [0] * len(ks[i:i + 128]))
                bad = [s for s in st_ if s not in (kv.WriteStatus.WRITTEN, kv.WriteStatus.COMPLETE)]
                if bad:
                    raise SystemExit("kvreshard bench: TP rank %d: write gave %s" % (t, bad[0].name))


def reshard_pool(slots: int) -> Tuple[kv.Pool, List[mmap.mmap]]:
    """The pool of rank 0/0 of TP 4 x PP 2 (layers 0-39, heads 0-1) in
    page_first: numpy arrays of SGLang's shape [tokens, layers, heads,
    dim] over page-aligned anonymous memory, as Go's large allocations
    are; and the memory."""
    import numpy as np
    n = slots * PAGE * (LAYERS // 2) * (HEADS // 4) * DIM * 2
    mem = [mmap.mmap(-1, n), mmap.mmap(-1, n)]
    arrays = [np.frombuffer(m, np.uint16).reshape(slots * PAGE, LAYERS // 2, HEADS // 4, DIM) for m in mem]
    return kv.Pool("page_first", arrays, slots), mem


# The C API (cmd/libkvreshard/kvreshard.h, ABI version 2), declared here for
# RawReader: the structs it passes and the functions it calls.
ABI_VERSION = 2
OK = 0  # KVR_OK
ERRLEN = 1024  # the message buffer a call gets


class CModel(ctypes.Structure):
    """kvr_model."""
    _fields_ = [("size", ctypes.c_uint32), ("layers", ctypes.c_int32), ("kv_heads", ctypes.c_int32),
                ("head_dim", ctypes.c_int32), ("v_head_dim", ctypes.c_int32), ("page", ctypes.c_int32),
                ("mla", ctypes.c_int32), ("draft_layers", ctypes.c_int32), ("dtype", ctypes.c_char_p),
                ("name", ctypes.c_char_p), ("revision", ctypes.c_char_p), ("namespace_", ctypes.c_char_p),
                ("fingerprint", ctypes.c_char_p)]


class CPlacement(ctypes.Structure):
    """kvr_placement."""
    _fields_ = [("size", ctypes.c_uint32), ("tp", ctypes.c_int32), ("pp", ctypes.c_int32),
                ("tp_rank", ctypes.c_int32), ("pp_rank", ctypes.c_int32), ("cp", ctypes.c_int32),
                ("cp_rank", ctypes.c_int32), ("cp_interleave", ctypes.c_int32),
                ("pp_layers", ctypes.POINTER(ctypes.c_int32))]


class CPool(ctypes.Structure):
    """kvr_pool."""
    _fields_ = [("size", ctypes.c_uint32), ("nregions", ctypes.c_int32), ("layout", ctypes.c_char_p),
                ("bases", ctypes.POINTER(ctypes.c_void_p)), ("sizes", ctypes.POINTER(ctypes.c_uint64)),
                ("slots", ctypes.c_int64)]


class CReadResult(ctypes.Structure):
    """kvr_read_result."""
    _fields_ = [("size", ctypes.c_uint32), ("stop", ctypes.c_int32), ("hit", ctypes.c_int64),
                ("bytes", ctypes.c_int64), ("ops", ctypes.c_int64)]


# _h: a handle (kvr_store *, kvr_reader *), an opaque id
_h, _p, _n = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
_SIGNATURES = {
    "kvr_version": ([ctypes.POINTER(ctypes.c_int32)], ctypes.c_int),
    "kvr_set_max_procs": ([ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), _p, _n], ctypes.c_int),
    "kvr_store_open": ([ctypes.c_char_p, ctypes.POINTER(_h), _p, _n], ctypes.c_int),
    "kvr_store_close": ([_h, _p, _n], ctypes.c_int),
    "kvr_reader_open": ([_h, ctypes.POINTER(CModel), ctypes.POINTER(CPlacement), ctypes.POINTER(CPool),
                         ctypes.POINTER(_h), _p, _n], ctypes.c_int),
    "kvr_reader_read": ([_h, ctypes.c_char_p, _p, _p, ctypes.c_int64, ctypes.POINTER(CReadResult), _p, _n],
                        ctypes.c_int),
    "kvr_reader_close": ([_h, _p, _n], ctypes.c_int),
}


class RawReader:
    """A reader opened through the C API itself, over ctypes, on the library
    the package uses (kvreshard.library_path(): the same loaded library, so
    the same Go runtime): the calls figure times kvr_reader_read with its
    arguments ready, and kvr_set_max_procs, without the package's Python in
    between. It opens its own store handle of url and a reader of the same
    model, placement and pool memory as the package's reader."""

    def __init__(self, url: str, m: kv.Model, place: kv.Placement, pool: kv.Pool) -> None:
        self.lib = ctypes.CDLL(kv.library_path())
        for name, (args, res) in _SIGNATURES.items():
            f = getattr(self.lib, name)
            f.argtypes, f.restype = args, res
        v = self.lib.kvr_version(None)
        if v != ABI_VERSION:
            raise RuntimeError("%s has C API version %d; the bench declares %d"
                               % (kv.library_path(), v, ABI_VERSION))
        self.err = ctypes.create_string_buffer(ERRLEN)
        self.result = CReadResult(ctypes.sizeof(CReadResult))
        self.store = self.reader = 0
        strs = [s.encode("utf-8") for s in (m.dtype, m.name, m.revision, m.namespace, m.fingerprint)]
        self._model = CModel(ctypes.sizeof(CModel), m.layers, m.kv_heads, m.head_dim, m.v_head_dim or 0, m.page,
                             int(m.mla), m.draft_layers, *strs)
        self._layers = None if place.pp_layers is None else (ctypes.c_int32 * place.pp)(*place.pp_layers)
        layers = None if self._layers is None else ctypes.cast(self._layers, ctypes.POINTER(ctypes.c_int32))
        self._place = CPlacement(ctypes.sizeof(CPlacement), place.tp, place.pp, place.rank[0], place.rank[1],
                                 place.cp, place.cp_rank, place.cp_interleave, layers)
        # the pool's buffers, exported for as long as this reader lives
        self._keep = [(ctypes.c_char * n).from_buffer(r) for r, n in zip(pool.regions, pool.sizes)]
        self._bases = (ctypes.c_void_p * len(self._keep))(*(ctypes.addressof(k) for k in self._keep))
        self._sizes = (ctypes.c_uint64 * len(self._keep))(*pool.sizes)
        self._pool = CPool(ctypes.sizeof(CPool), len(self._keep), pool.layout.encode("utf-8"), self._bases,
                           self._sizes, pool.slots)
        h = _h()
        self._check("kvr_store_open",
                    self.lib.kvr_store_open(url.encode("utf-8"), ctypes.byref(h), self.err, ERRLEN))
        self.store = h.value
        try:
            self._check("kvr_reader_open", self.lib.kvr_reader_open(
                self.store, ctypes.byref(self._model), ctypes.byref(self._place), ctypes.byref(self._pool),
                ctypes.byref(h), self.err, ERRLEN))
        except Exception:
            self.close()
            raise
        self.reader = h.value

    def _check(self, what: str, code: int) -> None:
        if code != OK:
            raise RuntimeError("%s: code %d: %s" % (what, code, self.err.value.decode("utf-8", "replace")))

    def close(self) -> None:
        """Close the reader, then the store."""
        h, self.reader = self.reader, 0
        if h:
            self._check("kvr_reader_close", self.lib.kvr_reader_close(h, self.err, ERRLEN))
        h, self.store = self.store, 0
        if h:
            self._check("kvr_store_close", self.lib.kvr_store_close(h, self.err, ERRLEN))


class _Server:
    """The --serve mode: one command a line, JSON lines out."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.store: Optional[kv.Store] = None
        self.reader: Optional[kv.Reader] = None
        self.raw: Optional[RawReader] = None

    def say(self, obj: Dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def open(self, c: Dict[str, Any]) -> None:
        if self.reader is not None:
            raise ValueError("open: already open")
        keys, slots = c.get("keys"), c.get("slots")
        if not isinstance(keys, list) or not keys or not isinstance(slots, list) or len(slots) != len(keys):
            raise ValueError("open: keys must be a non-empty list and slots a list as long")
        m = model(c.get("name", "bench-70b"))
        if c.get("domain") is not None and m.domain() != c["domain"]:
            raise ValueError("open: model domain %s, not the caller's %s" % (m.domain(), c["domain"]))
        self.keys, self.slots = keys, slots
        self.url, self.model, self.place = c["url"], m, kv.Placement(4, 2, rank=(0, 0), pp_layers=[40, 40])
        self.pool, self.mem = reshard_pool(len(keys))
        self.store = kv.Store(self.url)
        self.reader = kv.Reader(self.store, m, self.place, self.pool)
        self.say({"layout": self.pool.layout, "slots": self.pool.slots, "regions": list(self.pool.sizes),
                  "domain": m.domain()})

    def opened(self, op: str) -> kv.Reader:
        if self.reader is None:
            raise ValueError("%s: open first" % op)
        return self.reader

    def read(self, c: Dict[str, Any]) -> None:
        r, ks, slots = self.opened("read"), self.keys, self.slots
        for i in range(_count(c, "rounds")):
            t = time.perf_counter()
            res = r.read(ks, slots)
            d = time.perf_counter() - t
            self.say({"round": i, "seconds": d, "hit": res.hit, "bytes": res.bytes, "ops": res.ops,
                      "stop": res.stop.name, "message": res.message})

    def calls(self, c: Dict[str, Any]) -> None:
        r, n = self.opened("calls"), _count(c, "calls")
        if self.raw is None:
            self.raw = RawReader(self.url, self.model, self.place, self.pool)
        read, floor, prev = r.read, self.raw.lib.kvr_set_max_procs, ctypes.c_int32()
        raw, h, res, err = self.raw.lib.kvr_reader_read, self.raw.reader, self.raw.result, self.raw.err
        offs = array.array("q", [0])
        off = offs.buffer_info()[0]
        if raw(h, b"", off, None, 0, ctypes.byref(res), err, ERRLEN) != OK or res.hit != 0:
            raise RuntimeError("calls: an empty kvr_reader_read failed: %s" % err.value.decode("utf-8", "replace"))
        for i in range(_count(c, "rounds")):
            t = time.perf_counter()
            for _ in range(n):
                read([], [])
            d = time.perf_counter() - t
            p, o = ctypes.byref(prev), ctypes.byref(res)
            t = time.perf_counter()
            for _ in range(n):
                raw(h, b"", off, None, 0, o, err, ERRLEN)
            w = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(n):
                floor(0, p, err, ERRLEN)
            f = time.perf_counter() - t
            self.say({"round": i, "us": d / n * 1e6, "raw_us": w / n * 1e6, "floor_us": f / n * 1e6})

    def digest(self, c: Dict[str, Any]) -> None:
        self.opened("digest")
        self.say({"sha256": [hashlib.sha256(m).hexdigest() for m in self.mem]})

    def close(self) -> None:
        for o in (self.raw, self.reader, self.store):
            if o is not None:
                o.close()


def _count(c: Dict[str, Any], field: str) -> int:
    v = c.get(field)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError("%s: %s must be a positive int, not %r" % (c["op"], field, v))
    return v


def serve(inp: Iterable[str], out: TextIO) -> int:
    """Serve commands from inp (lines of JSON) on out until the end of inp;
    0 then, 1 after an error (reported as {"error": ...})."""
    s = _Server(out)
    ops = {"open": s.open, "read": s.read, "calls": s.calls, "digest": s.digest}
    try:
        for line in inp:
            if not line.strip():
                continue
            c = json.loads(line)
            if not isinstance(c, dict) or c.get("op") not in ops:
                raise ValueError("unknown command %s" % line.strip()[:200])
            ops[c["op"]](c)
    except Exception as e:
        s.say({"error": "%s: %s" % (type(e).__name__, e)})
        return 1
    finally:
        s.close()
    return 0


# ---------------------------------------------------------------------------
# The Mooncake figures

def part_spans(part_layout: str, pages_keys: int, part_bytes: int) -> List[Tuple[int, int, int]]:
    """The source spans of the resharding reader (TP 4 x PP 2 rank 0/0:
    layers 0-39 of heads 0 and 1, parts 0 and 1 of TP 8) in each part, as
    (part index, offset, length) lists: PLHD parts (token, layer, dim) give
    each token's 40 layers, 10 KiB 20 KiB apart, for K and V; LPHD parts
    (layer, token, dim) give layers 0-39 of K and of V, 640 KiB each."""
    comp = part_bytes // 2
    if part_layout == "LPHD":
        half = LAYERS // 2 * PAGE * DIM * 2
        return [(p, c * comp, half) for p in (0, 1) for c in (0, 1)]
    span = LAYERS // 2 * DIM * 2
    return [(p, c * comp + t * 2 * span, span) for p in (0, 1) for c in (0, 1) for t in range(PAGE)]


def mooncake_main(a: argparse.Namespace) -> int:
    """Measure, in turns, on a master and holder of our own: a resharded
    read of a.pages pages (TP 8 parts of each of PLHD and LPHD, read by TP
    4 x PP 2 rank 0/0 into page_first) against batch_get_into of as many
    objects of the same bytes (2.5 MiB, a page's share of the reader);
    get_into_ranges of the reader's spans without kvreshard; batch_get_into
    of the whole parts that hold them; and Reader.exists of 128 pages
    against one batch_is_exist of their 128 commit keys. Prints one JSON
    object of the times of every turn."""
    import numpy as np
    from . import mooncake_local as ml
    ml.require_loopback_only("python3 -m kvreshard.bench --mooncake")
    for k, v in ml.client_env().items():
        os.environ[k] = v
    n, turns = a.pages, a.turns
    page_bytes = PAGE * LAYERS * HEADS * DIM * 2 * 2
    part_bytes = page_bytes // 8
    share = page_bytes // 8  # the reader's bytes of a page: half the layers of 2 of the 8 heads
    qpages = 128
    segment = (2 * n * page_bytes + 2 * n * share + qpages * (1 << 20)) * 5 // 4 + (64 << 20)
    out: Dict[str, Any] = {"pages": n, "turns": turns, "page_bytes": page_bytes, "share": share, "segment": segment}
    with ml.Master() as master, ml.Holder(master, segment):
        st = kv.Store(master.url)
        client = st.engine.client
        m = model("bench-70b-mooncake")
        ks = {"PLHD": keys(n), "LPHD": ["l" + k for k in keys(n)]}
        t0 = time.perf_counter()
        for pl in ("PLHD", "LPHD"):
            write_parts(st, m, ks[pl], pl)
        out["write_seconds"] = time.perf_counter() - t0
        parts = _part_keys(master, m.domain())
        pool, mem = reshard_pool(n)
        slots = list(range(n - 1, -1, -1))
        rd = kv.Reader(st, m, kv.Placement(4, 2, rank=(0, 0), pp_layers=[40, 40]), pool)
        layouts: Dict[str, Dict[str, Any]] = {}
        for pl in ("PLHD", "LPHD"):
            res = rd.read(ks[pl], slots)
            if res.hit != n:
                raise RuntimeError("%s: read %d of %d pages: %s %s" % (pl, res.hit, n, res.stop.name, res.message))
            _verify(pool, slots, n)
            if res.bytes != n * share:
                raise RuntimeError("%s: read %d bytes, not %d" % (pl, res.bytes, n * share))
            layouts[pl] = {"bytes": res.bytes, "ops": res.ops}
        # Mooncake alone: objects of the reader's bytes a page, and the
        # reader's spans and whole parts, into registered memory
        dst = np.zeros(2 * n * (part_bytes + (1 << 20)), np.uint8)
        if client.register_buffer(dst.ctypes.data, dst.nbytes) != 0:
            raise RuntimeError("register_buffer failed")
        base = dst.ctypes.data
        objs = ["bench-get-%d" % i for i in range(n)]
        src = np.frombuffer(mem[0], np.uint8)[:share]
        rs = client.batch_put_from(objs, [src.ctypes.data] * n, [share] * n)
        if any(r != 0 for r in rs):
            raise RuntimeError("batch_put_from of the baseline objects: %s" % rs)

        def get_into() -> None:
            rs = client.batch_get_into(objs, [base + i * share for i in range(n)], [share] * n)
            if any(r != share for r in rs):
                raise RuntimeError("batch_get_into: %s" % rs)

        def resharded(pl: str) -> Callable[[], None]:
            def f() -> None:
                res = rd.read(ks[pl], slots)
                if res.hit != n:
                    raise RuntimeError("%s: read %d of %d pages: %s" % (pl, res.hit, n, res.message))
            return f

        def ranges(pl: str) -> Tuple[Callable[[], None], int]:
            spans = part_spans(pl, n, part_bytes)
            bdst: List[List[int]]
            bkeys, bdst, bsrc, bsz, at = [], [], [], [], 0
            for k in ks[pl]:
                for p in (0, 1):
                    mine = [(o, ln) for q, o, ln in spans if q == p]
                    bkeys.append(parts[(k, p)])
                    bsrc.append([o for o, _ in mine])
                    bsz.append([ln for _, ln in mine])
                    bdst.append([])
                    for _, ln in mine:
                        bdst[-1].append(at)
                        at += ln
            args = ([base], [bkeys], [bdst], [bsrc], [bsz])
            want = [bsz]

            def f() -> None:
                r = client.get_into_ranges(*args)
                if r != want:
                    raise RuntimeError("get_into_ranges: %s" % str(r)[:300])
            return f, sum(len(x) for x in bsrc)

        # a part holds its data, then its checksums
        stored = client.get_size(parts[(ks["PLHD"][0], 0)])
        out["part_stored_bytes"] = stored

        def whole_parts(pl: str) -> Callable[[], None]:
            pk = [parts[(k, p)] for k in ks[pl] for p in (0, 1)]

            def f() -> None:
                rs = client.batch_get_into(pk, [base + i * stored for i in range(len(pk))], [stored] * len(pk))
                if any(r != stored for r in rs):
                    raise RuntimeError("batch_get_into of parts: %s" % rs)
            return f

        get_into(), resharded("LPHD")()  # warm
        for pl in ("PLHD", "LPHD"):
            rf, nr = ranges(pl)
            rf()
            wf = whole_parts(pl)
            wf()
            layouts[pl].update(ranges=nr, turns=_turns(turns, resharded(pl), get_into),
                               raw_ranges=_turns(turns, rf, get_into), parts=_turns(turns, wf, get_into))
        out["layouts"] = layouts
        rd.close()
        out["query"] = _query(st, client, qpages, max(20, turns * 5))
        out["engine"] = dict(st.engine.counts)
        client.unregister_buffer(base)
        st.close()
    print(json.dumps(out), flush=True)
    return 0


def write_parts(st: kv.Store, m: kv.Model, ks: Sequence[str], part_layout: str) -> None:
    """Every TP 8 rank writes the pages of ks from slot 0 of a page_first
    pool whose K and V bytes say which rank, layer, head and token they
    are (see _verify)."""
    for t in range(8):
        k = _pattern(t, 0)
        v = _pattern(t, 1)
        with kv.Writer(st, m, kv.Placement(8, 1, rank=(t, 0)), kv.Pool("page_first", [k, v], 1), part_layout) as w:
            for i in range(0, len(ks), 128):
                sts = w.write(ks[i:i + 128], [0] * len(ks[i:i + 128]))
                bad = [s for s in sts if s not in (kv.WriteStatus.WRITTEN, kv.WriteStatus.COMPLETE)]
                if bad:
                    raise RuntimeError("TP rank %d: write gave %s" % (t, bad[0].name))


def _pattern(head: int, comp: int) -> Any:
    """One head's page_first pool of one slot, [token, layer, 1, dim] of
    uint16: element (t, l, d) is a mix of head, component, token, layer and
    dim that no other element has."""
    import numpy as np
    t, l, d = np.meshgrid(np.arange(PAGE), np.arange(LAYERS), np.arange(DIM), indexing="ij")
    x = (t * 7919 + l * 104729 + d * 31 + head * 15485863 + comp * 32452843) % 65521
    return np.ascontiguousarray(x.astype(np.uint16).reshape(PAGE, LAYERS, 1, DIM))


def _verify(pool: kv.Pool, slots: Sequence[int], n: int) -> None:
    """Every slot of the reader's pool holds layers 0-39 of heads 0 and 1."""
    import numpy as np
    for c, arr in enumerate(pool.regions):
        want = np.concatenate([_pattern(h, c)[:, :LAYERS // 2] for h in (0, 1)], axis=2)
        got = arr.reshape(n, PAGE, LAYERS // 2, 2, DIM)
        for s in slots:
            if not np.array_equal(got[s], want):
                raise RuntimeError("slot %d of component %d does not hold the bytes written" % (s, c))


def _part_keys(master: Any, domain: str) -> Dict[Tuple[str, int], str]:
    """{(page key, part): the Mooncake key of the part}, from the master's
    list of keys (the part keys name a digest of their manifest)."""
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/get_all_keys" % master.metrics_port, timeout=30) as r:
        names = r.read().decode().split()
    out = {}
    for name in names:
        head, sep, rest = name.partition("/p/")
        if sep and head.startswith("kvreshard_") and head.endswith("_" + domain):
            out[(head[len("kvreshard_"):-len(domain) - 1], int(rest.rsplit("/", 1)[1]))] = name
    return out


def _turns(turns: int, f: Callable[[], None], g: Callable[[], None]) -> List[List[float]]:
    """turns turns of f and g, in the order f g g f, then g f f g: each
    turn's [time of f, time of g], each the mean of its two runs."""
    out = []
    for i in range(turns):
        tf = tg = 0.0
        for j in range(4):
            h = f if (i % 2 == 0) != (j in (1, 2)) else g
            t = time.perf_counter()
            h()
            d = time.perf_counter() - t
            if h is f:
                tf += d
            else:
                tg += d
        out.append([tf / 2, tg / 2])
    return out


def _query(st: kv.Store, client: Any, n: int, rounds: int) -> Dict[str, Any]:
    """Reader.exists of n pages written (a small model, TP 1) against one
    batch_is_exist of their n commit keys, in turns of 10 calls each; and
    the first Reader.exists (it reads the commits; later ones remember
    them)."""
    m = kv.Model(layers=2, kv_heads=8, head_dim=128, dtype="bf16", page=PAGE, name="bench-query")
    ks = keys(n)
    k = bytearray(PAGE * 2 * 8 * DIM * 2)
    with kv.Writer(st, m, kv.Placement(1, 1), kv.Pool("page_first", [k, bytearray(k)], 1), "PLHD") as w:
        sts = w.write(ks, [0] * n)
        if any(s != kv.WriteStatus.WRITTEN for s in sts):
            raise RuntimeError("query pages: %s" % sts[:3])
    done = [("kvreshard_%s_%s/done" % (x, m.domain())).encode() for x in ks]
    pool = kv.Pool("page_first", [bytearray(PAGE * 2 * 8 * DIM * 2), bytearray(PAGE * 2 * 8 * DIM * 2)], 1)
    with kv.Reader(st, m, kv.Placement(1, 1), pool) as r:
        t = time.perf_counter()
        first = r.exists(ks)
        cold = time.perf_counter() - t
        if first != n:
            raise RuntimeError("Reader.exists: %d of %d pages" % (first, n))

        def exists() -> None:
            for _ in range(10):
                if r.exists(ks) != n:
                    raise RuntimeError("Reader.exists lost pages")

        def batch() -> None:
            for _ in range(10):
                rs = client.batch_is_exist(done)
                if rs.count(1) != n:
                    raise RuntimeError("batch_is_exist: %s" % rs[:5])
        return {"pages": n, "cold": cold, "turns": [[a / 10, b / 10] for a, b in _turns(rounds, exists, batch)]}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvreshard.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="the store holding the pages (required unless --serve)")
    ap.add_argument("--pages", type=int, default=64, help="pages to read (default 64)")
    ap.add_argument("--repeat", type=int, default=5, help="timed reads; the best is reported (default 5)")
    ap.add_argument("--calls", type=int, default=100000, help="empty calls per timing of call_us")
    ap.add_argument("--name", default="bench-70b", help="the model name (default bench-70b)")
    ap.add_argument("--write", action="store_true", help="write the pages first")
    ap.add_argument("--serve", action="store_true", help="read on command from stdin (see the module's doc)")
    ap.add_argument("--mooncake", action="store_true", help="measure the Mooncake figures on a master of its own "
                    "(in a loopback-only network namespace)")
    ap.add_argument("--turns", type=int, default=15, help="with --mooncake: turns of each pair (default 15)")
    a = ap.parse_args(argv)
    if a.serve:
        return serve(sys.stdin, sys.stdout)
    if a.mooncake:
        if a.pages < 1 or a.turns < 1:
            ap.error("--pages and --turns must be at least 1")
        try:
            return mooncake_main(a)
        except Exception as e:
            print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}), flush=True)
            return 1
    if a.url is None:
        ap.error("--url is required")
    if a.pages < 1 or a.repeat < 1 or a.calls < 1:
        ap.error("--pages, --repeat and --calls must be at least 1")
    m = model(a.name)
    ks = keys(a.pages)
    with kv.Store(a.url) as st:
        if a.write:
            write(st, m, ks)
        # rank 0/0 of TP 4 x PP 2: layers 0-39, heads 0-1; page_first, K and V
        # regions, page-aligned anonymous memory as Go's large allocations are
        n = a.pages * PAGE * (LAYERS // 2) * 2 * DIM * 2
        pool = kv.Pool("page_first", [mmap.mmap(-1, n), mmap.mmap(-1, n)], a.pages)
        slots = list(range(a.pages - 1, -1, -1))
        with kv.Reader(st, m, kv.Placement(4, 2, rank=(0, 0), pp_layers=[40, 40]), pool) as r:
            res = r.read(ks, slots)
            if res.hit != a.pages:
                print(json.dumps({"error": "read %d of %d pages: %s %s" % (res.hit, a.pages, res.stop.name,
                                                                         res.message)}))
                return 1
            best = None
            for _ in range(a.repeat):
                t = time.perf_counter()
                res = r.read(ks, slots)
                d = time.perf_counter() - t
                if res.hit != a.pages:
                    print(json.dumps({"error": "timed read: %d of %d pages: %s" % (res.hit, a.pages, res.message)}))
                    return 1
                best = d if best is None else min(best, d)
            call = None
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(a.calls):
                    r.read([], [])
                d = (time.perf_counter() - t) / a.calls
                call = d if call is None else min(call, d)
    print(json.dumps({"url": a.url, "pages": a.pages, "repeat": a.repeat, "bytes": res.bytes, "ops": res.ops,
                      "read_seconds": best, "gbps": res.bytes / best / 1e9, "call_us": call * 1e6}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
