"""The oracle's pool views against the axis orders of the built-in pool
layouts (C outermost): element (slot, token, layer, head, element) of a
component sits at the dense offset its order gives; and the oracle of any
order (order_offsets), split axes too, against the same offsets."""

import numpy as np
import pytest

import oracle as o

ORDERS = {"page_first": "STLHD", "page_first_direct": "SLTHD", "layer_first": "LSTHD", "page_head": "SHTLD"}


@pytest.mark.parametrize("layout", o.LAYOUTS)
def test_slot_view_offsets(layout):
    S, T, L, H, D = 3, 4, 5, 2, 6
    comp = np.arange(S * T * L * H * D, dtype=np.int64).reshape(o.comp_shape(layout, S, T, L, H, D))
    ext = dict(S=S, T=T, L=L, H=H, D=D)
    for s in range(S):
        v = o.slot_view(comp, layout, s, T)
        assert v.shape == (T, L, H, D)
        for t, l, h, d in np.ndindex(T, L, H, D):
            idx = dict(S=s, T=t, L=l, H=h, D=d)
            off = 0
            for axis in ORDERS[layout]:
                off = off * ext[axis] + idx[axis]
            assert v[t, l, h, d] == off, (layout, s, t, l, h, d)


BUILTIN_ORDERS = {"page_first": "C S T L H D", "page_first_direct": "C S L T H D",
                  "layer_first": "C L S T H D", "page_head": "C S H T L D"}


@pytest.mark.parametrize("layout", o.LAYOUTS)
def test_order_oracle_is_the_named_one(layout):
    """A pool by its order is the pool by its name: the same element at
    the same offset."""
    sp = o.Spec(5, 2, 6, "fp32", 4)
    kvb, comps = o.new_pool(sp, layout, 3, 5, 2)
    regions = o.new_order_pool(sp, BUILTIN_ORDERS[layout], 3, 5, 2)
    assert [r.size for r in regions] == [c.size for c in comps]
    for s, key in enumerate(("a", "b", "c")):
        pg = o.page(sp, key)
        o.fill_slot(comps, layout, s, sp, pg, (0, 5), (0, 2))
        o.fill_order_slot(regions, BUILTIN_ORDERS[layout], s, sp, pg, (0, 5), (0, 2))
    for c, r in zip(comps, regions):
        assert np.array_equal(c.reshape(-1), r)


def test_split_order_offsets():
    """L C H D/8 T D%8: blocks of 8 elements of D outside T, the elements
    of a block inside; offsets by the formula."""
    C, L, H, T, D = 2, 3, 2, 4, 16
    off, axes = o.order_offsets("L C H D/8 T D%8", dict(C=C, L=L, H=H, T=T, D=D))
    assert axes == ["C", "T", "L", "H", "D"] and off.shape == (C, T, L, H, D)
    for c, t, l, h, d in np.ndindex(C, T, L, H, D):
        assert off[c, t, l, h, d] == ((((l * C + c) * H + h) * (D // 8) + d // 8) * T + t) * 8 + d % 8
    assert sorted(off.reshape(-1)) == list(range(C * L * H * T * D))


def test_shares():
    assert o.stages([2, 2, 3]) == [(0, 2), (2, 4), (4, 7)]
    assert [o.heads_of(4, 2, t) for t in range(2)] == [(0, 2), (2, 4)]
    assert [o.heads_of(2, 4, t) for t in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [o.heads_of(1, 2, t) for t in range(2)] == [(0, 1), (0, 1)]


def test_cp_tokens():
    """Token sets against the formula of docs/design.md, section 9: local
    token j of CP rank c is token ((j // I) * CP + c) * I + j % I."""
    assert o.cp_tokens(8, 1, 0, 1) is None
    assert list(o.cp_tokens(8, 2, 1, 1)) == [1, 3, 5, 7]
    assert list(o.cp_tokens(16, 4, 2, 2)) == [4, 5, 12, 13]
    assert list(o.cp_tokens(16, 4, 3, 4)) == [12, 13, 14, 15]
    for page, cp, il in ((16, 2, 1), (16, 4, 4), (32, 4, 2), (24, 3, 8)):
        seen = []
        for c in range(cp):
            toks = o.cp_tokens(page, cp, c, il)
            assert len(toks) == page // cp
            assert [((j // il) * cp + c) * il + j % il for j in range(page // cp)] == list(toks)
            seen += list(toks)
        assert sorted(seen) == list(range(page))
