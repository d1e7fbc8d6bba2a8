"""Inputs of issue 18: set_max_procs' bound, keys with a NUL byte, and keys
and slots as any iterable."""

import array
import ctypes
import os

import numpy as np
import pytest

import kvreshard as kv
import oracle as o
from kvreshard import _lib

M = dict(layers=4, kv_heads=2, head_dim=4, dtype="fp32", page=2)
SP = o.Spec(4, 2, 4, "fp32", 2)


def model():
    return kv.Model(**M)


def pool(slots=4):
    _, comps = o.new_pool(SP, "page_first", slots, 4, 2)
    return kv.Pool("page_first", comps, slots), comps


def cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def fill(comps, keys):
    """Put page keys[i] into slot i of comps; return the pages."""
    pages = {k: o.page(SP, k) for k in keys}
    for i, k in enumerate(keys):
        o.fill_slot(comps, "page_first", i, SP, pages[k], (0, 4), (0, 2))
    return pages


class Once:
    """An iterator over items that may be iterated once only."""

    def __init__(self, items):
        self.items, self.started = list(items), False

    def __iter__(self):
        assert not self.started, "iterated twice"
        self.started = True
        return iter(self.items)


# set_max_procs


def test_set_max_procs_is_bounded():
    bound = max(1024, cpus())
    prev = kv.set_max_procs(0)
    try:
        for n in (bound + 1, 100000, 10 ** 9, 2 ** 31 - 1, 10 ** 12):
            with pytest.raises(ValueError) as e:
                kv.set_max_procs(n)
            assert type(e.value) is kv.InvalidArgument and e.value.code == _lib.EINVAL
            assert str(e.value) == ("kvreshard: set_max_procs: n=%d is more than %d, the bound of GOMAXPROCS "
                                    "(1024, or the CPUs when more)" % (n, bound))
            assert kv.set_max_procs(0) == prev, n
        with pytest.raises(TypeError, match="^kvreshard: set_max_procs: n must be an int, not str$"):
            kv.set_max_procs("2")
        with pytest.raises(TypeError, match="^kvreshard: set_max_procs: n must be an int, not bool$"):
            kv.set_max_procs(True)
        assert kv.set_max_procs(np.int32(1)) == prev
        assert kv.set_max_procs(bound) == 1
        assert kv.set_max_procs(-3) == bound  # n <= 0 only reads
    finally:
        kv.set_max_procs(prev)
    assert kv.set_max_procs(0) == prev


def test_c_refuses_max_procs_past_the_bound():
    """kvr_set_max_procs itself, past the package's check: KVR_EINVAL, the
    cap unchanged, *prev not written."""
    if cpus() >= 1024:
        pytest.skip("the bound is this host's CPUs")
    f = _lib.lib().kvr_set_max_procs
    before = kv.set_max_procs(0)
    out = ctypes.c_int32(-7)
    try:
        assert f(1025, ctypes.byref(out)) == _lib.EINVAL
        assert out.value == -7
        assert kv.set_max_procs(0) == before
        assert f(1024, ctypes.byref(out)) == _lib.OK and out.value == before
    finally:
        kv.set_max_procs(before)
