"""The SGLang backend under context parallelism: SGLang's DCP and attention
CP, written by one CP size and read by another, their host indices, and
what refuses to start."""

import logging

import numpy as np
import pytest

import kvreshard as kv
import kvreshard.sglang as ks
import oracle as o
from sglang_pools import DIM, FakeMHAHostPool, FakeMLAHostPool
from sglang_instances import KEYS, KV_HEADS, LAYERS, close, comps, config, load_backend


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
