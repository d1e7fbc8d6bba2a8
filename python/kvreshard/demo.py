"""python -m kvreshard demo: pages written by one topology, read by another,
every byte verified, on any store the package opens.

    python -m kvreshard demo --store mooncake://10.0.0.5:50051?protocol=tcp
    python -m kvreshard demo --store redis://127.0.0.1:6379 --pages 32
    python -m kvreshard demo                 # a file store in a temporary directory

Writer ranks (TP1/PP3 by default), one process each, started together,
write --pages pages in each part layout (PLHD, LPHD, HPLD), each from a pool
of the first layout that stores it that way by default (page_first,
page_first_direct, page_head: the library's kvreshard.layouts() says),
and exit. Then reader ranks (TP2/PP2 by default), one process
each, read every page of every part layout into a pool of each of the four
layouts (layer_first, page_first, page_first_direct, page_head), and check
every element of every page against an oracle that knows nothing of
kvreshard: each page is random bits drawn from its key, and a rank's share
of it is numpy indexing of that logical [token, layer, head, element] array
into SGLang's host pool shapes. It prints a line for each part layout and
reader pool layout (pages, bytes, store reads, time, GB/s, verified), and
exits 1 when any page was not read or any byte differs (2 for bad
arguments).

For mooncake:// the store is the user's: the demo starts no master and no
memory holder; its ranks contribute no memory unless the URL's segment says
so. Pages already in the store (a second run) are kept and read again:
their bytes are the same.

Needs numpy.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# The pool layouts the oracle knows: SGLang's host pools, whose numpy
# shapes it builds itself (comp_shape); the part layouts and which pool
# writes each are the library's (kvreshard.layouts()).
POOL_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
ITEM = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Spec:
    """The demo's model, as the oracle and kvreshard.Model see it."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, v_head_dim: int, dtype: str, page: int,
                 name: str) -> None:
        self.layers, self.kv_heads, self.page, self.dtype, self.name = layers, kv_heads, page, dtype, name
        self.head_dim, self.v_head_dim = head_dim, v_head_dim
        self.dims = [head_dim, v_head_dim or head_dim]

    @classmethod
    def of(cls, d: Dict[str, Any]) -> "Spec":
        return cls(d["layers"], d["kv_heads"], d["head_dim"], d["v_head_dim"], d["dtype"], d["page"], d["name"])

    def dict(self) -> Dict[str, Any]:
        return dict(layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim, v_head_dim=self.v_head_dim,
                    dtype=self.dtype, page=self.page, name=self.name)

    def model(self) -> Any:
        import kvreshard as kv
        return kv.Model(layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim,
                        v_head_dim=self.v_head_dim or None, dtype=self.dtype, page=self.page, name=self.name)

    def uint(self) -> Any:
        import numpy as np
        return {1: np.uint8, 2: np.uint16, 4: np.uint32}[ITEM[self.dtype]]

    def page_bytes(self) -> int:
        return self.page * self.layers * self.kv_heads * sum(self.dims) * ITEM[self.dtype]


def split(layers: int, pp: int) -> List[int]:
    """Layers of each PP stage: the even split, the remainder to the first stages."""
    return [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]


def stage(layers: int, pp: int, p: int) -> Tuple[int, int]:
    sp = split(layers, pp)
    a = sum(sp[:p])
    return a, a + sp[p]


def heads_of(kv_heads: int, tp: int, t: int) -> Tuple[int, int]:
    """[start, end) of the KV heads of TP rank t (one replicated head when tp > kv_heads)."""
    if tp <= kv_heads:
        per = kv_heads // tp
        return t * per, (t + 1) * per
    h = t // (tp // kv_heads)
    return h, h + 1


# ---------------------------------------------------------------------------
# The oracle: numpy only, nothing of kvreshard.

def logical_page(spec: Spec, key: str) -> List[Any]:
    """Page `key`: one [token, layer, head, element] array a component (K, V),
    random bits seeded by the key."""
    import numpy as np
    seed = int.from_bytes(hashlib.sha256(("kvreshard-demo/" + key).encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    u = spec.uint()
    return [rng.integers(0, np.iinfo(u).max, size=(spec.page, spec.layers, spec.kv_heads, d), dtype=u, endpoint=True)
            for d in spec.dims]


def comp_shape(layout: str, slots: int, page: int, layers: int, heads: int, dim: int) -> Tuple[int, ...]:
    """One component's buffer in SGLang's host pool layouts."""
    size = slots * page
    return {"layer_first": (layers, size, heads, dim), "page_first": (size, layers, heads, dim),
            "page_first_direct": (slots, layers, page, heads, dim),
            "page_head": (slots, heads, page, layers, dim)}[layout]


def slot_view(comp: Any, layout: str, slot: int, page: int) -> Any:
    """Slot `slot` of a component buffer as a [token, layer, head, element] view."""
    if layout == "layer_first":
        L, size, H, D = comp.shape
        return comp.reshape(L, size // page, page, H, D)[:, slot].transpose(1, 0, 2, 3)
    if layout == "page_first":
        size, L, H, D = comp.shape
        return comp.reshape(size // page, page, L, H, D)[slot]
    if layout == "page_first_direct":
        return comp[slot].transpose(1, 0, 2, 3)
    return comp[slot].transpose(1, 2, 0, 3)  # page_head


def new_pool(spec: Spec, layout: str, slots: int, layers: int, heads: int, fill: int = 0) -> List[Any]:
    import numpy as np
    return [np.full(comp_shape(layout, slots, spec.page, layers, heads, d), fill, spec.uint()) for d in spec.dims]


def share(pg: Sequence[Any], layers: Tuple[int, int], heads: Tuple[int, int]) -> List[Any]:
    (l0, l1), (h0, h1) = layers, heads
    return [c[:, l0:l1, h0:h1, :] for c in pg]


# ---------------------------------------------------------------------------
# A rank process

def keys_of(part: str, pages: int) -> List[str]:
    return ["demo-%s-%d" % (part, i) for i in range(pages)]


def rank_main(a: Dict[str, Any]) -> int:
    """One writer or reader rank; prints one JSON line."""
    import numpy as np
    import kvreshard as kv
    spec = Spec.of(a["spec"])
    tp, pp = a["topology"]
    t, p = a["rank"]
    layers, heads = stage(spec.layers, pp, p), heads_of(spec.kv_heads, tp, t)
    nl, nh = layers[1] - layers[0], heads[1] - heads[0]
    place = kv.Placement(tp, pp, rank=(t, p), pp_layers=split(spec.layers, pp))
    m = spec.model()
    n = a["pages"]
    out: Dict[str, Any] = {"rank": [t, p], "pid": os.getpid(), "parts": {}}
    with kv.Store(a["url"]) as st:
        if a["role"] == "write":
            for part in a["parts"]:
                layout = a["writer_pools"][part]
                keys = keys_of(part, n)
                comps = new_pool(spec, layout, n, nl, nh)
                for s, k in enumerate(keys):
                    for c, want in zip(comps, share(logical_page(spec, k), layers, heads)):
                        slot_view(c, layout, s, spec.page)[...] = want
                with kv.Writer(st, m, place, kv.Pool(layout, comps, n), part) as w:
                    start = time.perf_counter()
                    statuses = w.write(keys, range(n))
                    secs = time.perf_counter() - start
                    stats = w.stats()
                counts: Dict[str, int] = {}
                for s in statuses:
                    counts[s.name] = counts.get(s.name, 0) + 1
                out["parts"][part] = {"pool": layout, "statuses": counts, "seconds": secs, "bytes": stats.bytes}
        else:
            pages = {part: [share(logical_page(spec, k), layers, heads) for k in keys_of(part, n)]
                     for part in a["parts"]}
            for layout in a["pools"]:
                fill = 0x5A & int(np.iinfo(spec.uint()).max)
                comps = new_pool(spec, layout, n, nl, nh, fill)
                slots = list(range(n - 1, -1, -1))  # pages land in reverse slot order
                with kv.Reader(st, m, place, kv.Pool(layout, comps, n)) as r:
                    for part in a["parts"]:
                        for c in comps:
                            c.fill(fill)
                        start = time.perf_counter()
                        res = r.read(keys_of(part, n), slots)
                        secs = time.perf_counter() - start
                        bad = []
                        for i in range(res.hit):
                            for ci, (c, want) in enumerate(zip(comps, pages[part][i])):
                                got = slot_view(c, layout, slots[i], spec.page)
                                if not np.array_equal(got, want):
                                    diff = int(np.count_nonzero(got != want))
                                    bad.append("page %d component %d: %d of %d elements differ" % (
                                        i, ci, diff, want.size))
                        out["parts"].setdefault(part, {})[layout] = {
                            "hit": res.hit, "bytes": res.bytes, "ops": res.ops, "seconds": secs,
                            "stop": res.stop.name, "message": res.message, "mismatches": bad}
    print(json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------------------
# The driver

def topology(s: str) -> Tuple[int, int]:
    """"TP1/PP3" (or "1x3") as (tp, pp)."""
    t = s.upper().replace(" ", "")
    try:
        if "/" in t:
            a, b = t.split("/")
            if not (a.startswith("TP") and b.startswith("PP")):
                raise ValueError
            tp, pp = int(a[2:]), int(b[2:])
        else:
            tp, pp = (int(x) for x in t.split("X"))
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a topology such as TP2/PP2 or 2x2" % s) from None
    if tp < 1 or pp < 1 or tp * pp > 64:
        raise argparse.ArgumentTypeError("topology %s: TP and PP must be at least 1, and at most 64 ranks" % s)
    return tp, pp


def part_layouts() -> Dict[str, str]:
    """{part layout: the pool layout its writers hold pages in}: every part
    layout the library knows that a pool layout of POOL_LAYOUTS writes by
    default (the first such pool), in the library's order."""
    import kvreshard as kv
    ls = kv.layouts()
    out = {}
    for part in ls:
        if part.kind == "part":
            pool = next((p.name for p in ls if p.kind == "pool" and p.writes == part.name and p.name in POOL_LAYOUTS),
                        None)
            if pool is not None:
                out[part.name] = pool
    return out


def names(allowed: Sequence[str]) -> Callable[[str], List[str]]:
    def parse(s: str) -> List[str]:
        out = [x.strip() for x in s.split(",") if x.strip()]
        for x in out:
            if x not in allowed:
                raise argparse.ArgumentTypeError("%r is not one of %s" % (x, ", ".join(allowed)))
        if not out:
            raise argparse.ArgumentTypeError("need at least one of %s" % ", ".join(allowed))
        return out
    return parse


def topo_name(tp: int, pp: int) -> str:
    return "TP%d/PP%d" % (tp, pp)


def spawn(a: Dict[str, Any], timeout: int) -> "subprocess.Popen[str]":
    """Start a rank process; its environment runs this package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.Popen([sys.executable, "-m", "kvreshard.demo", "--rank", json.dumps(a)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def run_ranks(role: str, args: argparse.Namespace, spec: Spec, url: str, tp: int, pp: int, extra: Dict[str, Any],
              timeout: int) -> Tuple[Dict[Tuple[int, int], Dict[str, Any]], List[str]]:
    """Run every rank of tp x pp as its own process, together; their answers
    by rank, after all exited."""
    procs = []
    for p in range(pp):
        for t in range(tp):
            a = dict(role=role, url=url, spec=spec.dict(), topology=[tp, pp], rank=[t, p], pages=args.pages, **extra)
            procs.append(((t, p), spawn(a, timeout)))
    outs, errors = {}, []
    end = time.monotonic() + timeout
    for rank, pr in procs:
        try:
            so, se = pr.communicate(timeout=max(1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for _, q in procs:
                q.kill()
            so, se = pr.communicate()
            errors.append("%s rank %s: no answer within %ds" % (role, rank, timeout))
            continue
        line = so.strip().splitlines()[-1] if so.strip() else ""
        if pr.returncode != 0 or not line.startswith("{"):
            errors.append("%s rank %s: exit %d\n%s" % (role, rank, pr.returncode, (se.strip() or so.strip())[-2000:]))
            continue
        outs[rank] = json.loads(line)
    if len({o["pid"] for o in outs.values()}) != len(outs):
        errors.append("%s ranks: two ranks ran in one process" % role)
    return outs, errors


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvreshard demo", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="", help="store URL: file:///dir, redis://host:port, mooncake://host:port?... "
                    "(default: a file store in a new temporary directory)")
    ap.add_argument("--pages", type=int, default=16, help="pages per part layout (default 16)")
    ap.add_argument("--writers", type=topology, default=(1, 3), help="writer topology (default TP1/PP3)")
    ap.add_argument("--readers", type=topology, default=(2, 2), help="reader topology (default TP2/PP2)")
    ap.add_argument("--parts", help="part layouts written, comma-separated (default: every one the library knows "
                    "that a pool layout of the oracle's writes: PLHD,LPHD,HPLD)")
    ap.add_argument("--pools", type=names(POOL_LAYOUTS), default=list(POOL_LAYOUTS),
                    help="reader pool layouts, comma-separated (default all four)")
    ap.add_argument("--layers", type=int, default=12, help="model layers (default 12)")
    ap.add_argument("--kv-heads", type=int, default=4, help="model KV heads (default 4)")
    ap.add_argument("--head-dim", type=int, default=64, help="elements of a K head (default 64)")
    ap.add_argument("--v-head-dim", type=int, default=32, help="elements of a V head (default 32; 0: as K)")
    ap.add_argument("--page", type=int, default=16, help="tokens per page (default 16)")
    ap.add_argument("--dtype", choices=sorted(ITEM), default="bf16", help="element type (default bf16)")
    ap.add_argument("--name", default="demo", help="model name (default demo): another name, other pages")
    ap.add_argument("--timeout", type=int, default=600, help="seconds the ranks of each side may take (default 600)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank is not None:
        return rank_main(json.loads(a.rank))
    for what, v, lo in (("--pages", a.pages, 1), ("--layers", a.layers, 1), ("--kv-heads", a.kv_heads, 1),
                        ("--head-dim", a.head_dim, 1), ("--v-head-dim", a.v_head_dim, 0), ("--page", a.page, 1),
                        ("--timeout", a.timeout, 1)):
        if v < lo:
            ap.error("%s %d: must be at least %d" % (what, v, lo))
    for (tp, pp), what in ((a.writers, "--writers"), (a.readers, "--readers")):
        if pp > a.layers:
            ap.error("%s %s: PP %d is more than the %d layers" % (what, topo_name(tp, pp), pp, a.layers))
        if tp <= a.kv_heads and a.kv_heads % tp or tp > a.kv_heads and tp % a.kv_heads:
            ap.error("%s %s: TP %d does not divide the %d KV heads (nor they it)" % (what, topo_name(tp, pp), tp,
                                                                                 a.kv_heads))
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("kvreshard demo: needs numpy (pip install numpy)", file=sys.stderr)
        return 2
    import kvreshard as kv
    try:
        a.writer_pools = part_layouts()
    except kv.KvreshardError as e:
        print("kvreshard demo: %s" % e, file=sys.stderr)
        return 1
    try:
        a.parts = names(tuple(a.writer_pools))(a.parts) if a.parts is not None else list(a.writer_pools)
    except argparse.ArgumentTypeError as e:
        ap.error("argument --parts: %s" % e)
    spec = Spec(a.layers, a.kv_heads, a.head_dim, a.v_head_dim, a.dtype, a.page, a.name)
    tmp = None
    url = a.store
    if not url:
        tmp = tempfile.mkdtemp(prefix="kvreshard-demo-")
        url = "file://" + tmp
    try:
        return demo(a, spec, url)
    finally:
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)


def demo(a: argparse.Namespace, spec: Spec, url: str) -> int:
    import kvreshard as kv
    out = sys.stdout
    shown = url.split("?")[0]
    wtp, wpp = a.writers
    rtp, rpp = a.readers
    # Open the store once here, to fail early on a bad URL or a store that is down.
    try:
        with kv.Store(url):
            pass
    except (ValueError, OSError, kv.KvreshardError) as e:
        print("kvreshard demo: %s" % e, file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    if not a.json:
        print("kvreshard demo: store %s" % shown, file=out)
        print("model: %d layers, %d KV heads, K/V head dims %d/%d, %s, page %d tokens (%d bytes a page)" % (
            spec.layers, spec.kv_heads, spec.dims[0], spec.dims[1], spec.dtype, spec.page, spec.page_bytes()), file=out)
        print("writers: %s, one process a rank, %d pages in each of %s; readers: %s, one process a rank, after the "
              "writers exited\n" % (topo_name(wtp, wpp), a.pages, ", ".join(a.parts), topo_name(rtp, rpp)), file=out)
    start = time.perf_counter()
    wouts, errors = run_ranks("write", a, spec, url, wtp, wpp,
                              {"parts": a.parts, "writer_pools": {p: a.writer_pools[p] for p in a.parts}}, a.timeout)
    wall_w = time.perf_counter() - start
    start = time.perf_counter()
    routs, rerrors = ({}, []) if errors else run_ranks("read", a, spec, url, rtp, rpp,
                                                       {"parts": a.parts, "pools": a.pools}, a.timeout)
    wall_r = time.perf_counter() - start
    errors += rerrors
    rows, failed = [], 0
    writes = []
    for part in a.parts:
        st: Dict[str, int] = {}
        secs = nbytes = 0
        for o in wouts.values():
            w = o["parts"][part]
            for k, v in w["statuses"].items():
                st[k] = st.get(k, 0) + v
            secs, nbytes = max(secs, w["seconds"]), nbytes + w["bytes"]
        writes.append({"part": part, "pool": a.writer_pools[part], "statuses": st, "bytes": nbytes, "seconds": secs})
        for layout in a.pools:
            hit = nb = ops = 0
            secs = 0.0
            ok = True
            for rank, o in sorted(routs.items()):
                r = o["parts"][part][layout]
                hit, nb, ops, secs = hit + r["hit"], nb + r["bytes"], ops + r["ops"], secs + r["seconds"]
                if r["hit"] != a.pages:
                    ok = False
                    errors.append("reader rank %s, %s pages into %s: read %d of %d pages: %s %s" % (
                        list(rank), part, layout, r["hit"], a.pages, r["stop"], r["message"]))
                for msg in r["mismatches"]:
                    ok = False
                    errors.append("reader rank %s, %s pages into %s: %s" % (list(rank), part, layout, msg))
            failed += not ok
            rows.append({"writer": topo_name(wtp, wpp), "part": part, "writer_pool": a.writer_pools[part],
                         "reader": topo_name(rtp, rpp), "pool": layout, "pages": hit // max(1, len(routs)),
                         "bytes": nb, "ops": ops, "seconds": secs, "gbps": nb / secs / 1e9 if secs else 0.0,
                         "verified": ok})
    ok = not errors and failed == 0 and len(routs) == rtp * rpp
    if a.json:
        print(json.dumps({"store": shown, "writers": topo_name(wtp, wpp), "readers": topo_name(rtp, rpp),
                          "pages": a.pages, "writes": writes, "reads": rows, "write_seconds": wall_w,
                          "read_seconds": wall_r, "verified": ok, "errors": errors}), file=out)
    else:
        for w in writes:
            print("write %s from %s: %s, %d bytes, %.1f ms (slowest rank), %.2f GB/s" % (
                w["part"], w["pool"], ", ".join("%d %s" % (v, k) for k, v in sorted(w["statuses"].items())),
                w["bytes"], w["seconds"] * 1e3, w["bytes"] / w["seconds"] / 1e9 if w["seconds"] else 0), file=out)
        print("writers' processes: %.2f s from start to exit\n" % wall_w, file=out)
        head = ("writer", "part layout", "writer pool", "reader", "pool layout", "pages", "bytes", "ops", "time",
                "GB/s", "verified")
        table = [head] + [(r["writer"], r["part"], r["writer_pool"], r["reader"], r["pool"], str(r["pages"]),
                           str(r["bytes"]), str(r["ops"]), "%.2fms" % (r["seconds"] * 1e3), "%.2f" % r["gbps"],
                           "true" if r["verified"] else "false") for r in rows]
        width = [max(len(row[i]) for row in table) for i in range(len(head))]
        for row in table:
            print("  ".join(c.rjust(w) for c, w in zip(row, width)), file=out)
        print("\nreaders' processes: %.2f s from start to exit; time is the reads' (summed over the ranks), ops "
              "are store reads" % wall_r, file=out)
        for e in errors:
            print("kvreshard demo: " + e, file=sys.stderr)
        if ok:
            print("\nevery byte of every page verified, by every reader rank, in every pool layout.", file=out)
        else:
            print("\n%d of %d reads did not verify" % (failed, len(rows)) if failed else "\nthe demo failed",
                  file=out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
