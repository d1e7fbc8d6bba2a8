"""The SGLang HiCache backend, driven as SGLang drives it, through a fake
storage config and fake host pools with SGLang's attribute names and
kv_buffer shapes (memory_pool_host.py), without SGLang or torch."""

import glob
import importlib
import itertools
import logging
import os
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

import kvreshard as kv
import kvreshard.sglang as ks
import oracle as o

PAGE = 4
LAYERS = 7
KV_HEADS = 4
DIM = 8


class FakeDtype:
    """What str() of a torch dtype gives."""

    def __init__(self, name, itemsize):
        self._name, self.itemsize = name, itemsize

    def __str__(self):
        return "torch." + self._name


class FakeDevicePool:
    def __init__(self, dtype):
        self.dtype = dtype


class FakeMHAHostPool:
    """MHATokenToKVPoolHost's attributes; kv_buffer of SGLang's shapes."""

    def __init__(self, layout, page_num, start_layer, end_layer, head_num, head_dim=DIM, page_size=PAGE,
                 dtype="bfloat16", np_dtype=np.uint16, device_dtype=None):
        self.layout, self.page_size, self.page_num = layout, page_size, page_num
        self.size = page_num * page_size
        self.start_layer, self.end_layer = start_layer, end_layer
        self.layer_num = end_layer - start_layer
        self.head_num, self.head_dim = head_num, head_dim
        self.dtype = FakeDtype(dtype, np.dtype(np_dtype).itemsize)
        self.device_pool = FakeDevicePool(FakeDtype(device_dtype or dtype, 1))
        L, S, T, H, D = self.layer_num, page_num, page_size, head_num, head_dim
        dims = {"layer_first": (2, L, S * T, H, D),
                "page_first": (2, S * T, L, H, D),
                "page_first_direct": (2, S, L, T, H, D),
                "page_head": (2, S, H, T, L, D)}[layout]
        self.kv_buffer = np.zeros(dims, np_dtype)

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]


class FakeMLAHostPool:
    """MLATokenToKVPoolHost's attributes; dcp_size and dcp_rank as SGLang's
    HostKVCache has them (page_size is this rank's, not the widened one)."""

    def __init__(self, layout, page_num, start_layer, end_layer, kv_lora_rank=8, qk_rope_head_dim=4,
                 page_size=PAGE, dcp_size=1, dcp_rank=0):
        self.layout, self.page_size, self.page_num = layout, page_size, page_num
        self.dcp_size, self.dcp_rank = dcp_size, dcp_rank
        self.size = page_num * page_size
        self.start_layer, self.end_layer = start_layer, end_layer
        self.layer_num = end_layer - start_layer
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.dtype = FakeDtype("bfloat16", 2)
        L, S, T, D = self.layer_num, page_num, page_size, self.kv_cache_dim
        dims = {"layer_first": (L, S * T, 1, D),
                "page_first": (S * T, L, 1, D),
                "page_first_direct": (S, L, T, 1, D)}[layout]
        self.kv_buffer = np.zeros(dims, np.uint16)


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


def instance(url, tp, pp, split, layout, slots=6, mla=False, **extra):
    """One backend per rank of a TP x PP instance, registered with its host pool."""
    out = []
    st = o.stages(split)
    for p, t in itertools.product(range(pp), range(tp)):
        cfg = config(tp, pp, t, p, url, mla=mla, layers=sum(split), **extra)
        if mla:
            pool = FakeMLAHostPool(layout, slots, *st[p])
        else:
            pool = FakeMHAHostPool(layout, slots, *st[p], head_num=KV_HEADS // tp if tp <= KV_HEADS else 1)
        b = load_backend(cfg)
        b.register_mem_pool_host(pool)
        out.append((b, pool, st[p], o.heads_of(1 if mla else KV_HEADS, tp, t)))
    return out


def spec(mla=False):
    return o.Spec(LAYERS, 1, 12, "bf16", PAGE, mla=True) if mla else o.Spec(LAYERS, KV_HEADS, DIM, "bf16", PAGE)


def comps(pool):
    return [pool.kv_buffer] if isinstance(pool, FakeMLAHostPool) else [pool.kv_buffer[0], pool.kv_buffer[1]]


def indices(slots):
    """SGLang's host indices of pages at these slots: page_size tokens each."""
    return np.concatenate([np.arange(s * PAGE, (s + 1) * PAGE, dtype=np.int64) for s in slots]) \
        if slots else np.zeros(0, np.int64)


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
    if not numpy:
        monkeypatch.setattr(kv, "_np", None)
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
    refused(config(1, 1, 0, 0, url), p, "the host pool holds 8 layers but start_layer..end_layer is [0, 7): "
                                        "pools with MTP draft layers are not supported")
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


def test_stats_of_another_storage_metrics(tmp_path, monkeypatch, caplog):
    """get_stats gives None (which SGLang skips) rather than raising or
    returning another class when SGLang's StorageMetrics cannot be built."""

    class Other:
        def __init__(self):
            raise TypeError("this StorageMetrics needs arguments")

    w = instance("file://" + str(tmp_path), 1, 1, [LAYERS], "page_first")
    monkeypatch.setattr(ks, "StorageMetrics", Other)
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        assert w[0][0].get_stats() is None
    assert caplog.messages == ["kvreshard: get_stats: this StorageMetrics needs arguments"]
    close(w)


def test_stats_and_clear(tmp_path):
    url = "file://" + str(tmp_path)
    sp = spec()
    w = instance(url, 1, 1, [LAYERS], "page_first")
    write(w, KEYS, [0, 1, 2], sp)
    b = w[0][0]
    assert b.batch_get_v1(KEYS, indices([3, 4, 5])) == [True] * 3
    m = b.get_stats()
    assert isinstance(m, ks.StorageMetrics)
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
