"""Inputs of issue 18: set_max_procs' bound, keys with a NUL byte, and keys
and slots as any iterable."""

import array
import ctypes
import os

import numpy as np
import pytest

import kvreshard as kv
import oracle as o
from kvreshard import _args, _lib

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
    err = _lib.errbuf()
    try:
        assert f(1025, ctypes.byref(out), err, _lib.ERRLEN) == _lib.EINVAL
        assert err.value == b"n is 1025; the cap is at most 1024 (KVR_MAX_PROCS, or the CPUs when more)"
        assert out.value == -7
        assert kv.set_max_procs(0) == before
        assert f(1024, ctypes.byref(out), err, _lib.ERRLEN) == _lib.OK and out.value == before
    finally:
        kv.set_max_procs(before)


# keys with a NUL byte


def test_nul_keys_are_refused():
    p, comps = pool()
    fill(comps, ["k0", "k1"])
    with kv.Store("mem://inputs-nul") as st:
        with kv.Writer(st, model(), kv.Placement(1, 1), p) as w:
            for keys, i in ((["k0", "k\0"], 1), (["\0", "k1"], 0), (iter(["k0", "k1", "a\0b"]), 2),
                            (["k0", "a_b\0"], 1)):
                with pytest.raises(ValueError) as e:
                    w.write(keys, [0, 1, 2][:3 if i == 2 else 2])
                assert type(e.value) is kv.InvalidArgument and e.value.code == _lib.EINVAL
                assert str(e.value) == "kvreshard: key %d contains a NUL byte" % i
            assert w.stats().requests == 0 and w.stats().pages == 0
            assert w.write(["k0", "k1"], [0, 1]) == [kv.WriteStatus.WRITTEN] * 2
        with kv.Reader(st, model(), kv.Placement(1, 1), pool()[0]) as r:
            with pytest.raises(kv.InvalidArgument, match="^kvreshard: key 1 contains a NUL byte$"):
                r.exists(["k0", "k1\0"])
            with pytest.raises(kv.InvalidArgument, match="^kvreshard: key 2 contains a NUL byte$"):
                r.read(("k0", "k1", "\0"), [0, 1, 2])
            assert r.stats().requests == 0
            # '_' is the library's to refuse, as before
            with pytest.raises(kv.InvalidArgument) as e:
                r.exists(["k0", "a_b"])
            assert str(e.value) == "key 1 \"a_b\" contains '_'; a key is the page's hash, without '_'"
            assert r.exists(["k0", "k1"]) == 2


def test_c_refuses_nul_keys():
    """The library's own check, for C callers: keys packed by hand."""
    p, comps = pool()
    fill(comps, ["a", "d"])
    kb = b"ab\0cd"
    off = array.array("q", [0, 1, 4, 5])
    slots = array.array("q", [0, 1, 2])
    err = _lib.errbuf()
    with kv.Store("mem://inputs-cnul") as st:
        with kv.Writer(st, model(), kv.Placement(1, 1), p) as w:
            status = ctypes.create_string_buffer(b"\xee" * 3, 3)
            code = w._write(w._handle(), kb, off.buffer_info()[0], slots.buffer_info()[0], 3, status, err,
                            _lib.ERRLEN)
            assert (code, err.value) == (_lib.EINVAL, b"key 1 contains a NUL byte")
            assert status.raw == b"\xee" * 3
        with kv.Reader(st, model(), kv.Placement(1, 1), pool()[0]) as r:
            n = ctypes.c_int64(-7)
            code = r._exists(r._handle(), kb, off.buffer_info()[0], 3, ctypes.byref(n), err, _lib.ERRLEN)
            assert (code, err.value, n.value) == (_lib.EINVAL, b"key 1 contains a NUL byte", -7)
            res = _lib.sized(_lib.CReadResult, hit=-7, bytes=-7, ops=-7, stop=-7)
            code = r._read(r._handle(), kb, off.buffer_info()[0], slots.buffer_info()[0], 3, ctypes.byref(res),
                           err, _lib.ERRLEN)
            assert (code, err.value, res.hit) == (_lib.EINVAL, b"key 1 contains a NUL byte", -7)


def test_miss_messages_are_whole():
    """Keys may hold any byte but NUL and '_': a miss names the whole key."""
    with kv.Store("mem://inputs-miss") as st, kv.Reader(st, model(), kv.Placement(1, 1), pool()[0]) as r:
        domain = model().domain()
        for key in ("\x01\n\x7f", "clé\tx", "a" * 200):
            res = r.read([key], [0])
            assert (res.hit, res.stop) == (0, kv.Stop.MISS)
            assert res.message == "page missing or incomplete: kvreshard_%s_%s" % (key, domain)


# keys and slots as any iterable


def test_keys_and_slots_of_any_iterable():
    keys = ["k0", "k1", "k2"]
    p, comps = pool()
    pages = fill(comps, keys)
    with kv.Store("mem://inputs-iter") as st:
        with kv.Writer(st, model(), kv.Placement(1, 1), p) as w:
            W = kv.WriteStatus.WRITTEN
            assert w.write((k for k in keys[:1]), (s for s in [0])) == [W]
            assert w.write(Once(keys[1:2]), Once([1])) == [W]
            assert w.write(dict.fromkeys(keys[2:]).keys(), map(int, "2")) == [W]
            assert w.write(iter([]), iter([])) == []
            assert w.write(Once(keys), np.arange(3)) == [kv.WriteStatus.COMPLETE] * 3
        dst, dcomps = pool()
        with kv.Reader(st, model(), kv.Placement(1, 1), dst) as r:
            assert r.exists(k for k in keys) == 3
            assert r.exists(Once(keys)) == 3
            assert r.exists(iter(keys[:0])) == 0
            assert r.read((k for k in keys), (s for s in [2, 1, 0])).hit == 3
            for k, s in zip(keys, [2, 1, 0]):
                o.check_slot(dcomps, "page_first", s, SP, pages[k], (0, 4), (0, 2))
            assert r.read(Once(keys), Once([0, 1, 2])).hit == 3
            assert r.read(iter(keys[:2]), np.array([3, 2], dtype=np.uint8)).hit == 2
            # an object array, bytes and bytearray hold ints: those are the slots
            assert r.read(keys[:2], np.array([1, 0], dtype=object)).hit == 2
            assert r.read(keys, bytes([0, 3, 1])).hit == 3
            for k, s in zip(keys, [0, 3, 1]):
                o.check_slot(dcomps, "page_first", s, SP, pages[k], (0, 4), (0, 2))
            assert r.read(keys[:2], bytearray([2, 0])).hit == 2
            with pytest.raises(kv.InvalidArgument, match="^kvreshard: 2 keys but 3 slots$"):
                r.read((k for k in keys[:2]), (s for s in [0, 1, 2]))
            with pytest.raises(kv.InvalidArgument, match="^kvreshard: 1 keys but 8 slots$"):
                r.read(keys[:1], bytes(8))
            with pytest.raises(TypeError, match="^kvreshard: slots must be a sequence of int$"):
                r.read(keys[:1], np.array([None], dtype=object))
            with pytest.raises(kv.InvalidArgument, match="^kvreshard: slots must be one-dimensional$"):
                r.read(keys[:1], np.array(0))
            # a bool is not a slot (as it is not a count of the model's)
            for slots in ([True], (False,), iter([True])):
                with pytest.raises(TypeError, match="^kvreshard: slots must be ints, not bool$"):
                    r.read(keys[:1], slots)
            # an unsigned slot past int64 is out of range, not a negative one
            with pytest.raises(kv.InvalidArgument, match="^kvreshard: slot 18446744073709551615 is out of range$"):
                r.read(keys[:1], np.array([2**64 - 1], np.uint64))
            with pytest.raises(kv.InvalidArgument, match="^kvreshard: a slot is out of range$"):
                r.read(keys[:1], [2**64 - 1])


def test_numpy_slots_stay_arrays():
    """A numpy array of slots is converted by numpy, not element by element."""
    a = np.arange(5, dtype=np.int32)[::-1]
    addr, keep = _args.pack_slots(a, 5)
    assert isinstance(keep, np.ndarray) and keep.dtype == np.int64 and addr == keep.ctypes.data
    assert keep.tolist() == [4, 3, 2, 1, 0]
    b = np.arange(3, dtype=np.int64)
    addr, keep = _args.pack_slots(b, 3)
    assert keep is b and addr == b.ctypes.data
