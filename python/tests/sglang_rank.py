"""One SGLang serving rank in its own process, driving kvreshard.sglang
through SGLang's own files (sglang_env): SGLang's HiCacheStorageConfig,
StorageBackendFactory.create_backend("dynamic", ...) with module_path
kvreshard.sglang, the registration SGLang 0.5.23's hybrid controller does
(register_mem_pool_host, register_mem_host_pool_v2(pool, PoolName.KV),
on_host_pools_registered), then v1 or v2 calls with SGLang's PoolTransfer,
on a fake host pool of SGLang's shapes (sglang_pools). A writer fills its
pages from the oracle first; a reader checks every element it read. Prints
one JSON line. Start it with sglang_env.subprocess_env().

    python sglang_rank.py '{"role": "write"|"read", "api": "v1"|"v2", "url": ..|null,
        "tp": .., "pp": .., "rank": [t, p], "split": [..], "layout": .., "mla": false,
        "drafts": 0, "keys": [..], "slots": [..], "extra": {..}}'

drafts: the MTP draft layers the last PP stage's pool holds (the oracle's
page has len(split) stages' layers and then them).
"""

import json
import os
import sys

import sglang_env

hs, bf = sglang_env.load()

import kvreshard.sglang as ks  # noqa: E402
import oracle as o  # noqa: E402
from sglang_pools import PAGE, FakeMHAHostPool, FakeMLAHostPool, indices  # noqa: E402

SLOTS = 6
KV_HEADS = 4
DIM = 8


def spec(a):
    layers = sum(a["split"]) + a.get("drafts", 0)
    if a.get("mla"):
        return o.Spec(layers, 1, 12, "bf16", PAGE, mla=True)
    return o.Spec(layers, KV_HEADS, DIM, "bf16", PAGE)


def main():
    a = json.loads(sys.argv[1])
    assert ks.HAVE_SGLANG and ks.HiCacheStorage is hs.HiCacheStorage and ks.PoolTransfer is hs.PoolTransfer
    tp, pp, (t, p), mla = a["tp"], a["pp"], a["rank"], bool(a.get("mla"))
    start, end = o.stages(a["split"])[p]
    drafts = a.get("drafts", 0) if p == pp - 1 else 0
    if mla:
        pool = FakeMLAHostPool(a["layout"], SLOTS, start, end, draft_layers=drafts)
        heads = (0, 1)
    else:
        pool = FakeMHAHostPool(a["layout"], SLOTS, start, end, head_num=KV_HEADS // tp, draft_layers=drafts)
        heads = o.heads_of(KV_HEADS, tp, t)
    layers = (start, end + drafts)
    extra = {"backend_name": "kvreshard", "module_path": "kvreshard.sglang", "class_name": "KvreshardStorage",
             "interface_v1": 1, "layers": sum(a["split"])}
    if a["url"] is not None:  # else extra names the store (SGLang's Mooncake keys)
        extra["url"] = a["url"]
    extra.update(a.get("extra", {}))
    cfg = hs.HiCacheStorageConfig(tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=mla, enable_storage_metrics=True,
                                  is_page_first_layout=a["layout"] == "page_first", model_name="test/model",
                                  extra_config=extra)
    b = bf.StorageBackendFactory.create_backend("dynamic", cfg, pool)
    assert type(b) is ks.KvreshardStorage, type(b)
    b.register_mem_pool_host(pool)
    b.register_mem_host_pool_v2(pool, hs.PoolName.KV)
    b.on_host_pools_registered()
    sp, keys, slots, v2 = spec(a), a["keys"], a["slots"], a["api"] == "v2"
    idx = indices(slots)
    kv_t = hs.PoolTransfer(name=hs.PoolName.KV, host_indices=idx, keys=keys)
    out = {"pid": os.getpid(), "layers": list(layers), "draft_layers": b.binding.draft_layers,
           "pp_layers": b.binding.pp_layers}
    if a["role"] == "write":
        for k, s in zip(keys, slots):
            o.fill_slot(pool.comps(), a["layout"], s, sp, o.page(sp, k), layers, heads)
        if v2:
            res = b.batch_set_v2([kv_t])
            assert list(res) == [hs.PoolName.KV], res
            out["stored"] = res[hs.PoolName.KV]
            out["stored_pages"] = hs.count_pool_hits(res)[hs.PoolName.KV]
        else:
            out["stored"] = b.batch_set_v1(keys, idx)
        out["writer"] = b.stats()["writer"]
    else:
        if v2:
            q = b.batch_exists_v2(keys, [hs.PoolTransfer(name=hs.PoolName.KV, keys=["__placeholder__"])])
            assert type(q) is hs.PoolTransferResult, type(q)
            out["exists"] = q.kv_hit_pages
            out["exists_pools"] = {str(k): v for k, v in q.extra_pool_hit_pages.items()}
            res = b.batch_get_v2([kv_t])
            out["read"] = res[hs.PoolName.KV]
            out["read_pages"] = hs.count_pool_hits(res)[hs.PoolName.KV]
        else:
            out["exists"] = b.batch_exists(keys)
            out["read"] = b.batch_get_v1(keys, idx)
        n = out["read"].index(False) if False in out["read"] else len(keys)
        for k, s in list(zip(keys, slots))[:n]:
            o.check_slot(pool.comps(), a["layout"], s, sp, o.page(sp, k), layers, heads, "rank %r" % ((t, p),))
        out["checked"] = n
    out["errors"] = b.stats()["errors"]
    b.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
