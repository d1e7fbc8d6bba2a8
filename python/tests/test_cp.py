"""Context parallelism through the Python package: pages written by ranks
of one TP x PP x CP topology and interleave, read by another, in numpy
pools of SGLang's shapes whose slots hold page // cp tokens, every element
checked against the oracle (numpy indexing of the logical page and its
token sets, nothing from kvreshard)."""

import itertools

import numpy as np
import pytest

import kvreshard as kv
import oracle as o

PAGE = 16
SPEC = dict(layers=5, kv_heads=2, head_dim=4, dtype="bf16", page=PAGE)
MLA = dict(layers=3, kv_heads=1, head_dim=6, dtype="fp16", page=PAGE, mla=True)
SLOTS = 5
FILL = 0x5A5A


class Topo:
    """tp x pp x cp with a PP split and a CP interleave."""

    def __init__(self, tp, pp, split, cp=1, il=1):
        self.tp, self.pp, self.split, self.cp, self.il = tp, pp, split, cp, il

    def __repr__(self):
        return "tp%d-pp%d-cp%d-il%d" % (self.tp, self.pp, self.cp, self.il)


def spec_of(kw):
    return o.Spec(kw["layers"], kw["kv_heads"], kw["head_dim"], kw["dtype"], kw["page"], mla=kw.get("mla", False))


def ranks(topo, sp):
    """(placement, layers, heads, tokens) of every rank of a topology."""
    st = o.stages(topo.split)
    for p, c, t in itertools.product(range(topo.pp), range(topo.cp), range(topo.tp)):
        pl = kv.Placement(topo.tp, topo.pp, rank=(t, p, c), pp_layers=topo.split, cp=topo.cp,
                          cp_interleave=topo.il)
        yield pl, st[p], o.heads_of(sp.kv_heads, topo.tp, t), o.cp_tokens(sp.page, topo.cp, c, topo.il)


def write_all(url, m, sp, topo, layout, keys, slots):
    pages = {k: o.page(sp, k) for k in keys}
    statuses = []
    with kv.Store(url) as st:
        for pl, layers, heads, toks in ranks(topo, sp):
            _, comps = o.new_pool(sp, layout, SLOTS, layers[1] - layers[0], heads[1] - heads[0], tokens=toks)
            for k, s in zip(keys, slots):
                o.fill_slot(comps, layout, s, sp, pages[k], layers, heads, tokens=toks)
            with kv.Writer(st, m, pl, kv.Pool(layout, comps, SLOTS)) as w:
                statuses.append(w.write(keys, slots))
    return pages, statuses


def read_all(url, m, sp, topo, layout, keys, slots, pages):
    fill = FILL & np.iinfo(sp.uint).max
    with kv.Store(url) as st:
        for pl, layers, heads, toks in ranks(topo, sp):
            _, comps = o.new_pool(sp, layout, SLOTS, layers[1] - layers[0], heads[1] - heads[0], fill=fill,
                                  tokens=toks)
            with kv.Reader(st, m, pl, kv.Pool(layout, comps, SLOTS)) as r:
                assert r.exists(keys) == len(keys)
                res = r.read(keys, slots)
                assert (res.hit, res.stop, res.message) == (len(keys), kv.Stop.NONE, "")
                assert res.bytes == sum(c.nbytes for c in o.share(pages[keys[0]], layers, heads, toks)) * len(keys)
            what = "%s rank %r" % (layout, pl.rank)
            for k, s in zip(keys, slots):
                o.check_slot(comps, layout, s, sp, pages[k], layers, heads, what, tokens=toks)
            o.check_untouched(comps, layout, sorted(set(range(SLOTS)) - set(slots)), sp, fill, what, tokens=toks)


KEYS = ["c0ffee01", "c0ffee02", "c0ffee03"]

CASES = [
    # SGLang's DCP (interleave 1) to no context parallelism
    (SPEC, Topo(2, 1, [5], 2, 1), "page_first", Topo(1, 1, [5]), "layer_first"),
    # no CP to SGLang's DCP on 8 ranks, with PP on the writer
    (SPEC, Topo(1, 2, [2, 3]), "page_head", Topo(1, 1, [5], 8, 1), "page_first"),
    # contiguous slices (interleave page // cp) to vLLM-style runs of 2, TP and PP changing too
    (SPEC, Topo(1, 1, [5], 4, 4), "page_first_direct", Topo(2, 2, [3, 2], 2, 2), "page_head"),
    # runs of 8 (halves) to interleave 1 on 4 ranks
    (SPEC, Topo(2, 1, [5], 2, 8), "layer_first", Topo(1, 1, [5], 4, 1), "page_first_direct"),
    # MLA: the latent replicated on TP 2, CP ranks holding other tokens
    (MLA, Topo(2, 1, [3], 2, 1), "page_first", Topo(1, 1, [3], 4, 2), "layer_first"),
]


@pytest.mark.parametrize("kw,src,wl,dst,rl", CASES, ids=["%r-to-%r" % (c[1], c[3]) for c in CASES])
def test_cp_reshard(tmp_path, kw, src, wl, dst, rl):
    url = "file://" + str(tmp_path)
    m, sp = kv.Model(**kw), spec_of(kw)
    pages, statuses = write_all(url, m, sp, src, wl, KEYS, [4, 0, 2])
    replica = sp.mla and src.tp > 1
    want = [[kv.WriteStatus.REPLICA if replica and pl.rank[0] > 0 else kv.WriteStatus.WRITTEN] * 3
            for pl, *_ in ranks(src, sp)]
    assert statuses == want
    read_all(url, m, sp, dst, rl, KEYS, [1, 3, 0], pages)
    # and back: the reader's topology reads what it wrote itself
    keys = [k + "b" for k in KEYS]
    pages, _ = write_all(url, m, sp, dst, rl, keys, [2, 3, 4])
    read_all(url, m, sp, src, wl, keys, [0, 1, 2], pages)


def test_incomplete_until_every_cp_rank_wrote(tmp_path):
    """A page is complete once every CP rank's tokens are written."""
    url = "file://" + str(tmp_path)
    m, sp = kv.Model(**SPEC), spec_of(SPEC)
    src = Topo(1, 1, [5], 2, 1)
    with kv.Store(url) as st:
        pl, layers, heads, toks = next(ranks(src, sp))
        _, comps = o.new_pool(sp, "page_first", SLOTS, 5, 2, tokens=toks)
        o.fill_slot(comps, "page_first", 0, sp, o.page(sp, KEYS[0]), layers, heads, tokens=toks)
        with kv.Writer(st, m, pl, kv.Pool("page_first", comps, SLOTS)) as w:
            assert w.write(KEYS[:1], [0]) == [kv.WriteStatus.WRITTEN]
        _, rc = o.new_pool(sp, "page_first", SLOTS, 5, 2)
        with kv.Reader(st, m, kv.Placement(1, 1), kv.Pool("page_first", rc, SLOTS)) as r:
            assert r.exists(KEYS[:1]) == 0
            res = r.read(KEYS[:1], [0])
            assert (res.hit, res.stop) == (0, kv.Stop.MISS)
    write_all(url, m, sp, src, "page_first", KEYS[:1], [0])
    read_all(url, m, sp, Topo(1, 1, [5]), "page_first", KEYS[:1], [3], {KEYS[0]: o.page(sp, KEYS[0])})


def test_cp_bad_input(tmp_path):
    m, sp = kv.Model(**SPEC), spec_of(SPEC)
    _, comps = o.new_pool(sp, "page_first", SLOTS, 5, 2)  # whole pages: large enough for any CP rank
    with kv.Store("file://" + str(tmp_path)) as st:
        for pl, msg in [
            (kv.Placement(1, 1, cp=2, cp_interleave=3), "placement: cp interleave 3 does not divide the page's 16 tokens"),
            (kv.Placement(1, 1, cp=32), "placement: cp 32 is more than the page's 16 tokens"),
            (kv.Placement(1, 1, rank=(0, 0, 2), cp=2), "placement: rank tp 0 pp 0 cp 2 is outside tp 1 x pp 1 x cp 2"),
            (kv.Placement(2, 1, rank=(1, 0, 1)), "placement: rank tp 1 pp 0 cp 1 is outside tp 2 x pp 1 x cp 1"),
            (kv.Placement(1, 1, cp=4, cp_interleave=8),
             "placement: cp 4 x cp interleave 8 is 32 tokens, which does not divide the page's 16 tokens"),
            (kv.Placement(1, 1, cp=-2), "placement: cp -2 is not positive"),
            (kv.Placement(1, 1, cp=2, cp_interleave=0 - 4), "placement: cp interleave -4 is not positive"),
        ]:
            for cls in (kv.Reader, kv.Writer):
                with pytest.raises(kv.InvalidArgument) as e:
                    cls(st, m, pl, kv.Pool("page_first", comps, SLOTS))
                assert str(e.value) == msg
                assert e.value.code == 1
        # a CP rank's pool needs page // cp tokens a slot: one element short is refused
        toks = o.cp_tokens(PAGE, 4, 1, 1)
        _, small = o.new_pool(sp, "page_first", SLOTS, 5, 2, tokens=toks)
        need = small[1].nbytes
        with pytest.raises(kv.InvalidArgument) as e:
            kv.Reader(st, m, kv.Placement(1, 1, rank=(0, 0, 1), cp=4),
                      kv.Pool("page_first", [small[0], small[1].reshape(-1)[:-1]], SLOTS))
        assert str(e.value) == "pool: region v has %d bytes; %d slots of layout page_first need %d" % (
            need - 2, SLOTS, need)
    with pytest.raises(TypeError, match=r"rank must be a \(tp_rank, pp_rank\) or \(tp_rank, pp_rank, cp_rank\)"):
        kv.Placement(1, 1, rank=(0, 0, 0, 0))
    with pytest.raises(kv.InvalidArgument, match="placement cp_rank=-1 is out of range"):
        kv.Placement(1, 1, rank=(0, 0, -1), cp=2)


def test_placement_fields():
    p = kv.Placement(2, 1, rank=(1, 0, 3), cp=4, cp_interleave=2)
    assert (p.rank, p.cp_rank, p.cp, p.cp_interleave) == ((1, 0, 3), 3, 4, 2)
    assert (p._c.cp, p._c.cp_rank, p._c.cp_interleave) == (4, 3, 2)
    assert repr(p) == "Placement(tp=2, pp=1, rank=(1, 0, 3), cp=4, cp_interleave=2)"
    q = kv.Placement(2, 2, rank=(1, 1))
    assert (q.rank, q.cp_rank, q.cp, q.cp_interleave) == ((1, 1), 0, 1, 1)
    assert repr(q) == "Placement(tp=2, pp=2, rank=(1, 1))"
