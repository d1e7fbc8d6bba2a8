"""kvreshard.sglang in a process that imports SGLang 0.5.23's own
hicache_storage.py and storage/backend_factory.py (over sglang_stub's
empty torch; see sglang_env). test_sglang_files runs this file with pytest
in such a process; pytest does not collect it otherwise (no test_ prefix),
since the other tests' process must not import SGLang's files.

What SGLang's own classes show here: the factory builds the backend from
module_path and class_name and its issubclass check passes, the
registration runs as SGLang's hybrid controller runs it, every PoolName of
SGLang but KV is refused, and v2 results are SGLang's PoolTransferResult
and count as SGLang counts them (count_pool_hits).
"""

import logging
import os

import numpy as np
import pytest

import sglang_env

hs, bf = sglang_env.load()

import kvreshard.sglang as ks  # noqa: E402
from kvreshard.sglang import compat  # noqa: E402
import oracle as o  # noqa: E402
from sglang_pools import (PAGE, FakeLogicalHostPool, FakeMambaPoolHost, FakeMHAHostPool,  # noqa: E402
                          FakeMLAHostPool, indices)

LAYERS = 7
KV_HEADS = 4
KEYS = ["9f86d081884c7d65", "a665a45920422f9d", "b3a8e0e1f9ab1bfe"]


def config(url, mla=False, tp=1, t=0, **extra):
    e = {"backend_name": "kvreshard", "module_path": "kvreshard.sglang", "class_name": "KvreshardStorage",
         "interface_v1": 1, "url": url}
    e.update(extra)
    return hs.HiCacheStorageConfig(tp_rank=t, tp_size=tp, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                   is_mla_model=mla, enable_storage_metrics=True, is_page_first_layout=True,
                                   model_name="test/model", extra_config=e)


def attach(cfg, pool):
    """What SGLang 0.5.23 does on attach: create_backend, then
    register_mem_pool_host(anchor), then (hybrid controller) every entry
    through register_mem_host_pool_v2, then on_host_pools_registered."""
    b = bf.StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    b.register_mem_host_pool_v2(pool, hs.PoolName.KV)
    b.on_host_pools_registered()
    return b


def test_sglang_classes():
    assert ks.HAVE_SGLANG
    for name in ("HiCacheStorage", "HiCacheStorageConfig", "HiCacheStorageExtraInfo", "PoolName", "PoolTransfer",
                 "PoolTransferResult", "PoolHitPolicy"):
        assert getattr(ks, name) is getattr(hs, name), name
    assert issubclass(ks.KvreshardStorage, hs.HiCacheStorage)


def test_factory(tmp_path):
    """The factory's dynamic path builds KvreshardStorage(config, {})."""
    url = "file://" + str(tmp_path)
    pool = FakeMHAHostPool("page_first", 6, 0, LAYERS, KV_HEADS)
    b = attach(config(url), pool)
    assert type(b) is ks.KvreshardStorage
    assert b.registered_pools == {hs.PoolName.KV: pool} and b.mem_pool_host is pool
    b.close()
    # the factory re-raises the backend's ConfigError
    cfg = config(url)
    del cfg.extra_config["url"]
    with pytest.raises(ks.ConfigError, match='extra_config needs "url"'):
        bf.StorageBackendFactory.create_backend("dynamic", cfg, pool)


def test_every_other_pool_refused(tmp_path):
    """Every PoolName of SGLang but KV is refused at registration, naming it."""
    pool = FakeMHAHostPool("page_first", 6, 0, LAYERS, KV_HEADS)
    b = attach(config("file://" + str(tmp_path)), pool)
    others = [n for n in hs.PoolName if n != hs.PoolName.KV]
    assert len(others) == 22  # SGLang 0.5.23's
    for name in others:
        with pytest.raises(ks.ConfigError) as e:
            b.register_mem_host_pool_v2(FakeMambaPoolHost(), name)
        assert str(e.value).startswith("kvreshard sglang: SGLang registers its %r host pool (FakeMambaPoolHost), "
                                       "which kvreshard does not store" % name.value)
    assert list(b.registered_pools) == [hs.PoolName.KV]
    b.close()


def test_kv_buffer_none(tmp_path):
    """DeepSeek-V4's logical anchor (kv_buffer None) is a ConfigError at
    registration, through SGLang's call order."""
    b = bf.StorageBackendFactory.create_backend("dynamic", config("file://" + str(tmp_path)), None)
    with pytest.raises(ks.ConfigError, match=r"the host pool \(FakeLogicalHostPool\) has no KV bytes"):
        b.register_mem_pool_host(FakeLogicalHostPool())
    b.close()


def test_v2_with_sglang_types(tmp_path, caplog):
    """v2 results are SGLang's PoolTransferResult and dicts that SGLang's
    count_pool_hits counts: an entry for every transfer."""
    url = "file://" + str(tmp_path)
    sp = o.Spec(LAYERS, KV_HEADS, 8, "bf16", PAGE)
    pool = FakeMHAHostPool("page_first", 6, 0, LAYERS, KV_HEADS)
    w = attach(config(url), pool)
    for k, s in zip(KEYS[:2], [0, 1]):
        o.fill_slot(pool.comps(), "page_first", s, sp, o.page(sp, k), (0, LAYERS), (0, KV_HEADS))
    res = w.batch_set_v2([hs.PoolTransfer(name=hs.PoolName.KV, host_indices=indices([0, 1]), keys=KEYS[:2])],
                         hs.HiCacheStorageExtraInfo(prefix_keys=[]))
    assert hs.count_pool_hits(res) == {hs.PoolName.KV: 2}

    rpool = FakeMHAHostPool("layer_first", 6, 0, LAYERS, KV_HEADS)
    r = attach(config(url), rpool)
    q = r.batch_exists_v2(KEYS, [hs.PoolTransfer(name=hs.PoolName.KV, keys=["__placeholder__"])])
    assert q == hs.PoolTransferResult(2, {hs.PoolName.KV: 2})
    assert q.restorable_prefix_pages is None  # every prefix 1..2
    mamba = hs.PoolTransfer(name=hs.PoolName.MAMBA, host_indices=indices([0]), keys=KEYS[1:2],
                            hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)
    assert r.batch_exists_v2(KEYS, [mamba]) == hs.PoolTransferResult(0, {})
    kv_t = hs.PoolTransfer(name=hs.PoolName.KV, host_indices=indices([5, 4, 3]), keys=KEYS)
    with caplog.at_level(logging.ERROR, logger="kvreshard.sglang"):
        res = r.batch_get_v2([kv_t, mamba])
    assert res == {hs.PoolName.KV: [True, True, False], hs.PoolName.MAMBA: [False]}
    assert hs.count_pool_hits(res) == {hs.PoolName.KV: 2, hs.PoolName.MAMBA: 0}
    for k, s in zip(KEYS[:2], [5, 4]):
        o.check_slot(rpool.comps(), "layer_first", s, sp, o.page(sp, k), (0, LAYERS), (0, KV_HEADS))
    # the KV prefix SGLang folds from the result: min over the pools present
    assert min(hs.count_pool_hits({hs.PoolName.KV: res[hs.PoolName.KV]}).values()) == 2
    w.close()
    r.close()


def test_v1_through_the_controller_calls(tmp_path):
    """SGLang's zero-copy KV path: all(batch_set_v1(keys, host_indices,
    extra_info)) and batch_get_v1 with HiCacheStorageExtraInfo; MLA TP 2,
    rank 1 a replica, and a generator of keys."""
    url = "file://" + str(tmp_path)
    sp = o.Spec(LAYERS, 1, 12, "bf16", PAGE, mla=True)
    ranks = []
    for t in range(2):
        pool = FakeMLAHostPool("page_first_direct", 6, 0, LAYERS)
        ranks.append((attach(config(url, mla=True, tp=2, t=t), pool), pool))
    info = hs.HiCacheStorageExtraInfo(prefix_keys=None)
    for b, pool in ranks:
        for k, s in zip(KEYS, [2, 1, 0]):
            o.fill_slot(pool.comps(), "page_first_direct", s, sp, o.page(sp, k), (0, LAYERS), (0, 1))
        assert all(b.batch_set_v1((k for k in KEYS), indices([2, 1, 0]), info))
    rpool = FakeMLAHostPool("layer_first", 6, 0, LAYERS)
    r = attach(config(url, mla=True), rpool)
    assert r.batch_exists(KEYS, info) == 3
    assert r.batch_get_v1(KEYS, indices([3, 4, 5]), info) == [True] * 3
    for k, s in zip(KEYS, [3, 4, 5]):
        o.check_slot(rpool.comps(), "layer_first", s, sp, o.page(sp, k), (0, LAYERS), (0, 1))
    for b, _ in ranks + [(r, None)]:
        b.close()


def test_storage_metrics_location():
    """get_stats returns SGLang's StorageMetrics, looked up where 0.5.23
    keeps it; that module needs torch-heavy imports, so here (over the
    empty torch) there is none and get_stats is None."""
    d, _ = sglang_env.installed_sglang()
    with open(os.path.join(d, "srt", "observability", "metrics_collector.py")) as f:
        assert "\nclass StorageMetrics" in f.read()
    assert not os.path.exists(os.path.join(d, "srt", "metrics", "collector.py"))  # the old place, before 0.5.10
    assert compat.METRICS_MODULES[0] == "sglang.srt.observability.metrics_collector"
    assert ks.storage_metrics_class() is None


def test_indices_as_sglang_passes_them(tmp_path):
    """host_indices as int64 arrays of page_size tokens a page (SGLang's
    torch tensors are CPU int64; numpy stands in here)."""
    url = "file://" + str(tmp_path)
    pool = FakeMHAHostPool("page_head", 6, 0, LAYERS, KV_HEADS)
    b = attach(config(url), pool)
    res = b.batch_get_v2([hs.PoolTransfer(name=hs.PoolName.KV, host_indices=np.arange(4, dtype=np.int32),
                                          keys=KEYS[:1])])
    assert res == {hs.PoolName.KV: [False]}  # a miss: nothing written
    b.close()
