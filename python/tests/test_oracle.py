"""The oracle's pool views against the axis orders of the built-in pool
layouts (C outermost): element (slot, token, layer, head, element) of a
component sits at the dense offset its order gives."""

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
