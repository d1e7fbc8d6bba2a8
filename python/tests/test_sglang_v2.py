"""SGLang's v2 interface of the backend (register_mem_host_pool_v2,
batch_exists_v2, batch_get_v2, batch_set_v2): the KV pool's transfers,
pools kvreshard does not store, registration, and calls that never raise."""

import logging

import pytest

import kvreshard.sglang as ks
import oracle as o
from sglang_pools import FakeLogicalHostPool, FakeMambaPoolHost, FakeMHAHostPool, FakeMLAHostPool, indices
from sglang_instances import KEYS, KV_HEADS, LAYERS, comps, config, load_backend, spec, write


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
