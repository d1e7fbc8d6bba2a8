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
"""

import argparse
import json
import mmap
import sys
import time

import kvreshard as kv

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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m kvreshard.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the store holding the pages")
    ap.add_argument("--pages", type=int, default=64, help="pages to read (default 64)")
    ap.add_argument("--repeat", type=int, default=5, help="timed reads; the best is reported (default 5)")
    ap.add_argument("--calls", type=int, default=100000, help="empty calls per timing of call_us")
    ap.add_argument("--name", default="bench-70b", help="the model name (default bench-70b)")
    ap.add_argument("--write", action="store_true", help="write the pages first")
    a = ap.parse_args(argv)
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
