"""KvreshardStorage's v1 interface (batch_exists, batch_get_v1,
batch_set_v1) between instances of other TP, PP and host pool layouts: hits,
misses, bad host indices, a store that fails or goes away, threads, checked
parts; and get_stats, stats and clear."""

import glob
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field

import numpy as np
import pytest

import kvreshard.sglang as ks
from kvreshard.sglang import compat
import oracle as o
from sglang_pools import indices
from sglang_instances import KEYS, LAYERS, check, close, comps, config, instance, load_backend, spec, write


@pytest.mark.parametrize("wl,rl", [("page_first", "layer_first"), ("page_first_direct", "page_head"),
                                   ("page_head", "page_first"), ("layer_first", "page_first_direct")])
def test_hits_across_topologies(tmp_path, wl, rl):
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 3, [2, 2, 3], wl)
    r = instance(url, 2, 2, [3, 4], rl)
    assert [b.batch_exists(KEYS) for b, *_ in r] == [0] * 4
    assert write(w, KEYS, [4, 0, 2], sp) == [[True] * 3] * 3
    assert [b.batch_exists(KEYS) for b, *_ in r] == [3] * 4
    assert [b.batch_get_v1(KEYS, indices([1, 5, 3])) for b, *_ in r] == [[True] * 3] * 4
    check(r, KEYS, [1, 5, 3], sp)
    # and back: the TP2/PP2 instance's pages are complete already
    assert write(r, KEYS, [1, 5, 3], sp) == [[True] * 3] * 4
    s = r[0][0].stats()
    assert s["writer"]["complete"] == 3 and s["reader"]["hits"] == 3
    close(w, r)


def test_mla(tmp_path):
    url = "file://" + str(tmp_path)
    sp = spec(mla=True)
    w = instance(url, 2, 1, [7], "page_first", mla=True)
    r = instance(url, 1, 2, [3, 4], "layer_first", mla=True)
    assert write(w, KEYS, [0, 1, 2], sp) == [[True] * 3] * 2  # TP rank 1 holds a replica
    assert w[1][0].stats()["writer"]["replica"] == 3
    assert [b.batch_get_v1(KEYS, indices([2, 0, 4])) for b, *_ in r] == [[True] * 3] * 2
    check(r, KEYS, [2, 0, 4], sp)
    close(w, r)


def test_misses(tmp_path):
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first")
    r = instance(url, 2, 1, [LAYERS], "page_head")
    write(w, [KEYS[0], KEYS[2]], [0, 1], sp)
    b = r[0][0]
    assert b.batch_exists(KEYS) == 1
    assert b.batch_get_v1(KEYS, indices([3, 4, 5])) == [True, False, False]
    assert b.batch_get_v1(["0000"], indices([0])) == [False]
    assert b.batch_get_v1([], indices([])) == []
    assert b.exists(KEYS[2]) and not b.exists(KEYS[1])
    check(r[:1], KEYS[:1], [3], sp)
    c = b.stats()
    assert (c["get_batches"], c["get_pages"], c["get_hits"], c["errors"]) == (3, 4, 1, 0)
    close(w, r)


def page_dirs(store, key):
    return glob.glob(os.path.join(store, "objects*", "*", "kvreshard_%s_*" % key))


def test_page_evicted_mid_batch(tmp_path):
    """Page 2 of a batch deleted from a file store after the reader checked
    the leading pages: the read stops at it and the pages before it are
    read. (A store may keep serving a page whose files it holds open: a
    file store's query keeps them open, so the check covers pages 0-1 only.)"""
    store = str(tmp_path / "store")
    url = "file://" + store
    sp = spec()
    keys = KEYS + ["c4ca4238a0b92382"]
    w = instance(url, 1, 1, [LAYERS], "page_first")
    assert write(w, keys, [0, 1, 2, 3], sp) == [[True] * 4]
    r = instance(url, 1, 2, [3, 4], "page_first_direct")
    assert [b.batch_exists(keys[:2]) for b, *_ in r] == [2, 2]
    dirs = page_dirs(store, keys[2])
    assert len(dirs) == 1, dirs
    shutil.rmtree(dirs[0])
    assert [b.batch_exists(keys) for b, *_ in r] == [2, 2]
    assert [b.batch_get_v1(keys, indices([5, 4, 3, 2])) for b, *_ in r] == [[True, True, False, False]] * 2
    check(r, keys, [5, 4], sp)
    # a rank that had not seen any page sees the same
    r2 = instance(url, 2, 1, [LAYERS], "layer_first")
    assert [b.batch_get_v1(keys, indices([0, 1, 2, 3])) for b, *_ in r2] == [[True, True, False, False]] * 2
    check(r2, keys, [0, 1], sp)
    assert [b.stats()["reader"]["misses"] for b, *_ in r2] == [2, 2]
    close(w, r, r2)


@pytest.mark.parametrize("numpy", [True, False])
def test_bad_indices(tmp_path, caplog, monkeypatch, numpy):
    if not numpy:  # host indices read without numpy
        monkeypatch.setattr(compat, "_np", None)
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first")
    write(w, KEYS[:2], [0, 1], sp)
    b = w[0][0]
    cases = [
        (indices([0, 1])[:-1], "7 host indices for 2 pages of 4 tokens"),
        (indices([0, 1]) + 1, "page 0 starts at host index 1, not a multiple of the page size 4"),
        (np.concatenate([indices([0]), indices([1])[::-1]]),
         "page 1 starts at host index 7, not a multiple of the page size 4"),
        (np.concatenate([indices([0]), [4, 5, 7, 6]]), "page 1's host indices from 4 are not 4 consecutive tokens"),
        (indices([0, 6]), "page 1's host index 24 is outside the host pool of 24 tokens"),
        (indices([-1, 0]), "page 0's host index -4 is outside the host pool of 24 tokens"),
    ]
    for idx, msg in cases:
        for name, f in (("batch_get_v1", b.batch_get_v1), ("batch_set_v1", b.batch_set_v1)):
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
                assert f(KEYS[:2], list(idx) if not numpy else idx) == [False, False]
            assert caplog.messages == ["kvreshard: %s of 2 pages failed: kvreshard: %s" % (name, msg)]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        assert b.batch_get_v1(KEYS[:2], indices([1, 1])) == [False, False]   # the same slot twice
        assert b.batch_get_v1(["bad_key", KEYS[0]], indices([0, 1])) == [False, False]
        assert b.batch_set_v1(None, None) == []
        assert b.batch_exists(["bad_key"]) == 0
    assert len(caplog.messages) == 4 and all(m.startswith("kvreshard: batch_") for m in caplog.messages)
    assert b.stats()["errors"] == 2 * len(cases) + 4
    close(w)


def test_store_that_fails(tmp_path, caplog):
    """The store's directory replaced by a file under a running instance:
    every call reports failure or a miss, none raises."""
    store = tmp_path / "store"
    url = "file://" + str(store)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first")
    r = instance(url, 1, 1, [LAYERS], "page_head")
    shutil.rmtree(store)
    store.write_bytes(b"not a directory")
    with caplog.at_level(logging.WARNING, logger="kvreshard.sglang"):
        assert write(w, KEYS, [0, 1, 2], sp) == [[False] * 3]
        assert r[0][0].batch_exists(KEYS) == 0
        assert r[0][0].batch_get_v1(KEYS, indices([0, 1, 2])) == [False] * 3
    assert caplog.messages, "failures are logged"
    close(w, r)


@dataclass
class FakeStorageMetrics:
    """SGLang's StorageMetrics fields."""
    prefetch_pgs: list = field(default_factory=list)
    backup_pgs: list = field(default_factory=list)
    prefetch_bandwidth: list = field(default_factory=list)
    backup_bandwidth: list = field(default_factory=list)


def test_storage_metrics_lookup(monkeypatch, caplog):
    """StorageMetrics comes from sglang.srt.observability.metrics_collector
    (SGLang 0.5.10 on), else sglang.srt.metrics.collector (before), looked
    up on first use and kept; None when neither imports."""
    new, old = types.ModuleType("new"), types.ModuleType("old")
    new.StorageMetrics, old.StorageMetrics = FakeStorageMetrics, object
    for mods, want in [({"sglang.srt.observability.metrics_collector": new, "sglang.srt.metrics.collector": old},
                        FakeStorageMetrics),
                       ({"sglang.srt.observability.metrics_collector": None, "sglang.srt.metrics.collector": old},
                        object),
                       ({"sglang.srt.observability.metrics_collector": None, "sglang.srt.metrics.collector": None},
                        None)]:
        for k, v in mods.items():  # None in sys.modules: the import fails
            monkeypatch.setitem(sys.modules, k, v)
        monkeypatch.setattr(compat, "_metrics_class", None)
        with caplog.at_level(logging.INFO, logger="kvreshard.sglang"):
            assert ks.storage_metrics_class() is want
        del sys.modules["sglang.srt.observability.metrics_collector"]  # looked up once
        assert ks.storage_metrics_class() is want
    assert caplog.messages[-1].startswith("kvreshard: SGLang's StorageMetrics is not importable "
                                          "(sglang.srt.observability.metrics_collector: ")


def test_stats_without_storage_metrics(tmp_path, monkeypatch, caplog):
    """get_stats gives None (which SGLang takes for empty metrics) rather
    than raising or returning another class when SGLang's StorageMetrics
    cannot be imported or built."""

    class Other:
        def __init__(self):
            raise TypeError("this StorageMetrics needs arguments")

    w = instance("file://" + str(tmp_path), 1, 1, [LAYERS], "page_first")
    monkeypatch.setattr(compat, "_metrics_class", (None,))
    assert w[0][0].get_stats() is None
    monkeypatch.setattr(compat, "_metrics_class", (Other,))
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        assert w[0][0].get_stats() is None
    assert caplog.messages == ["kvreshard: get_stats: this StorageMetrics needs arguments"]
    close(w)


def test_stats_and_clear(tmp_path, monkeypatch):
    monkeypatch.setattr(compat, "_metrics_class", (FakeStorageMetrics,))
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first")
    write(w, KEYS, [0, 1, 2], sp)
    b = w[0][0]
    assert b.batch_get_v1(KEYS, indices([3, 4, 5])) == [True] * 3
    m = b.get_stats()
    assert isinstance(m, FakeStorageMetrics)
    assert m.backup_pgs == [3] and m.prefetch_pgs == [3]
    assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
    assert len(m.prefetch_bandwidth) == 1 and m.prefetch_bandwidth[0] > 0
    m2 = b.get_stats()
    assert (m2.prefetch_pgs, m2.backup_pgs) == ([], [])
    b.clear()
    assert b.stats()["get_pages"] == 0
    # clear leaves the store's pages: they are shared
    assert b.batch_exists(KEYS) == 3
    # the copying interface is not offered
    assert b.get(KEYS[0]) is None and b.batch_get(KEYS) == [None] * 3
    assert b.set(KEYS[0]) is False and b.batch_set(KEYS) is False
    close(w)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_up(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_redis_killed_under_a_running_instance(tmp_path, caplog):
    """A real redis-server, killed while the instance runs: reads and writes
    report failure, nothing raises, and the pages read before are intact."""
    import subprocess
    import time
    exe = shutil.which("redis-server")
    if exe is None:
        msg = "redis-server is missing: apt-get install redis-server"
        if os.environ.get("KVRESHARD_REQUIRE_REDIS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    port = _free_port()
    srv = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                            "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _redis_up(port):
            assert srv.poll() is None, "redis-server exited with %s" % srv.returncode
            assert time.monotonic() < deadline, "redis-server did not answer PING"
            time.sleep(0.05)
        url = "redis://127.0.0.1:%d" % port
        sp = spec()
        w = instance(url, 1, 3, [2, 2, 3], "page_first")
        r = instance(url, 2, 2, [3, 4], "page_head")
        assert write(w, KEYS[:2], [0, 1], sp) == [[True] * 2] * 3
        assert [b.batch_get_v1(KEYS[:2], indices([2, 3])) for b, *_ in r] == [[True] * 2] * 4
        check(r, KEYS[:2], [2, 3], sp)
        srv.kill()
        srv.wait()
        with caplog.at_level(logging.WARNING, logger="kvreshard.sglang"):
            assert write(w, KEYS[2:], [2], sp) == [[False]] * 3
            assert [b.batch_exists(KEYS) for b, *_ in r] == [0] * 4
            assert [b.batch_get_v1(KEYS, indices([4, 5, 0])) for b, *_ in r] == [[False] * 3] * 4
        assert caplog.messages, "failures are logged"
        check(r, KEYS[:2], [2, 3], sp)
        close(w, r)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def test_prefetch_and_backup_threads_at_once(tmp_path):
    """SGLang's prefetch and backup threads call one backend at once: reads
    of pages written before and writes of new pages, into distinct slots."""
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first", slots=8)
    old = ["0ld%d" % i for i in range(2)]
    assert write(w, old, [0, 1], sp) == [[True, True]]
    b, pool, layers, heads = w[0]
    errors = []
    new = ["n%03d" % i for i in range(40)]

    def backup():
        try:
            for i in range(0, 40, 2):
                ks, slots = new[i:i + 2], [2 + i % 4, 3 + i % 4]
                for k, s in zip(ks, slots):
                    o.fill_slot(comps(pool), pool.layout, s, sp, o.page(sp, k), layers, heads)
                assert b.batch_set_v1(ks, indices(slots)) == [True, True]
        except BaseException as e:  # noqa: B902
            errors.append(e)

    def prefetch():
        try:
            for i in range(20):
                assert b.batch_get_v1(old, indices([6, 7])) == [True, True]
                for k, s in zip(old, [6, 7]):
                    o.check_slot(comps(pool), pool.layout, s, sp, o.page(sp, k), layers, heads)
        except BaseException as e:  # noqa: B902
            errors.append(e)

    ts = [threading.Thread(target=backup), threading.Thread(target=prefetch)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert b.batch_exists(new) == 40
    c = b.stats()
    assert (c["set_pages"], c["set_ok"], c["get_hits"], c["errors"]) == (42, 42, 40, 0)
    close(w)


def test_asymmetric_mha(tmp_path):
    """K and V of other head dims (SGLang's AsymmetricMHATokenToKVPoolHost:
    kv_buffer a (K, V) tuple, page_first and page_first_direct) across TP."""
    url = "file://" + str(tmp_path)
    sp = spec(v_head_dim=4)
    w = instance(url, 2, 1, [LAYERS], "page_first", v_head_dim=4)
    assert w[0][0].binding.model.v_head_dim == 4
    assert write(w, KEYS, [0, 1, 2], sp) == [[True] * 3] * 2
    r = instance(url, 1, 2, [3, 4], "page_first_direct", v_head_dim=4)
    assert [x[0].batch_get_v1(KEYS, indices([5, 4, 3])) for x in r] == [[True] * 3] * 2
    check(r, KEYS, [5, 4, 3], sp)
    close(w, r)


def test_keys_of_any_iterable(tmp_path):
    """batch_set_v1, batch_get_v1 and batch_exists take any iterable of keys
    (a generator too), not only lists."""
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first")
    b, pool, layers, heads = w[0]
    for k, s in zip(KEYS, [0, 1, 2]):
        o.fill_slot(comps(pool), pool.layout, s, sp, o.page(sp, k), layers, heads)
    assert b.batch_set_v1((k for k in KEYS), indices([0, 1, 2])) == [True] * 3
    assert b.batch_exists(iter(KEYS)) == 3
    assert b.batch_get_v1(tuple(KEYS[:2]), indices([3, 4])) == [True, True]
    assert b.batch_get_v1((k for k in KEYS[2:]), indices([5])) == [True]
    check(w, KEYS, [0, 1, 2], sp)
    assert b.stats()["errors"] == 0
    close(w)


def test_check_parts(tmp_path, caplog):
    """extra_config check_parts: reads are checked against the parts'
    checksums, so a flipped byte in the store is a miss, not a hit; without
    it the same read is a hit (of the wrong byte)."""
    store = tmp_path / "store"
    url = "file://" + str(store)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first")
    assert write(w, KEYS[:2], [0, 1], sp) == [[True, True]]
    parts = glob.glob(os.path.join(str(store), "objects*", "*", "kvreshard_%s_*" % KEYS[1], "part-*"))
    assert len(parts) == 1
    with open(parts[0], "r+b") as f:
        b0 = f.read(1)
        f.seek(0)
        f.write(bytes([b0[0] ^ 1]))
    checked = instance(url, 1, 1, [LAYERS], "page_head", check_parts=True)
    assert checked[0][0].check_parts and checked[0][0]._reader is not None
    with caplog.at_level(logging.WARNING, logger="kvreshard.sglang"):
        assert checked[0][0].batch_get_v1(KEYS[:2], indices([2, 3])) == [True, False]
    assert any("part checksum mismatch" in m for m in caplog.messages), caplog.messages
    check(checked, KEYS[:1], [2], sp)
    unchecked = instance(url, 1, 1, [LAYERS], "page_head", check_parts=False)
    assert unchecked[0][0].batch_get_v1(KEYS[:2], indices([2, 3])) == [True, True]
    with pytest.raises(AssertionError, match="1 of 896 elements differ"):
        check(unchecked, KEYS[1:2], [3], sp)
    for bad in ("yes", 2, None):
        with pytest.raises(ks.ConfigError) as e:
            load_backend(config(1, 1, 0, 0, url, check_parts=bad))
        assert str(e.value) == "kvreshard sglang: extra_config check_parts=%r is not true or false" % (bad,)
    b = load_backend(config(1, 1, 0, 0, url, check_parts=1))
    assert b.check_parts is True
    b.close()
    close(w, checked, unchecked)
