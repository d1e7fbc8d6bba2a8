"""Reader(..., copy_workers=, max_pages=, max_bytes=): kvr_reader_set_options."""

import threading

import pytest

import kvreshard as kv
import oracle as o

M = dict(layers=4, kv_heads=2, head_dim=4, dtype="fp32", page=2)
SP = o.Spec(4, 2, 4, "fp32", 2)
PAGE_BYTES = 2 * 4 * 2 * 4 * 4 * 2  # tokens x layers x heads x dim x 4 bytes, K and V


def write_pages(url, spec, m, keys):
    pages = {k: o.page(spec, k) for k in keys}
    _, comps = o.new_pool(spec, "page_first", len(keys), spec.layers, spec.kv_heads)
    for i, k in enumerate(keys):
        o.fill_slot(comps, "page_first", i, spec, pages[k], (0, spec.layers), (0, spec.kv_heads))
    with kv.Store(url) as st, kv.Writer(st, m, kv.Placement(1, 1), kv.Pool("page_first", comps, len(keys))) as w:
        assert w.write(keys, range(len(keys))) == [kv.WriteStatus.WRITTEN] * len(keys)
    return pages


def test_budget_in_pages_and_bytes(tmp_path):
    url = "file://" + str(tmp_path)
    keys = ["b%d" % i for i in range(5)]
    m = kv.Model(**M)
    pages = write_pages(url, SP, m, keys)
    slots = [4, 3, 2, 1, 0]
    with kv.Store(url) as st:
        for kw, hit, msg in (
                (dict(max_pages=2), 2, "prefetch budget reached: 2 pages"),
                (dict(max_bytes=3 * PAGE_BYTES + 1), 3, "prefetch budget reached: %d bytes" % (3 * PAGE_BYTES + 1)),
                (dict(max_pages=4, max_bytes=10 * PAGE_BYTES, copy_workers=1), 4, "prefetch budget reached: 4 pages"),
                (dict(max_pages=None, max_bytes=None, copy_workers=None), 5, ""),
                (dict(copy_workers=3), 5, "")):
            fill = 7
            _, comps = o.new_pool(SP, "page_first", 5, 4, 2, fill=fill)
            with kv.Reader(st, m, kv.Placement(1, 1), kv.Pool("page_first", comps, 5), **kw) as r:
                res = r.read(keys, slots)
                assert (res.hit, res.bytes, res.message) == (hit, hit * PAGE_BYTES, msg), kw
                assert res.stop == (kv.Stop.BUDGET if hit < 5 else kv.Stop.NONE), kw
                s = r.stats()
                assert (s.requests, s.hits, s.misses) == (1, hit, 5 - hit), kw
            for k, s in zip(keys[:hit], slots):
                o.check_slot(comps, "page_first", s, SP, pages[k], (0, 4), (0, 2), str(kw))
            o.check_untouched(comps, "page_first", slots[hit:], SP, fill, str(kw))


def test_bad_options(tmp_path):
    url = "file://" + str(tmp_path)
    _, comps = o.new_pool(SP, "page_first", 2, 4, 2)
    pool = kv.Pool("page_first", comps, 2)
    with kv.Store(url) as st:
        for kw, err, msg in (
                (dict(copy_workers=-1), kv.InvalidArgument, "copy_workers is -1; want 0 (GOMAXPROCS) to 1024"),
                (dict(copy_workers=1025), kv.InvalidArgument, "copy_workers is 1025; want 0 (GOMAXPROCS) to 1024"),
                (dict(copy_workers=1 << 31), kv.InvalidArgument, "kvreshard: copy_workers=2147483648 is out of range"),
                (dict(max_pages=-3), kv.InvalidArgument, "max_pages is -3; want 0 (no limit) or more"),
                (dict(max_bytes=-1), kv.InvalidArgument, "max_bytes is -1; want 0 (no limit) or more"),
                (dict(max_bytes=1 << 63), kv.InvalidArgument, "kvreshard: max_bytes=9223372036854775808 is out of range"),
                (dict(max_pages="2"), TypeError, "kvreshard: max_pages must be an int or None, not str"),
                (dict(copy_workers=True), TypeError, "kvreshard: copy_workers must be an int or None, not bool")):
            with pytest.raises(err) as e:
                kv.Reader(st, kv.Model(**M), kv.Placement(1, 1), pool, **kw)
            assert str(e.value) == msg, kw
        assert issubclass(kv.InvalidArgument, ValueError)


def test_big_reads_from_threads_on_two_copy_workers(tmp_path):
    """Pages of 512 KiB read by two Python threads at once, 2 pages (1 MiB)
    a read, on two copy workers: reads the library runs on a thread of
    its own while the calling thread waits. Every element is checked."""
    url = "file://" + str(tmp_path)
    spec = o.Spec(4, 2, 128, "fp32", 64)
    m = kv.Model(layers=4, kv_heads=2, head_dim=128, dtype="fp32", page=64)
    keys = ["big%d" % i for i in range(4)]
    pages = write_pages(url, spec, m, keys)
    _, comps = o.new_pool(spec, "page_first", 4, 4, 2)
    errors = []
    with kv.Store(url) as st, kv.Reader(st, m, kv.Placement(1, 1), kv.Pool("page_first", comps, 4),
                                        copy_workers=2) as r:
        def run(t):
            try:
                mine, slots = keys[2 * t:2 * t + 2], [2 * t + 1, 2 * t]
                for _ in range(3):
                    res = r.read(mine, slots)
                    assert (res.hit, res.stop, res.bytes) == (2, kv.Stop.NONE, 1 << 20), res
                    for k, s in zip(mine, slots):
                        o.check_slot(comps, "page_first", s, spec, pages[k], (0, 4), (0, 2), "thread %d" % t)
            except BaseException as e:  # noqa: B902
                errors.append(e)
        ts = [threading.Thread(target=run, args=(t,)) for t in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert errors == []
        s = r.stats()
        assert (s.requests, s.hits, s.misses, s.bytes) == (6, 12, 0, 6 << 20)
