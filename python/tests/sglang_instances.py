"""The SGLang HiCache backend driven as SGLang drives it, for the
test_sglang_{storage,bind,cp,mtp,v2} files: through a fake storage config
and fake host pools with SGLang 0.5.23's attribute names and kv_buffer
shapes (sglang_pools), without SGLang or torch, that is on the package's
stand-ins for SGLang's classes (test_sglang_files drives it through
SGLang's own). An instance is one backend per rank of a TP x PP topology,
each registered with its host pool; write and check fill and compare
their slots with the oracle's pages."""

import importlib
import itertools

import kvreshard.sglang as ks
import oracle as o
from sglang_pools import DIM, PAGE, FakeMHAHostPool, FakeMLAHostPool, indices

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
