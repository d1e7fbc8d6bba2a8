"""The SGLang HiCache backend, driven as SGLang drives it, through a fake
storage config and fake host pools with SGLang 0.5.23's attribute names and
kv_buffer shapes (sglang_pools), without SGLang or torch: the module's
stand-ins for SGLang's classes (test_sglang_files drives it through
SGLang's own)."""

import glob
import hashlib
import importlib
import itertools
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

import kvreshard as kv
import kvreshard.sglang as ks
from kvreshard.sglang import compat
import oracle as o
from sglang_pools import (DIM, PAGE, FakeLogicalHostPool, FakeMambaPoolHost, FakeMHAHostPool,  # noqa: F401
                          FakeMLAHostPool, indices)

LAYERS = 7
KV_HEADS = 4


def config(tp, pp, t, p, url, mla=False, model_name="meta-llama/Llama-test", **extra):
    e = {"backend_name": "kvreshard", "module_path": "kvreshard.sglang", "class_name": "KvreshardStorage",
         "interface_v1": 1, "url": url}
    e.update(extra)
    return ks.HiCacheStorageConfig(tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp, attn_cp_rank=0,
                                   attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=True,
                                   is_page_first_layout=False, model_name=model_name, extra_config=e)


def load_backend(cfg):
    """What SGLang's StorageBackendFactory does for `dynamic`."""
    e = cfg.extra_config
    cls = getattr(importlib.import_module(e["module_path"]), e["class_name"])
    assert issubclass(cls, ks.HiCacheStorage)
    return cls(cfg, {})


def instance(url, tp, pp, split, layout, slots=6, mla=False, drafts=0, v_head_dim=None, **extra):
    """One backend per rank of a TP x PP instance, registered with its host
    pool; with drafts, the last PP stage's pool holds that many MTP draft
    layers after its target layers (layers LAYERS.. of the oracle's page).
    Entries: (backend, pool, the oracle's [start, end) layers of the pool,
    its heads)."""
    out = []
    st = o.stages(split)
    for p, t in itertools.product(range(pp), range(tp)):
        cfg = config(tp, pp, t, p, url, mla=mla, layers=sum(split), **extra)
        d = drafts if p == pp - 1 else 0
        if mla:
            pool = FakeMLAHostPool(layout, slots, *st[p], draft_layers=d)
        else:
            pool = FakeMHAHostPool(layout, slots, *st[p], head_num=KV_HEADS // tp if tp <= KV_HEADS else 1,
                                   draft_layers=d, v_head_dim=v_head_dim)
        b = load_backend(cfg)
        b.register_mem_pool_host(pool)
        out.append((b, pool, (st[p][0], st[p][1] + d), o.heads_of(1 if mla else KV_HEADS, tp, t)))
    return out


def spec(mla=False, drafts=0, v_head_dim=None):
    if mla:
        return o.Spec(LAYERS + drafts, 1, 12, "bf16", PAGE, mla=True)
    return o.Spec(LAYERS + drafts, KV_HEADS, DIM, "bf16", PAGE, v_head_dim=v_head_dim)


def comps(pool):
    return pool.comps()


def write(inst, keys, slots, sp):
    outs = []
    for b, pool, layers, heads in inst:
        for k, s in zip(keys, slots):
            o.fill_slot(comps(pool), pool.layout, s, sp, o.page(sp, k), layers, heads)
        outs.append(b.batch_set_v1(keys, indices(slots)))
    return outs


def check(inst, keys, slots, sp, n=None):
    for b, pool, layers, heads in inst:
        for k, s in list(zip(keys, slots))[:n]:
            o.check_slot(comps(pool), pool.layout, s, sp, o.page(sp, k), layers, heads, b.binding.layout)


def close(*insts):
    for inst in insts:
        for b, *_ in inst:
            b.close()


KEYS = ["9f86d081884c7d65", "a665a45920422f9d", "b3a8e0e1f9ab1bfe"]


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


def test_refuses_to_start(tmp_path):
    url = "file://" + str(tmp_path)

    def refused(cfg, pool, msg):
        with pytest.raises(ks.ConfigError) as e:
            b = load_backend(cfg)
            b.register_mem_pool_host(pool)
        assert str(e.value) == "kvreshard sglang: " + msg

    pool = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    cfg = config(1, 1, 0, 0, url)
    del cfg.extra_config["interface_v1"]
    refused(cfg, pool, 'extra_config needs "interface_v1": 1: kvreshard reads and writes the host pool '
                       "in place (batch_get_v1, batch_set_v1)")
    cfg = config(1, 1, 0, 0, url)
    del cfg.extra_config["url"]
    refused(cfg, pool, 'extra_config needs "url", the store (redis://host:port, file:///dir)')
    # kvreshard's default split of 7 layers on PP 3 is 3/2/2; SGLang's is 2/2/3
    refused(config(1, 3, 0, 1, url, layers=7), FakeMHAHostPool("page_first", 4, 3, 5, KV_HEADS),
            "PP rank 1's host pool holds layers [3, 5) but the PP split 2/2/3 of 7 layers gives it [2, 4): "
            "set extra_config pp_layers to the split the model runs with")
    refused(config(1, 3, 0, 2, url, pp_layers="3,2,2"), FakeMHAHostPool("page_first", 4, 4, 7, KV_HEADS),
            "PP rank 2's host pool holds layers [4, 7) but the PP split 3/2/2 of 7 layers gives it [5, 7): "
            "set extra_config pp_layers to the split the model runs with")
    refused(config(1, 2, 0, 0, url), FakeMHAHostPool("page_first", 4, 0, 3, KV_HEADS),
            "with PP 2 the model's layer count is needed: give extra_config layers (or pp_layers)")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    p.layer_num = LAYERS + 1
    del p.target_layer_num
    refused(config(1, 1, 0, 0, url), p, "the host pool holds 8 layers but start_layer..end_layer is [0, 7) and "
                                        "it has no target_layer_num to tell MTP draft layers from them")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    p.kv_buffer = p.kv_buffer[:, :8]
    refused(config(1, 1, 0, 0, url), p, "the host pool's kv_buffer has shape (2, 8, 7, 4, 8); SGLang's "
                                        "page_first pool of these sizes has (2, 16, 7, 4, 8)")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    p.layout = "page_first_kv_split"
    refused(config(1, 1, 0, 0, url), p,
            "host pool layout 'page_first_kv_split' is not one of layer_first, page_first, "
            "page_first_direct, page_head")
    refused(config(2, 1, 0, 0, url, kv_heads=4), FakeMHAHostPool("page_first", 4, 0, LAYERS, 1),
            "extra_config kv_heads=4 on TP 2 gives 2 heads a rank; the host pool has 1")
    refused(config(1, 1, 0, 0, url, model_name=None), FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS),
            "no model name: SGLang passes none; give extra_config model_name")
    refused(config(1, 1, 0, 0, url), FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS, dtype="uint8",
                                                     np_dtype=np.uint8, device_dtype="uint8"),
            "the host pool stores fp8 as uint8 and its variant is unknown: give extra_config fp8_variant "
            "(e4m3fn or e5m2)")
    cfg = config(1, 1, 0, 0, url)
    cfg.attn_cp_size = 2
    refused(cfg, pool, "attention context parallelism (attn_cp_size=2): give extra_config cp_interleave, the "
                       "tokens of each run of a page dealt to a CP rank round-robin (the page size for contiguous "
                       "slices)")
    with pytest.raises(kv.InvalidArgument, match='unknown scheme "nosuch"'):
        load_backend(config(1, 1, 0, 0, "nosuch://x"))


def test_split_rules():
    assert [ks.sglang_stage(7, r, 3) for r in range(3)] == [(0, 2), (2, 4), (4, 7)]
    assert [ks.sglang_stage(8, r, 3) for r in range(3)] == [(0, 2), (2, 5), (5, 8)]
    assert [ks.sglang_stage(80, r, 2) for r in range(2)] == [(0, 40), (40, 80)]
    assert ks.sglang_split(61, 4) == [15, 15, 15, 16]
    os.environ["SGLANG_PP_LAYER_PARTITION"] = "4,2,1"
    try:
        assert ks.sglang_split(7, 3) == [4, 2, 1]
        with pytest.raises(ks.ConfigError, match="does not split 8 layers into 3 stages"):
            ks.sglang_split(8, 3)
    finally:
        del os.environ["SGLANG_PP_LAYER_PARTITION"]


def test_split_override_and_partition_env(tmp_path, monkeypatch):
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 3, [3, 2, 2], "page_first", pp_layers=[3, 2, 2])
    assert [b.binding.pp_layers for b, *_ in w] == [[3, 2, 2]] * 3
    write(w, KEYS, [0, 1, 2], sp)
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "1,6")
    st = o.stages([1, 6])
    r = []
    for p in range(2):
        cfg = config(1, 2, 0, p, url)
        b = load_backend(cfg)
        pool = FakeMHAHostPool("page_head", 6, *st[p], KV_HEADS)
        b.register_mem_pool_host(pool)
        r.append((b, pool, st[p], (0, KV_HEADS)))
    assert [b.binding.pp_layers for b, *_ in r] == [[1, 6]] * 2
    assert [b.batch_get_v1(KEYS, indices([5, 3, 1])) for b, *_ in r] == [[True] * 3] * 2
    check(r, KEYS, [5, 3, 1], sp)
    close(w, r)


def test_model_domain_separates_dtypes_and_tenants(tmp_path):
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first", namespace="tenant-a")
    write(w, KEYS, [0, 1, 2], sp)
    same = instance(url, 1, 1, [LAYERS], "page_head", namespace="tenant-a")
    assert same[0][0].batch_exists(KEYS) == 3
    other_tenant = instance(url, 1, 1, [LAYERS], "page_first", namespace="tenant-b")
    assert other_tenant[0][0].batch_exists(KEYS) == 0
    cfg = config(1, 1, 0, 0, url, namespace="tenant-a")
    fp16 = load_backend(cfg)
    fp16.register_mem_pool_host(FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS, dtype="float16"))
    assert fp16.batch_exists(KEYS) == 0
    e4m3, e5m2 = (load_backend(config(1, 1, 0, 0, url, namespace="tenant-a")) for _ in range(2))
    e4m3.register_mem_pool_host(FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS, dtype="uint8",
                                                np_dtype=np.uint8, device_dtype="float8_e4m3fn"))
    e5m2.register_mem_pool_host(FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS, dtype="uint8",
                                                np_dtype=np.uint8, device_dtype="float8_e5m2"))
    assert e4m3.binding.model.fingerprint == "fp8=float8_e4m3fn"
    assert e4m3.binding.model.domain() != e5m2.binding.model.domain()
    other_model = load_backend(config(1, 1, 0, 0, url, namespace="tenant-a", model_name="other/model"))
    other_model.register_mem_pool_host(FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS))
    assert other_model.batch_exists(KEYS) == 0
    close(w, same, other_tenant)
    for b in (fp16, e4m3, e5m2, other_model):
        b.close()


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


# Context parallelism: SGLang's DCP (the host pool's dcp_size and dcp_rank,
# logical host indices of page_size x dcp_size a page) and attention CP (the
# storage config's attn_cp_size and attn_cp_rank, with extra_config
# cp_interleave), written by one CP size and read by another.

def cp_indices(slots, n):
    """Host indices of pages at these slots, n indices a page."""
    return np.concatenate([np.arange(s * n, (s + 1) * n, dtype=np.int64) for s in slots])


def dcp_instance(url, tp, dcp, layout, page, slots=6, **extra):
    """One MLA backend per TP rank with SGLang's DCP: TP rank t is DCP rank
    t % dcp, its host pool slots hold page of the page x dcp tokens of a
    logical page. Entries: (backend, pool, host indices a page, tokens)."""
    il = extra.get("cp_interleave", 1)
    out = []
    for t in range(tp):
        b = load_backend(config(tp, 1, t, 0, url, mla=True, layers=LAYERS, **extra))
        pool = FakeMLAHostPool(layout, slots, 0, LAYERS, page_size=page, dcp_size=dcp, dcp_rank=t % dcp)
        b.register_mem_pool_host(pool)
        out.append((b, pool, page * dcp, o.cp_tokens(page * dcp, dcp, t % dcp, il)))
    return out


def attn_cp_instance(url, cp, layout, page, il, slots=6):
    """One MHA backend per attention-CP rank (TP 1), slots of page tokens."""
    out = []
    for c in range(cp):
        cfg = config(1, 1, 0, 0, url, layers=LAYERS, cp_interleave=il)
        cfg.attn_cp_size, cfg.attn_cp_rank = cp, c
        b = load_backend(cfg)
        pool = FakeMHAHostPool(layout, slots, 0, LAYERS, KV_HEADS, page_size=page)
        b.register_mem_pool_host(pool)
        out.append((b, pool, page, o.cp_tokens(page * cp, cp, c, il)))
    return out


def cp_write(inst, keys, slots, sp):
    outs = []
    for b, pool, n, toks in inst:
        heads = (0, sp.kv_heads)
        for k, s in zip(keys, slots):
            o.fill_slot(comps(pool), pool.layout, s, sp, o.page(sp, k), (0, LAYERS), heads, tokens=toks)
        outs.append(b.batch_set_v1(keys, cp_indices(slots, n)))
    return outs


def cp_read(inst, keys, slots, sp):
    for b, pool, n, toks in inst:
        assert b.batch_exists(keys) == len(keys)
        assert b.batch_get_v1(keys, cp_indices(slots, n)) == [True] * len(keys)
        for k, s in zip(keys, slots):
            o.check_slot(comps(pool), pool.layout, s, sp, o.page(sp, k), (0, LAYERS), (0, sp.kv_heads),
                         "%s %r" % (pool.layout, b.binding.placement), tokens=toks)


@pytest.mark.parametrize("tp,dcp,il,rtp", [(2, 2, 1, 1), (4, 2, 1, 2), (2, 2, 2, 1), (4, 4, 1, 1)])
def test_dcp_writes_cp1_reads_and_back(tmp_path, tp, dcp, il, rtp):
    """A DCP instance (MLA, SGLang's interleave 1 or extra_config's) writes,
    an instance without context parallelism and twice the page reads, and
    back."""
    url = "file://" + str(tmp_path)
    page = 8 // dcp
    sp = o.Spec(LAYERS, 1, 12, "bf16", 8, mla=True)
    extra = {"cp_interleave": il} if il != 1 else {}
    w = dcp_instance(url, tp, dcp, "page_first", page, **extra)
    b = w[0][0].binding
    assert (b.model.page, b.cp, b.cp_interleave, b.placement.tp, b.host_page) == (8, dcp, il, tp // dcp, 8)
    assert [x[0].binding.placement.rank for x in w] == [(t // dcp, 0, t % dcp) for t in range(tp)]
    r = dcp_instance(url, rtp, 1, "layer_first", 8)
    assert [x[0].batch_exists(KEYS) for x in r] == [0] * rtp
    assert cp_write(w, KEYS, [4, 0, 2], sp) == [[True] * 3] * tp
    # the first DCP group writes, the others hold replicas of the latent
    assert [x[0].stats()["writer"]["written"] for x in w] == [3 if t < dcp else 0 for t in range(tp)]
    assert [x[0].stats()["writer"]["replica"] for x in w] == [0 if t < dcp else 3 for t in range(tp)]
    cp_read(r, KEYS, [1, 5, 3], sp)
    # and back: pages of the instance without CP, read by the DCP one
    keys = ["b" + k for k in KEYS]
    assert cp_write(r, keys, [0, 2, 4], sp) == [[True] * 3] * rtp
    cp_read(w, keys, [5, 1, 3], sp)
    close(w, r)


def test_attn_cp_writes_cp1_reads_and_back(tmp_path):
    """Attention CP 2 with extra_config cp_interleave 4 (contiguous halves
    of pages of 2 x 4 tokens) and an instance without CP, pages of 8."""
    url = "file://" + str(tmp_path)
    sp = o.Spec(LAYERS, KV_HEADS, DIM, "bf16", 8)
    w = attn_cp_instance(url, 2, "page_head", 4, 4)
    assert [(x[0].binding.placement.rank, x[0].binding.host_page) for x in w] == [((0, 0, 0), 4), ((0, 0, 1), 4)]
    r = []
    for layout in ("page_first", "page_first_direct"):
        b = load_backend(config(1, 1, 0, 0, url, layers=LAYERS))
        pool = FakeMHAHostPool(layout, 6, 0, LAYERS, KV_HEADS, page_size=8)
        b.register_mem_pool_host(pool)
        r.append((b, pool, 8, None))
    assert cp_write(w, KEYS, [3, 0, 5], sp) == [[True] * 3] * 2
    cp_read(r, KEYS, [1, 2, 0], sp)
    keys = ["c" + k for k in KEYS]
    assert cp_write(r[:1], keys, [3, 4, 5], sp) == [[True] * 3]
    cp_read(w, keys, [2, 4, 1], sp)
    close(w, r)


def test_dcp_bad_indices(tmp_path, caplog):
    """Under DCP SGLang's host indices are logical: page_size x dcp_size a page."""
    w = dcp_instance("file://" + str(tmp_path), 2, 2, "page_first", 4)
    b = w[1][0]
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        assert b.batch_set_v1(KEYS[:1], cp_indices([0], 4)) == [False]
        assert b.batch_get_v1(KEYS[:2], cp_indices([1, 6], 8)) == [False, False]
    assert caplog.messages == [
        "kvreshard: batch_set_v1 of 1 pages failed: kvreshard: 4 host indices for 1 pages of 8 tokens",
        "kvreshard: batch_get_v1 of 2 pages failed: kvreshard: page 1's host index 48 is outside the host pool "
        "of 48 tokens"]
    close(w)


def test_cp_refuses_to_start(tmp_path):
    url = "file://" + str(tmp_path)

    def refused(cfg, pool, msg, cls=ks.ConfigError):
        with pytest.raises(cls) as e:
            b = load_backend(cfg)
            try:
                b.register_mem_pool_host(pool)
            finally:
                b.close()
        assert str(e.value) == msg

    def mla(dcp=2, dcp_rank=0, page=4):
        return FakeMLAHostPool("page_first", 4, 0, LAYERS, page_size=page, dcp_size=dcp, dcp_rank=dcp_rank)

    cfg = config(2, 1, 0, 0, url, mla=True)
    cfg.attn_cp_size = 2
    refused(cfg, mla(), "kvreshard sglang: decode context parallelism (the host pool's dcp_size=2) with attention "
                        "context parallelism (attn_cp_size=2) is not supported")
    refused(config(2, 1, 0, 0, url, mla=True, cp=4), mla(),
            "kvreshard sglang: extra_config cp=4, but the host pool's dcp_size is 2")
    refused(config(1, 1, 0, 0, url, cp=2), FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS),
            "kvreshard sglang: extra_config cp=2, but this rank runs without context parallelism (the host "
            "pool's dcp_size and the storage config's attn_cp_size are 1): no CP rank to bind")
    refused(config(2, 1, 1, 0, url, mla=True), mla(dcp_rank=0),
            "kvreshard sglang: the host pool's dcp_rank 0 is not tp_rank 1 mod dcp_size 2: SGLang's DCP groups "
            "are runs of dcp_size TP ranks")
    refused(config(2, 1, 0, 0, url, mla=True), mla(dcp=4),
            "kvreshard sglang: dcp_size 4 does not divide tp_size 2")
    refused(config(2, 1, 0, 0, url, mla=True, cp_interleave=3), mla(),
            "placement: cp interleave 3 does not divide the page's 8 tokens", kv.InvalidArgument)
    refused(config(2, 1, 0, 0, url, mla=True, cp_interleave=0), mla(),
            "kvreshard sglang: extra_config cp_interleave=0 is not a positive whole number")
    p = mla()
    p.dcp_size = "2"
    refused(config(2, 1, 0, 0, url, mla=True), p, "kvreshard sglang: the host pool's dcp_size is '2', not an int")
    # a config with explicit, agreeing cp binds
    b = load_backend(config(2, 1, 1, 0, url, mla=True, cp=2))
    b.register_mem_pool_host(mla(dcp_rank=1))
    assert (b.binding.cp, b.binding.cp_rank, b.binding.placement.rank) == (2, 1, (0, 0, 1))
    b.close()


# MTP: SGLang folds the draft layers of speculative decoding into the host
# pool (layer_num = target layers + drafts, the drafts after them;
# start_layer and end_layer the target's), on the last PP stage only.

def test_mtp_pages_across_topologies(tmp_path):
    """A TP 2 writer's pages with one draft layer are read exactly, draft
    layer included, by a TP 1 reader of another layout and by a TP 1 x PP 2
    one whose last stage holds the draft; a reader of the same model
    without draft layers finds none of them, and the other way round."""
    url = "file://" + str(tmp_path)
    sp = spec(drafts=1)
    w = instance(url, 2, 1, [LAYERS], "page_first", drafts=1)
    b = w[0][0].binding
    assert (b.draft_layers, b.model.layers, b.model.draft_layers, b.pp_layers) == (1, LAYERS + 1, 1, [LAYERS + 1])
    assert w[0][1].kv_buffer.shape == (2, 24, LAYERS + 1, 2, DIM)
    assert write(w, KEYS, [4, 0, 2], sp) == [[True] * 3] * 2
    r = instance(url, 1, 1, [LAYERS], "page_head", drafts=1)
    assert r[0][0].batch_exists(KEYS) == 3
    assert r[0][0].batch_get_v1(KEYS, indices([1, 5, 3])) == [True] * 3
    check(r, KEYS, [1, 5, 3], sp)
    pp = instance(url, 1, 2, [3, 4], "layer_first", drafts=1, draft_layers=1)
    assert [x[0].binding.pp_layers for x in pp] == [[3, 5]] * 2
    assert [x[2] for x in pp] == [(0, 3), (3, LAYERS + 1)]
    assert [x[0].batch_get_v1(KEYS, indices([2, 3, 0])) for x in pp] == [[True] * 3] * 2
    check(pp, KEYS, [2, 3, 0], sp)
    plain = instance(url, 1, 1, [LAYERS], "page_first")
    assert plain[0][0].batch_exists(KEYS) == 0
    assert write(plain, ["p" + k for k in KEYS], [0, 1, 2], spec()) == [[True] * 3]
    assert r[0][0].batch_exists(["p" + k for k in KEYS]) == 0
    assert plain[0][0].binding.model.domain() != r[0][0].binding.model.domain()
    close(w, r, pp, plain)


def test_mtp_mla(tmp_path):
    """MLA with two draft layers: TP 2 (rank 1 a replica) to PP 2 and back."""
    url = "file://" + str(tmp_path)
    sp = spec(mla=True, drafts=2)
    w = instance(url, 2, 1, [LAYERS], "page_first_direct", mla=True, drafts=2)
    assert write(w, KEYS, [0, 1, 2], sp) == [[True] * 3] * 2
    r = instance(url, 1, 2, [4, 3], "layer_first", mla=True, drafts=2, draft_layers=2, pp_layers=[4, 3])
    assert [x[0].binding.pp_layers for x in r] == [[4, 5]] * 2
    assert [x[0].batch_get_v1(KEYS, indices([5, 4, 3])) for x in r] == [[True] * 3] * 2
    check(r, KEYS, [5, 4, 3], sp)
    keys = ["m" + k for k in KEYS]
    assert write(r, keys, [0, 1, 2], sp) == [[True] * 3] * 2
    assert [x[0].batch_get_v1(keys, indices([3, 4, 5])) for x in w] == [[True] * 3] * 2
    check(w, keys, [3, 4, 5], sp)
    close(w, r)


def test_mtp_refuses_to_start(tmp_path):
    url = "file://" + str(tmp_path)

    def refused(cfg, pool, msg):
        with pytest.raises(ks.ConfigError) as e:
            b = load_backend(cfg)
            try:
                b.register_mem_pool_host(pool)
            finally:
                b.close()
        assert str(e.value) == "kvreshard sglang: " + msg

    last = FakeMHAHostPool("page_first", 4, 3, 7, KV_HEADS, draft_layers=1)
    refused(config(1, 2, 0, 1, url, layers=7), last,
            "the host pool holds 1 MTP draft layers after its target layers [3, 7); the other PP stages' pools do "
            "not show them: give every rank extra_config draft_layers=1")
    refused(config(1, 2, 0, 1, url, layers=7, draft_layers=2), last,
            "extra_config draft_layers=2, but the host pool of the last PP stage holds 1 (layer_num 5, target "
            "layers [3, 7))")
    refused(config(1, 2, 0, 1, url, layers=7, draft_layers=1), FakeMHAHostPool("page_first", 4, 3, 7, KV_HEADS),
            "extra_config draft_layers=1, but the host pool of the last PP stage holds 0 (layer_num 4, target "
            "layers [3, 7))")
    refused(config(1, 2, 0, 0, url, layers=7, draft_layers=1),
            FakeMHAHostPool("page_first", 4, 0, 3, KV_HEADS, draft_layers=1),
            "PP rank 0's host pool holds 1 MTP draft layers, but SGLang runs the draft on the last PP stage (1) "
            "only")
    refused(config(1, 1, 0, 0, url, draft_layers=-1), FakeMHAHostPool("page_first", 4, 0, 7, KV_HEADS),
            "extra_config draft_layers=-1 is not a whole number >= 0")
    p = FakeMLAHostPool("page_first", 4, 0, 7)
    p.target_layer_num = 4  # MLA layer sharding: the rank holds 4 of the stage's 7 layers
    refused(config(1, 1, 0, 0, url, mla=True), p, "the host pool's target_layer_num is 4 but "
                                                  "start_layer..end_layer is [0, 7): MLA layer sharding is not "
                                                  "supported")
    # the first stage of PP 2 with MTP binds the model with the draft layers
    b = load_backend(config(1, 2, 0, 0, url, layers=7, draft_layers=1))
    b.register_mem_pool_host(FakeMHAHostPool("page_first", 4, 0, 3, KV_HEADS))
    assert (b.binding.model.layers, b.binding.model.draft_layers, b.binding.pp_layers) == (8, 1, [3, 5])
    b.close()


def test_model_draft_layers_domain():
    """kvreshard.Model's draft_layers reaches the library (the last field
    of kvr_model): the domain is the SHA-256 of the canonical JSON with
    "draft_layers" first in the descriptor, and without it for 0."""
    def want(draft):
        d = '"draft_layers":%d,' % draft if draft else ""
        js = ('{"descriptor":{%s"dtype":"bf16","head_dims":[8,8],"item_size":2,"kv_heads":2,'
              '"layers":[0,1,2,3,4],"page_size":4},"fingerprint":"","model_id":"model","namespace":"kvreshard",'
              '"revision":"0"}' % d)
        return hashlib.sha256(js.encode()).hexdigest()

    for draft in (0, 1, 5):
        m = kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4, draft_layers=draft)
        assert m.domain() == want(draft)
    assert "draft_layers=2" in repr(kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4,
                                             draft_layers=2))
    with pytest.raises(kv.InvalidArgument, match="model: draft_layers 6 is not from 0 to the 5 layers"):
        kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4, draft_layers=6).domain()
    with pytest.raises(kv.InvalidArgument, match="draft_layers=-1 is out of range"):
        kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4, draft_layers=-1)


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


# SGLang's v2 interface: PoolName.KV transfers are the v1 calls; other pools
# are refused at registration and reported missing.

def v2_backend(url, layout="page_first", **extra):
    b = load_backend(config(1, 1, 0, 0, url, **extra))
    pool = FakeMHAHostPool(layout, 6, 0, LAYERS, KV_HEADS)
    b.register_mem_pool_host(pool)
    b.register_mem_host_pool_v2(pool, ks.PoolName.KV)
    b.on_host_pools_registered()
    return b, pool


def test_v2_kv(tmp_path):
    url = "file://" + str(tmp_path)
    sp = spec()
    w, wpool = v2_backend(url)
    assert w.registered_pools == {ks.PoolName.KV: wpool}
    for k, s in zip(KEYS[:2], [0, 1]):
        o.fill_slot(comps(wpool), "page_first", s, sp, o.page(sp, k), (0, LAYERS), (0, KV_HEADS))
    res = w.batch_set_v2([ks.PoolTransfer(ks.PoolName.KV, host_indices=indices([0, 1]), keys=KEYS[:2])])
    assert res == {ks.PoolName.KV: [True, True]}
    r, rpool = v2_backend(url, "page_head")
    kv_q = ks.PoolTransfer(ks.PoolName.KV, keys=["__placeholder__"])
    res = r.batch_exists_v2(KEYS)
    assert isinstance(res, ks.PoolTransferResult)
    assert (res.kv_hit_pages, res.extra_pool_hit_pages) == (2, {ks.PoolName.KV: 2})
    assert r.batch_exists_v2(KEYS, [kv_q]).kv_hit_pages == 2
    assert r.batch_exists_v2(KEYS[1:]) == ks.PoolTransferResult(1, {ks.PoolName.KV: 1})
    assert r.batch_exists_v2(KEYS[2:]) == ks.PoolTransferResult(0, {})
    res = r.batch_get_v2([ks.PoolTransfer(ks.PoolName.KV, host_indices=indices([3, 4, 5]), keys=KEYS)])
    assert res == {ks.PoolName.KV: [True, True, False]}
    for k, s in zip(KEYS[:2], [3, 4]):
        o.check_slot(comps(rpool), "page_head", s, sp, o.page(sp, k), (0, LAYERS), (0, KV_HEADS))
    # the name as a str is the same pool
    assert r.batch_get_v2([ks.PoolTransfer("kv", host_indices=indices([0]), keys=KEYS[:1])]) == {"kv": [True]}
    w.close()
    r.close()


def test_v2_pools_not_stored(tmp_path, caplog):
    """Registering any pool but KV is refused, naming it; a v2 call that
    names one anyway gets an entry for every transfer, all False for that
    pool, and no KV hit from batch_exists_v2."""
    url = "file://" + str(tmp_path)
    w, pool = v2_backend(url)
    for name, p in [(ks.PoolName.MAMBA, FakeMambaPoolHost()), (ks.PoolName.SWA, pool), ("deepseek_v4_c4", pool),
                    (ks.PoolName.DRAFT, FakeMHAHostPool("page_first", 6, 0, 1, KV_HEADS))]:
        with pytest.raises(ks.ConfigError) as e:
            w.register_mem_host_pool_v2(p, name)
        assert str(e.value) == (
            "kvreshard sglang: SGLang registers its %r host pool (%s), which kvreshard does not store: kvreshard "
            "stores the KV pool only (MHA or MLA, MTP draft layers folded in), not the Mamba, SWA, indexer, "
            "DeepSeek-V4 or draft sidecar pools of hybrid models" % (str(name), type(p).__name__))
    assert list(w.registered_pools) == [ks.PoolName.KV]
    write([(w, pool, (0, LAYERS), (0, KV_HEADS))], KEYS, [0, 1, 2], spec())
    kv_t = ks.PoolTransfer(ks.PoolName.KV, host_indices=indices([3, 4]), keys=KEYS[:2])
    mamba = ks.PoolTransfer(ks.PoolName.MAMBA, host_indices=indices([0]), keys=KEYS[1:2],
                            hit_policy=ks.PoolHitPolicy.TRAILING_PAGES)
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        assert w.batch_get_v2([kv_t, mamba]) == {ks.PoolName.KV: [True, True], ks.PoolName.MAMBA: [False]}
        assert w.batch_set_v2([mamba, kv_t]) == {ks.PoolName.MAMBA: [False], ks.PoolName.KV: [True, True]}
        assert w.batch_exists_v2(KEYS, [mamba]) == ks.PoolTransferResult(0, {})
        assert w.batch_get_v2([ks.PoolTransfer(ks.PoolName.INDEXER)]) == {ks.PoolName.INDEXER: []}
    assert caplog.messages == [
        "kvreshard: batch_get_v2 names the 'mamba' pool, which kvreshard does not store: its pages are reported "
        "missing (logged once a pool)",
        "kvreshard: batch_get_v2 names the 'indexer' pool, which kvreshard does not store: its pages are reported "
        "missing (logged once a pool)"]
    w.close()


def test_v2_never_raises(tmp_path, caplog):
    url = "file://" + str(tmp_path)
    w, pool = v2_backend(url)
    write([(w, pool, (0, LAYERS), (0, KV_HEADS))], KEYS, [0, 1, 2], spec())
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        assert w.batch_get_v2(None) == {}
        assert w.batch_get_v2(5) == {}
        assert w.batch_exists_v2(None) == ks.PoolTransferResult(0, {})
        assert w.batch_exists_v2(KEYS, 7) == ks.PoolTransferResult(0, {})
        # host indices missing or wrong: every page not read
        kv_t = ks.PoolTransfer(ks.PoolName.KV, keys=KEYS)
        assert w.batch_get_v2([kv_t]) == {ks.PoolName.KV: [False] * 3}
        assert w.batch_set_v2([ks.PoolTransfer(ks.PoolName.KV, host_indices=indices([0]), keys=KEYS)]) == \
            {ks.PoolName.KV: [False] * 3}
        assert w.batch_get_v2([ks.PoolTransfer(ks.PoolName.KV, host_indices=indices([]), keys=None)]) == \
            {ks.PoolName.KV: []}
        assert w.batch_get_v2([ks.PoolTransfer(["unhashable"], keys=KEYS)]) == {}
        assert w.batch_get_v2(["not a transfer"]) == {None: []}
    assert caplog.messages, "failures are logged"
    # a backend that was never registered: misses, not exceptions
    b = load_backend(config(1, 1, 0, 0, url))
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        assert b.batch_exists_v2(KEYS) == ks.PoolTransferResult(0, {})
        assert b.batch_get_v2([ks.PoolTransfer(ks.PoolName.KV, host_indices=indices([0]), keys=KEYS[:1])]) == \
            {ks.PoolName.KV: [False]}
    b.close()
    w.close()


def test_v2_registration(tmp_path):
    """register_mem_host_pool_v2 binds the KV pool when register_mem_pool_host
    did not, refuses a second KV pool, and on_host_pools_registered needs one."""
    url = "file://" + str(tmp_path)
    b = load_backend(config(1, 1, 0, 0, url))
    with pytest.raises(ks.ConfigError, match="^kvreshard sglang: SGLang registered no KV host pool$"):
        b.on_host_pools_registered()
    pool = FakeMHAHostPool("page_first", 6, 0, LAYERS, KV_HEADS)
    b.register_mem_host_pool_v2(pool, "kv")
    assert b.binding is not None and b.mem_pool_host is pool
    b.register_mem_host_pool_v2(pool, ks.PoolName.KV)  # the same pool again
    with pytest.raises(ks.ConfigError) as e:
        b.register_mem_host_pool_v2(FakeMHAHostPool("page_first", 6, 0, LAYERS, KV_HEADS), ks.PoolName.KV)
    assert str(e.value) == ("kvreshard sglang: SGLang registers a KV host pool (FakeMHAHostPool) other than the "
                            "one bound (FakeMHAHostPool)")
    b.on_host_pools_registered()
    b.close()


def test_pools_without_kv_bytes(tmp_path):
    """A KV pool whose kv_buffer is None (DeepSeek-V4's logical anchor, an
    allocator-only or destroyed pool) is a ConfigError, not an AttributeError."""
    url = "file://" + str(tmp_path)
    msg = ("kvreshard sglang: the host pool (%s) has no KV bytes (its kv_buffer is None): a logical anchor of a "
           "hybrid model (DeepSeek-V4) or an allocator-only pool keeps the cache in pools kvreshard does not store")
    for pool in (FakeLogicalHostPool(), FakeMLAHostPool("page_first", 4, 0, LAYERS)):
        pool.kv_buffer = None
        for register in ("register_mem_pool_host", "register_mem_host_pool_v2"):
            b = load_backend(config(1, 1, 0, 0, url, mla=isinstance(pool, FakeMLAHostPool)))
            with pytest.raises(ks.ConfigError) as e:
                if register == "register_mem_pool_host":
                    b.register_mem_pool_host(pool)
                else:
                    b.register_mem_host_pool_v2(pool, ks.PoolName.KV)
            assert str(e.value) == msg % type(pool).__name__
            b.close()


def test_other_pools_refused(tmp_path):
    url = "file://" + str(tmp_path)

    def refused(pool, msg):
        b = load_backend(config(1, 1, 0, 0, url))
        with pytest.raises(ks.ConfigError) as e:
            b.register_mem_pool_host(pool)
        b.close()
        assert str(e.value) == "kvreshard sglang: " + msg

    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    del p.kv_buffer  # MHATokenToKOnlyPoolHost's data is in k_buffer alone
    refused(p, "the host pool (FakeMHAHostPool) has no kv_buffer; kvreshard binds SGLang's MHATokenToKVPoolHost "
               "and MLATokenToKVPoolHost")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    p.shard_size = 2
    refused(p, "the host pool (FakeMHAHostPool) is page-interleaved over 2 ranks (shard_size): not supported")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    p.k_scale_host = np.zeros(4, np.uint8)
    refused(p, "the host pool (FakeMHAHostPool) keeps KV scales (k_scale_host) beside its kv_buffer (MXFP8): "
               "kvreshard does not store them")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS, v_head_dim=4)
    p.kv_buffer = (p.kv_buffer[0],)
    refused(p, "the host pool's kv_buffer holds 1 buffers, not K and V")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS)
    p.v_head_dim = 4
    refused(p, "the host pool's head_dim 8 and v_head_dim 4 differ but its kv_buffer is one tensor")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS, v_head_dim=4)
    p.kv_buffer = (p.kv_buffer[0], p.kv_buffer[0])
    refused(p, "the host pool's V buffer has shape (16, 7, 4, 8); SGLang's page_first pool of these sizes has "
               "(16, 7, 4, 4)")
    p = FakeMHAHostPool("page_first", 4, 0, LAYERS, KV_HEADS, dtype="uint8", np_dtype=np.uint8)
    refused(p, "the host pool stores fp8 as uint8 and its variant is unknown: give extra_config fp8_variant "
               "(e4m3fn or e5m2)")
    # SGLang 0.5.23's host pools have no device_pool: extra_config says the variant
    b = load_backend(config(1, 1, 0, 0, url, fp8_variant="e4m3fn"))
    b.register_mem_pool_host(p)
    assert b.binding.model.fingerprint == "fp8=float8_e4m3fn"
    b.close()


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
