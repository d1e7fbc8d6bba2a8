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
  arguments ready (the empty read without the package's Python) and n
  calls of the library's cheapest function (kvr_set_max_procs(0)); one
  line a round, ``{"round": i, "us": mean µs of an empty read, "raw_us":
  of the ready call, "floor_us": of the cheapest call}``.
- ``{"op": "digest"}``: ``{"sha256": [hex of K, hex of V]}`` of the pool.

At end of input it closes everything and exits 0. A bad command or a
failure answers ``{"error": "..."}`` and exits 1.
"""

import argparse
import array
import ctypes
import hashlib
import json
import mmap
import sys
import time

import kvreshard as kv
from kvreshard import _lib

LAYERS, HEADS, DIM, PAGE = 80, 8, 128, 64


def model(name):
    return kv.Model(layers=LAYERS, kv_heads=HEADS, head_dim=DIM, dtype="bf16", page=PAGE, name=name)


def keys(n):
    return ["%016x" % ((i * 0x9e3779b97f4a7c15) & (1 << 64) - 1) for i in range(n)]


def write(st, m, ks):
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


def reshard_pool(slots):
    """The pool of rank 0/0 of TP 4 x PP 2 (layers 0-39, heads 0-1) in
    page_first: numpy arrays of SGLang's shape [tokens, layers, heads,
    dim] over page-aligned anonymous memory, as Go's large allocations
    are; and the memory."""
    import numpy as np
    n = slots * PAGE * (LAYERS // 2) * (HEADS // 4) * DIM * 2
    mem = [mmap.mmap(-1, n), mmap.mmap(-1, n)]
    arrays = [np.frombuffer(m, np.uint16).reshape(slots * PAGE, LAYERS // 2, HEADS // 4, DIM) for m in mem]
    return kv.Pool("page_first", arrays, slots), mem


class _Server:
    """The --serve mode: one command a line, JSON lines out."""

    def __init__(self, out):
        self.out = out
        self.store = self.reader = None

    def say(self, obj):
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def open(self, c):
        if self.reader is not None:
            raise ValueError("open: already open")
        keys, slots = c.get("keys"), c.get("slots")
        if not isinstance(keys, list) or not keys or not isinstance(slots, list) or len(slots) != len(keys):
            raise ValueError("open: keys must be a non-empty list and slots a list as long")
        m = model(c.get("name", "bench-70b"))
        if c.get("domain") is not None and m.domain() != c["domain"]:
            raise ValueError("open: model domain %s, not the caller's %s" % (m.domain(), c["domain"]))
        self.keys, self.slots = keys, slots
        self.pool, self.mem = reshard_pool(len(keys))
        self.store = kv.Store(c["url"])
        self.reader = kv.Reader(self.store, m, kv.Placement(4, 2, rank=(0, 0), pp_layers=[40, 40]), self.pool)
        self.say({"layout": self.pool.layout, "slots": self.pool.slots, "regions": list(self.pool.sizes),
                  "domain": m.domain()})

    def opened(self, op):
        if self.reader is None:
            raise ValueError("%s: open first" % op)
        return self.reader

    def read(self, c):
        r, ks, slots = self.opened("read"), self.keys, self.slots
        for i in range(_count(c, "rounds")):
            t = time.perf_counter()
            res = r.read(ks, slots)
            d = time.perf_counter() - t
            self.say({"round": i, "seconds": d, "hit": res.hit, "bytes": res.bytes, "ops": res.ops,
                      "stop": res.stop.name, "message": res.message})

    def calls(self, c):
        r, n = self.opened("calls"), _count(c, "calls")
        read, floor, prev = r.read, _lib.lib().kvr_set_max_procs, ctypes.c_int32()
        raw, h, res, err = _lib.lib().kvr_reader_read, r._handle(), _lib.CReadResult(), _lib.errbuf()
        offs = array.array("q", [0])
        off = offs.buffer_info()[0]
        if raw(h, b"", off, None, 0, ctypes.byref(res), err, _lib.ERRLEN) != _lib.OK or res.hit != 0:
            raise RuntimeError("calls: an empty kvr_reader_read failed: %s" % err.value.decode("utf-8", "replace"))
        for i in range(_count(c, "rounds")):
            t = time.perf_counter()
            for _ in range(n):
                read([], [])
            d = time.perf_counter() - t
            p, o = ctypes.byref(prev), ctypes.byref(res)
            t = time.perf_counter()
            for _ in range(n):
                raw(h, b"", off, None, 0, o, err, _lib.ERRLEN)
            w = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(n):
                floor(0, p)
            f = time.perf_counter() - t
            self.say({"round": i, "us": d / n * 1e6, "raw_us": w / n * 1e6, "floor_us": f / n * 1e6})

    def digest(self, c):
        self.opened("digest")
        self.say({"sha256": [hashlib.sha256(m).hexdigest() for m in self.mem]})

    def close(self):
        for o in (self.reader, self.store):
            if o is not None:
                o.close()


def _count(c, field):
    v = c.get(field)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError("%s: %s must be a positive int, not %r" % (c["op"], field, v))
    return v


def serve(inp, out):
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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m kvreshard.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="the store holding the pages (required unless --serve)")
    ap.add_argument("--pages", type=int, default=64, help="pages to read (default 64)")
    ap.add_argument("--repeat", type=int, default=5, help="timed reads; the best is reported (default 5)")
    ap.add_argument("--calls", type=int, default=100000, help="empty calls per timing of call_us")
    ap.add_argument("--name", default="bench-70b", help="the model name (default bench-70b)")
    ap.add_argument("--write", action="store_true", help="write the pages first")
    ap.add_argument("--serve", action="store_true", help="read on command from stdin (see the module's doc)")
    a = ap.parse_args(argv)
    if a.serve:
        return serve(sys.stdin, sys.stdout)
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
