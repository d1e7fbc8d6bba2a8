"""How a host pool and storage config bind (kvreshard.sglang.bind): what
refuses to start and why (the exact ConfigError), SGLang's PP split and
its overrides, and the model domain that keeps other dtypes, tenants and
models apart."""

import os

import numpy as np
import pytest

import kvreshard as kv
import kvreshard.sglang as ks
import oracle as o
from sglang_pools import FakeMHAHostPool, indices
from sglang_instances import KEYS, KV_HEADS, LAYERS, check, close, config, instance, load_backend, spec, write


def test_mooncake_keys(monkeypatch):
    """SGLang's Mooncake keys in extra_config, without "url", name the same
    Mooncake store and client as SGLang's own backend: each of the
    instance's TP x PP ranks contributes its share of global_segment_size,
    and a JSON device_name map gives the rank its device."""
    for v in ("MOONCAKE_PROTOCOL", "MOONCAKE_LOCAL_HOSTNAME", "LOCAL_HOSTNAME"):
        monkeypatch.delenv(v, raising=False)
    opened = []

    class Opened(Exception):
        pass

    def store(url):
        opened.append(url)
        raise Opened()

    monkeypatch.setattr(kv, "Store", store)
    cfg = config(2, 2, 1, 0, None, master_server_address="10.0.0.5:50051", protocol="tcp",
                 global_segment_size="8gb", device_name='{"0": "mlx5_0", "1": "mlx5_1"}')
    del cfg.extra_config["url"]
    with pytest.raises(Opened):
        load_backend(cfg)
    assert opened == ["mooncake://10.0.0.5:50051?metadata=P2PHANDSHAKE&protocol=tcp&device=mlx5_1&"
                      "segment=2147483648&buffer=16777216&local_hostname=localhost"]


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
    refused(cfg, pool, 'extra_config needs "url", the store (redis://host:port, file:///dir, mooncake://host:port), '
                       'or "master_server_address" with the keys of SGLang\'s Mooncake backend')
    cfg = config(1, 1, 0, 0, url, master_server_address="127.0.0.1:50051")
    refused(cfg, pool, 'extra_config has both "url" and "master_server_address"; give one: the store URL, or the '
                       "Mooncake master as SGLang's Mooncake backend takes it")
    cfg = config(1, 1, 0, 0, url, master_server_address="nohostport", protocol="tcp", local_hostname="h")
    del cfg.extra_config["url"]
    refused(cfg, pool, "extra_config master_server_address: mooncake URL 'mooncake://nohostport?metadata="
                       "P2PHANDSHAKE&protocol=tcp&segment=4294967296&buffer=16777216&local_hostname=h': want "
                       "mooncake://HOST:PORT, the master's host and port")
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
    refused(config(1, 1, 0, 0, url, max_procs=0), pool, "extra_config max_procs=0 is not a positive whole number")
    big = kv._max_procs() + 1
    refused(config(1, 1, 0, 0, url, max_procs=big), pool,
            "extra_config max_procs=%d: n=%d is more than %d, the bound of GOMAXPROCS (1024, or the CPUs when more)"
            % (big, big, big - 1))
    refused(config(1, 1, 0, 0, url, max_procs=10**9), pool,
            "extra_config max_procs=1000000000: n=1000000000 is more than %d, the bound of GOMAXPROCS (1024, or "
            "the CPUs when more)" % (big - 1))
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
