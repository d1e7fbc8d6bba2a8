"""Pages written by one topology and pool layout, read by another, every
element checked against the oracle (numpy indexing of the logical page)."""

import itertools

import numpy as np
import pytest

import kvreshard as kv
import oracle as o

SPEC = dict(layers=7, kv_heads=4, head_dim=8, dtype="bf16", page=4)
# TP1/PP3 and TP2/PP2 with SGLang's splits (remainder to the last stages).
TP1PP3 = (1, 3, [2, 2, 3])
TP2PP2 = (2, 2, [3, 4])
KEYS = ["a0f1", "b1e2", "c2d3"]
# The built-in part layouts (test_part_layouts checks them against the
# library's list).
PART_LAYOUTS = ("PLHD", "LPHD", "HPLD")
SLOTS = 6
FILL = 0xA5A5


def model(**kw):
    return kv.Model(**dict(SPEC, **kw))


def spec(**kw):
    s = dict(SPEC, **kw)
    return o.Spec(s["layers"], s["kv_heads"], s["head_dim"], s["dtype"], s["page"],
                  v_head_dim=s.get("v_head_dim"), mla=s.get("mla", False))


def ranks(topo, sp):
    """(placement, layers [a, b), heads [a, b)) of every rank of a topology."""
    tp, pp, split = topo
    st = o.stages(split)
    for p, t in itertools.product(range(pp), range(tp)):
        yield (kv.Placement(tp, pp, rank=(t, p), pp_layers=split), st[p],
               o.heads_of(1 if sp.mla else sp.kv_heads, tp, t))


def write_all(url, m, sp, topo, pool_layout, part_layout, keys, slots):
    """Every rank of topo writes keys from its own pool at slots."""
    pages = {k: o.page(sp, k) for k in keys}
    statuses = []
    with kv.Store(url) as st:
        for pl, layers, heads in ranks(topo, sp):
            _, comps = o.new_pool(sp, pool_layout, SLOTS, layers[1] - layers[0], heads[1] - heads[0])
            for k, s in zip(keys, slots):
                o.fill_slot(comps, pool_layout, s, sp, pages[k], layers, heads)
            with kv.Writer(st, m, pl, kv.Pool(pool_layout, comps, SLOTS), part_layout) as w:
                statuses.append(w.write(keys, slots))
    return pages, statuses


def read_all(url, m, sp, topo, pool_layout, keys, slots, pages):
    """Every rank of topo reads keys into its own pool and checks each
    element; slots not read must stay untouched."""
    with kv.Store(url) as st:
        for pl, layers, heads in ranks(topo, sp):
            _, comps = o.new_pool(sp, pool_layout, SLOTS, layers[1] - layers[0], heads[1] - heads[0],
                                  fill=FILL & np.iinfo(sp.uint).max)
            with kv.Reader(st, m, pl, kv.Pool(pool_layout, comps, SLOTS)) as r:
                assert r.exists(keys) == len(keys)
                res = r.read(keys, slots)
                assert (res.hit, res.stop, res.message) == (len(keys), kv.Stop.NONE, "")
                share = sum(c[:, layers[0]:layers[1], heads[0]:heads[1]].nbytes for c in pages[keys[0]])
                assert res.bytes == share * len(keys)
                assert res.ops > 0
            for k, s in zip(keys, slots):
                o.check_slot(comps, pool_layout, s, sp, pages[k], layers, heads,
                             "%r rank %r" % (pool_layout, pl.rank))
            o.check_untouched(comps, pool_layout, sorted(set(range(SLOTS)) - set(slots)), sp,
                              FILL & np.iinfo(sp.uint).max)


@pytest.mark.parametrize("direction", ["tp1pp3-to-tp2pp2", "tp2pp2-to-tp1pp3"])
@pytest.mark.parametrize("part_layout", PART_LAYOUTS)
@pytest.mark.parametrize("read_layout", o.LAYOUTS)
def test_reshard(tmp_path, direction, part_layout, read_layout):
    src, dst = (TP1PP3, TP2PP2) if direction.startswith("tp1") else (TP2PP2, TP1PP3)
    # the writers' pool layout differs from the readers' in every case
    write_layout = o.LAYOUTS[(o.LAYOUTS.index(read_layout) + 1 + PART_LAYOUTS.index(part_layout)) % 4]
    if write_layout == read_layout:
        write_layout = o.LAYOUTS[(o.LAYOUTS.index(read_layout) + 1) % 4]
    url = "file://" + str(tmp_path / "store")
    m, sp = model(), spec()
    pages, statuses = write_all(url, m, sp, src, write_layout, part_layout, KEYS, [5, 0, 3])
    assert statuses == [[kv.WriteStatus.WRITTEN] * 3] * (src[0] * src[1])
    read_all(url, m, sp, dst, read_layout, KEYS, [1, 4, 2], pages)


def test_part_layouts():
    """The built-in layouts these tests move pages through are the library's."""
    ls = kv.layouts()
    assert tuple(l for l in ls if l.kind == "part")[:3] == PART_LAYOUTS
    assert sorted(l for l in ls if l.kind == "pool")[:4] == sorted(o.LAYOUTS)


def test_write_again_is_complete(tmp_path):
    url = "file://" + str(tmp_path)
    m, sp = model(), spec()
    write_all(url, m, sp, TP1PP3, "page_first", "PLHD", KEYS, [0, 1, 2])
    # another layout writing the same pages keeps the stored ones
    pages, statuses = write_all(url, m, sp, TP2PP2, "page_head", "HPLD", KEYS, [3, 4, 5])
    assert statuses == [[kv.WriteStatus.COMPLETE] * 3] * 4
    read_all(url, m, sp, TP2PP2, "layer_first", KEYS, [0, 1, 2], pages)


def test_mla(tmp_path):
    """One latent, replicated on every TP rank: TP2/PP1 writers (rank 1 a
    replica), TP1/PP3 readers."""
    url = "file://" + str(tmp_path)
    kw = dict(layers=5, kv_heads=1, head_dim=12, dtype="fp16", page=4, mla=True)
    m, sp = kv.Model(**kw), o.Spec(5, 1, 12, "fp16", 4, mla=True)
    for i, (wl, rl) in enumerate((("page_first", "layer_first"), ("layer_first", "page_first_direct"),
                                  ("page_first_direct", "page_first"))):
        keys = [k + "-%d" % i for k in KEYS]
        pages, statuses = write_all(url, m, sp, (2, 1, [5]), wl, None, keys, [0, 1, 2])
        assert statuses == [[kv.WriteStatus.WRITTEN] * 3, [kv.WriteStatus.REPLICA] * 3]
        read_all(url, m, sp, (1, 3, [1, 2, 2]), rl, keys, [2, 0, 5], pages)


def test_v_head_dim(tmp_path):
    """K and V heads of different sizes: separate K and V regions."""
    url = "file://" + str(tmp_path)
    m, sp = model(v_head_dim=4, dtype="fp32"), spec(v_head_dim=4, dtype="fp32")
    pages, _ = write_all(url, m, sp, TP1PP3, "page_first_direct", "LPHD", KEYS, [0, 1, 2])
    read_all(url, m, sp, TP2PP2, "page_head", KEYS, [3, 4, 5], pages)


def test_mem_store_and_fp8(tmp_path):
    m, sp = model(dtype="fp8"), spec(dtype="fp8")
    pages, _ = write_all("mem://fp8", m, sp, TP2PP2, "layer_first", "PLHD", KEYS, [0, 1, 2])
    read_all("mem://fp8", m, sp, TP1PP3, "page_first", KEYS, [2, 1, 0], pages)


def test_misses_are_results(tmp_path):
    url = "file://" + str(tmp_path)
    m, sp = model(), spec()
    write_all(url, m, sp, TP1PP3, "page_first", None, KEYS[:2], [0, 1])
    with kv.Store(url) as st:
        pl, layers, heads = next(ranks(TP2PP2, sp))
        _, comps = o.new_pool(sp, "page_first", SLOTS, 3, 2)
        with kv.Reader(st, m, pl, kv.Pool("page_first", comps, SLOTS)) as r:
            assert r.exists(KEYS) == 2
            assert r.exists(["zz"] + KEYS) == 0
            assert r.exists([]) == 0
            res = r.read(KEYS, [0, 1, 2])
            assert (res.hit, res.stop) == (2, kv.Stop.MISS)
            assert res.message != ""
            res = r.read([], [])
            assert res == kv.ReadResult(0, 0, 0, kv.Stop.NONE, "")
            s = r.stats()
            assert (s.requests, s.pages, s.hits, s.misses) == (2, 3, 2, 1)


def test_other_model_domain_misses(tmp_path):
    """Another dtype, name or namespace never shares pages."""
    url = "file://" + str(tmp_path)
    m, sp = model(), spec()
    write_all(url, m, sp, TP1PP3, "page_first", None, KEYS, [0, 1, 2])
    others = [model(dtype="fp16"), model(name="other"), model(namespace="tenant-b"),
              model(revision="1"), model(fingerprint="rope=2")]
    domains = {m.domain()} | {x.domain() for x in others}
    assert len(domains) == 6
    with kv.Store(url) as st:
        for x in others:
            _, comps = o.new_pool(sp, "page_first", SLOTS, 7, 4)
            with kv.Reader(st, x, kv.Placement(1, 1), kv.Pool("page_first", comps, SLOTS)) as r:
                assert r.exists(KEYS) == 0, x


def test_domain_matches_command_defaults():
    m = model()
    assert (m.name, m.revision, m.namespace, m.fingerprint) == ("model", "0", "kvreshard", "")
    d = m.domain()
    assert len(d) == 64 and int(d, 16) >= 0
    assert model(name="model").domain() == d
