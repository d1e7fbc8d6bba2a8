"""The oracle's pool views against the axis orders of DESIGN.md (pool
layouts, C outermost): element (slot, token, layer, head, element) of a
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
