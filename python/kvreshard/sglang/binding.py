"""How an SGLang host pool and storage config become a kvreshard Model,
Placement and Pool (bind), and the PP split, context parallelism and
extra_config values that go into it. ConfigError when they disagree or
are not supported."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, overload

import kvreshard as kv

from .compat import HiCacheStorageConfig, sglang_pp_indices

class ConfigError(kv.InvalidArgument):
    """The backend cannot start: its configuration, the host pool and the
    framework's placement disagree."""

    def __init__(self, message: str) -> None:
        super().__init__("kvreshard sglang: " + message, 1)


def sglang_stage(layers: int, pp_rank: int, pp_size: int) -> Tuple[int, int]:
    """[start, end) of PP stage pp_rank by SGLang's rule: the
    SGLANG_PP_LAYER_PARTITION override (comma-separated layer counts), else
    layers // pp_size each, the remainder one each to the last stages.
    (kvreshard's own default gives it to the first stages.)"""
    env = os.environ.get("SGLANG_PP_LAYER_PARTITION")
    if env is not None:
        try:
            counts = [int(x) for x in env.split(",")]
        except ValueError:
            raise ConfigError("SGLANG_PP_LAYER_PARTITION=%r is not a list of layer counts" % env) from None
        if len(counts) != pp_size or sum(counts) != layers:
            raise ConfigError("SGLANG_PP_LAYER_PARTITION=%r does not split %d layers into %d stages"
                              % (env, layers, pp_size))
        start = sum(counts[:pp_rank])
        return start, start + counts[pp_rank]
    base, extra = divmod(layers, pp_size)
    first_long = pp_size - extra  # stages from here on hold base + 1 layers
    start = pp_rank * base + max(0, pp_rank - first_long)
    return start, start + base + (1 if pp_rank >= first_long else 0)


def sglang_split(layers: int, pp_size: int) -> List[int]:
    """The layers of each PP stage as SGLang splits them: its own
    get_pp_indices when importable, else sglang_stage."""
    get_pp_indices = sglang_pp_indices() or sglang_stage
    out, at = [], 0
    for r in range(pp_size):
        s, e = get_pp_indices(layers, r, pp_size)
        if s != at or e <= s:
            raise ConfigError("the framework's PP split of %d layers into %d stages gives stage %d "
                              "layers [%d, %d), not a contiguous split" % (layers, pp_size, r, s, e))
        out.append(e - s)
        at = e
    if at != layers:
        raise ConfigError("the framework's PP split covers %d of %d layers" % (at, layers))
    return out


# SGLang's host pool layouts (--hicache-mem-layout) that the backend binds,
# by SGLang's names: each is stored as the kvreshard pool layout of the same
# name. SGLang's page_unified and page_first_kv_split are not among them.
HOST_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")

_FP8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
           "float32": "fp32", "float": "fp32", "fp32": "fp32", "fp8": "fp8", "uint8": "fp8"}
_DTYPES.update((v, "fp8") for v in _FP8)


def _dtype_name(d: Any) -> str:
    """A torch or numpy dtype (or a kvreshard dtype name) as its bare name."""
    name = getattr(d, "name", None)  # numpy dtype
    if not isinstance(name, str):
        name = str(d)
    return name.rsplit(".", 1)[-1]


def _comp_shape(layout: str, layers: int, size: int, pages: int, page: int, heads: int,
                dim: int) -> Tuple[int, ...]:
    """The shape of one component (K, V or the MLA latent, heads 1) of
    SGLang's host pool of a layout (pool_host/mha.py and mla.py); an MHA
    kv_buffer of equal K and V dims is (2,) + this."""
    return {"layer_first": (layers, size, heads, dim),
            "page_first": (size, layers, heads, dim),
            "page_first_direct": (pages, layers, page, heads, dim),
            "page_head": (pages, heads, page, layers, dim)}[layout]


def _region(t: Any, what: str) -> Any:
    """A host buffer as a kvreshard pool region: a torch tensor by address,
    anything else (numpy) as a buffer."""
    if callable(getattr(t, "data_ptr", None)):
        dev = getattr(getattr(t, "device", None), "type", "cpu")
        if dev != "cpu":
            raise ConfigError("%s is on %s; kvreshard reads into host memory" % (what, dev))
        if not t.is_contiguous():
            raise ConfigError("%s is not contiguous" % what)
        return (t.data_ptr(), t.numel() * t.element_size())
    return t


def _nbytes(t: Any) -> int:
    n = getattr(t, "nbytes", None)
    if isinstance(n, int):
        return n
    return t.numel() * t.element_size()


def extra_int_list(what: str, v: Any) -> List[int]:
    if isinstance(v, str):
        v = [x for x in v.replace("/", ",").split(",") if x.strip()]
    try:
        out = [int(x) for x in v]
    except (TypeError, ValueError):
        raise ConfigError("extra_config %s=%r is not a list of layer counts" % (what, v)) from None
    if not out or any(x <= 0 for x in out):
        raise ConfigError("extra_config %s=%r is not a list of positive layer counts" % (what, v))
    return out


def extra_count(what: str, v: Any) -> int:
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError("extra_config %s=%r is not a whole number >= 0" % (what, v))
    return v


def extra_positive(what: str, v: Any) -> int:
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError("extra_config %s=%r is not a positive whole number" % (what, v))
    return v


def extra_flag(what: str, v: Any) -> bool:
    """A boolean extra_config value: true/false (JSON), or 1/0."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ConfigError("extra_config %s=%r is not true or false" % (what, v))


@dataclass
class Binding:
    """What a host pool and the storage config bind to in kvreshard."""
    model: kv.Model
    placement: kv.Placement
    pool: kv.Pool
    layout: str
    page: int
    slots: int
    pp_layers: List[int]
    page_bytes: int  # this rank's bytes of one page
    cp: int = 1  # context parallelism: the CP size, this rank's CP rank, the interleave
    cp_rank: int = 0
    cp_interleave: int = 1
    host_page: int = 0  # host indices a page in batch_get_v1 and batch_set_v1 (0: page)
    draft_layers: int = 0  # the model's MTP draft layers (the last PP stage holds them)


@overload
def _pool_int(p: Any, name: str, default: int) -> int:
    ...


@overload
def _pool_int(p: Any, name: str, default: None) -> Optional[int]:
    ...


def _pool_int(p: Any, name: str, default: Optional[int]) -> Optional[int]:
    v = getattr(p, name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise ConfigError("the host pool's %s is %r, not an int" % (name, v))
    return v.__index__()


def context_parallel(config: HiCacheStorageConfig, pool: Any,
                     extra: Mapping[str, Any]) -> Tuple[int, int, int, bool]:
    """(cp, cp_rank, cp_interleave, widened) of a rank: the CP size, its CP
    rank, the tokens of each run dealt to a CP rank, and whether SGLang's
    host indices are widened (one page spans page_size x cp indices).

    SGLang's decode context parallelism (--dcp-size) gives the host pool
    dcp_size and dcp_rank: SGLang deals token i of a logical page of
    page_size x dcp_size tokens to DCP rank i % dcp_size (interleave 1),
    each rank's pool holds page_size of them a page, and the controller's
    host indices are logical (widened). Attention context parallelism
    (the storage config's attn_cp_size and attn_cp_rank, SGLang's NSA
    context parallelism) does not say how a page's tokens are dealt:
    extra_config cp_interleave must say it. extra_config cp, when given,
    must agree with the framework's size."""
    dcp, dcp_rank = _pool_int(pool, "dcp_size", 1), _pool_int(pool, "dcp_rank", 0)
    acp = int(getattr(config, "attn_cp_size", 1) or 1)
    acp_rank = int(getattr(config, "attn_cp_rank", 0) or 0)
    if dcp > 1 and acp > 1:
        raise ConfigError("decode context parallelism (the host pool's dcp_size=%d) with attention context "
                          "parallelism (attn_cp_size=%d) is not supported" % (dcp, acp))
    if dcp > 1:
        cp, cp_rank, widened, source = dcp, dcp_rank, True, "the host pool's dcp_size"
    elif acp > 1:
        cp, cp_rank, widened, source = acp, acp_rank, False, "the storage config's attn_cp_size"
    else:
        cp, cp_rank, widened, source = 1, 0, False, None
    if "cp" in extra:
        want = extra_positive("cp", extra["cp"])
        if source is None and want != 1:
            raise ConfigError("extra_config cp=%d, but this rank runs without context parallelism (the host "
                              "pool's dcp_size and the storage config's attn_cp_size are 1): no CP rank to bind"
                              % want)
        if source is not None and want != cp:
            raise ConfigError("extra_config cp=%d, but %s is %d" % (want, source, cp))
    if "cp_interleave" in extra:
        il = extra_positive("cp_interleave", extra["cp_interleave"])
    elif acp > 1:
        raise ConfigError("attention context parallelism (attn_cp_size=%d): give extra_config cp_interleave, "
                          "the tokens of each run of a page dealt to a CP rank round-robin (the page size for "
                          "contiguous slices)" % acp)
    else:
        il = 1
    return cp, cp_rank, il, widened



def bind(config: HiCacheStorageConfig, mem_pool_host: Any, extra: Optional[Dict[str, Any]] = None) -> Binding:
    """The kvreshard Model, Placement and Pool of a rank from SGLang's
    storage config and host pool; ConfigError when they disagree or are not
    supported."""
    extra = dict(config.extra_config or {}) if extra is None else extra
    p = mem_pool_host
    cls = type(p).__name__

    def attr(name: str) -> Any:
        if not hasattr(p, name):
            raise ConfigError("the host pool (%s) has no %s; kvreshard binds SGLang's "
                              "MHATokenToKVPoolHost and MLATokenToKVPoolHost" % (cls, name))
        return getattr(p, name)

    # pools whose bytes are not (only) a KV buffer kvreshard can describe
    kvb = attr("kv_buffer")
    if kvb is None:
        raise ConfigError("the host pool (%s) has no KV bytes (its kv_buffer is None): a logical anchor of a "
                          "hybrid model (DeepSeek-V4) or an allocator-only pool keeps the cache in pools kvreshard "
                          "does not store" % cls)
    if _pool_int(p, "shard_size", 1) > 1:
        raise ConfigError("the host pool (%s) is page-interleaved over %d ranks (shard_size): not supported"
                          % (cls, _pool_int(p, "shard_size", 1)))
    for scales in ("k_scale_host", "v_scale_host", "scale_kv_buffer"):
        if getattr(p, scales, None) is not None:
            raise ConfigError("the host pool (%s) keeps KV scales (%s) beside its kv_buffer (MXFP8): kvreshard "
                              "does not store them" % (cls, scales))
    if getattr(config, "should_split_heads", False):
        raise ConfigError("should_split_heads (tp_lcm_size) is not supported")
    layout = attr("layout")
    if layout not in HOST_LAYOUTS:
        raise ConfigError("host pool layout %r is not one of %s" % (layout, ", ".join(HOST_LAYOUTS)))
    page = int(attr("page_size"))
    pages = int(attr("page_num"))
    size = int(getattr(p, "size", pages * page))
    if size != pages * page:
        raise ConfigError("the host pool has %d tokens, not page_num %d x page_size %d" % (size, pages, page))

    # layers: the stage's target layers [start, end), then MTP draft layers
    start, end = int(attr("start_layer")), int(attr("end_layer"))
    lr = end - start
    if start < 0 or lr <= 0:
        raise ConfigError("the host pool's layers [%d, %d) are empty" % (start, end))
    layer_num = _pool_int(p, "layer_num", lr)
    target = _pool_int(p, "target_layer_num", None)
    if target is None and layer_num != lr:
        raise ConfigError("the host pool holds %d layers but start_layer..end_layer is [%d, %d) and it has no "
                          "target_layer_num to tell MTP draft layers from them" % (layer_num, start, end))
    if target is not None and target != lr:
        raise ConfigError("the host pool's target_layer_num is %d but start_layer..end_layer is [%d, %d): MLA "
                          "layer sharding is not supported" % (target, start, end))
    drafts = layer_num - lr
    if drafts < 0:
        raise ConfigError("the host pool holds %d layers, fewer than its target layers [%d, %d)"
                          % (layer_num, start, end))

    mla = bool(config.is_mla_model)
    if mla:
        dims, heads = [int(attr("kv_cache_dim"))], 1
    else:
        heads, k = int(attr("head_num")), int(attr("head_dim"))
        dims = [k, _pool_int(p, "v_head_dim", k)]
    shapes = [_comp_shape(layout, layer_num, size, pages, page, heads, d) for d in dims]
    if mla:
        comps, what = [kvb], ["kv_buffer"]
        want = [shapes[0]]
    elif isinstance(kvb, (tuple, list)):
        # K and V of different head dims: SGLang keeps them in two buffers
        if len(kvb) != 2:
            raise ConfigError("the host pool's kv_buffer holds %d buffers, not K and V" % len(kvb))
        comps, what, want = list(kvb), ["K buffer", "V buffer"], shapes
    elif dims[0] != dims[1]:
        raise ConfigError("the host pool's head_dim %d and v_head_dim %d differ but its kv_buffer is one tensor"
                          % (dims[0], dims[1]))
    else:
        comps, what, want = [kvb], ["kv_buffer"], [(2,) + shapes[0]]
    for t, w, name in zip(comps, want, what):
        shape = tuple(int(x) for x in getattr(t, "shape", ()))
        if shape != w:
            raise ConfigError("the host pool's %s has shape %s; SGLang's %s%s pool of these sizes has %s"
                              % (name, shape, "MLA " if mla else "", layout, w))

    # dtype: the kvreshard name, and the fp8 variant for the fingerprint
    store_dt = _dtype_name(attr("dtype"))
    dt = _DTYPES.get(store_dt)
    if dt is None:
        raise ConfigError("host pool dtype %s is not one of bfloat16, float16, float32 or an fp8" % store_dt)
    variant = ""
    if dt == "fp8":
        variant = store_dt if store_dt in _FP8 else ""
        dev = getattr(getattr(p, "device_pool", None), "dtype", None)
        if not variant and dev is not None and _dtype_name(dev) in _FP8:
            variant = _dtype_name(dev)
        if not variant:
            variant = str(extra.get("fp8_variant", ""))
            if variant.startswith("float8_"):
                pass
            elif variant:
                variant = "float8_" + variant
        if variant not in _FP8:
            raise ConfigError("the host pool stores fp8 as %s and its variant is unknown: give extra_config "
                              "fp8_variant (e4m3fn or e5m2)" % store_dt)
    item = kv.DTYPES[dt]
    total = 0
    for t, w, name in zip(comps, want, what):
        elems = 1
        for x in w:
            elems *= x
        if _nbytes(t) != elems * item:
            raise ConfigError("the host pool's %s has %d bytes; %s elements of %s have %d"
                              % (name, _nbytes(t), w, dt, elems * item))
        total += elems * item

    tp, pp = int(config.tp_size), int(config.pp_size)
    tp_rank, pp_rank = int(config.tp_rank), int(config.pp_rank)

    cp, cp_rank, il, widened = context_parallel(config, p, extra)
    if widened:
        # SGLang's DCP groups are contiguous runs of dcp_size TP ranks that
        # hold the same heads and different tokens: kvreshard's TP is the
        # groups, its TP rank the group, its CP rank the rank in the group.
        if tp % cp:
            raise ConfigError("dcp_size %d does not divide tp_size %d" % (cp, tp))
        if tp_rank % cp != cp_rank:
            raise ConfigError("the host pool's dcp_rank %d is not tp_rank %d mod dcp_size %d: SGLang's DCP "
                              "groups are runs of dcp_size TP ranks" % (cp_rank, tp_rank, cp))
        tp, tp_rank = tp // cp, tp_rank // cp

    # the whole PP split of the target layers, from extra_config or the
    # framework's rule
    if "pp_layers" in extra:
        split = extra_int_list("pp_layers", extra["pp_layers"])
        if len(split) != pp:
            raise ConfigError("extra_config pp_layers=%r has %d stages; pp_size is %d"
                              % (extra["pp_layers"], len(split), pp))
        layers = sum(split)
        if "layers" in extra and extra_positive("layers", extra["layers"]) != layers:
            raise ConfigError("extra_config pp_layers=%r sums to %d layers, layers is %s"
                              % (extra["pp_layers"], layers, extra["layers"]))
    else:
        if "layers" in extra:
            layers = extra_positive("layers", extra["layers"])
        elif pp == 1:
            layers = end
        elif os.environ.get("SGLANG_PP_LAYER_PARTITION"):
            layers = sum(extra_int_list("SGLANG_PP_LAYER_PARTITION", os.environ["SGLANG_PP_LAYER_PARTITION"]))
        else:
            raise ConfigError("with PP %d the model's layer count is needed: give extra_config layers "
                              "(or pp_layers)" % pp)
        if layers < pp:
            raise ConfigError("%d layers cannot be split into %d PP stages" % (layers, pp))
        split = sglang_split(layers, pp)
    s0 = sum(split[:pp_rank])
    if (s0, s0 + split[pp_rank]) != (start, end):
        raise ConfigError("PP rank %d's host pool holds layers [%d, %d) but the PP split %s of %d layers "
                          "gives it [%d, %d): set extra_config pp_layers to the split the model runs with"
                          % (pp_rank, start, end, "/".join(map(str, split)), layers, s0, s0 + split[pp_rank]))

    # MTP draft layers: SGLang runs the draft on the last PP stage, whose
    # host pool holds them after its target layers; the model's layers are
    # the target's and then the drafts', which the last stage holds.
    last = pp_rank == pp - 1
    if drafts and not last:
        raise ConfigError("PP rank %d's host pool holds %d MTP draft layers, but SGLang runs the draft on the "
                          "last PP stage (%d) only" % (pp_rank, drafts, pp - 1))
    if "draft_layers" in extra:
        model_drafts = extra_count("draft_layers", extra["draft_layers"])
        if last and model_drafts != drafts:
            raise ConfigError("extra_config draft_layers=%d, but the host pool of the last PP stage holds %d "
                              "(layer_num %d, target layers [%d, %d))"
                              % (model_drafts, drafts, layer_num, start, end))
    elif drafts and pp > 1:
        raise ConfigError("the host pool holds %d MTP draft layers after its target layers [%d, %d); the other "
                          "PP stages' pools do not show them: give every rank extra_config draft_layers=%d"
                          % (drafts, start, end, drafts))
    else:
        model_drafts = drafts
    kv_split = split[:-1] + [split[-1] + model_drafts]

    # KV heads: the pool holds this TP rank's
    if mla:
        kv_heads = 1
    elif "kv_heads" in extra:
        kv_heads = extra_positive("kv_heads", extra["kv_heads"])
        if kv_heads >= tp and kv_heads % tp or kv_heads < tp and tp % kv_heads:
            raise ConfigError("extra_config kv_heads=%d cannot be placed on TP %d: one must divide the other"
                              % (kv_heads, tp))
        local = kv_heads // tp if kv_heads >= tp else 1
        if heads != local:
            raise ConfigError("extra_config kv_heads=%d on TP %d gives %d heads a rank; the host pool has %d"
                              % (kv_heads, tp, local, heads))
    else:
        kv_heads = heads * tp

    name = extra.get("model_name") or config.model_name
    if not name:
        raise ConfigError("no model name: SGLang passes none; give extra_config model_name")
    fp = [str(extra.get("fingerprint", ""))]
    if variant:
        fp.append("fp8=" + variant)
    model = kv.Model(layers=layers + model_drafts, kv_heads=kv_heads, head_dim=dims[0], dtype=dt, page=page * cp,
                     v_head_dim=None if mla or dims[1] == dims[0] else dims[1], mla=mla,
                     name=str(name), revision=str(extra.get("revision", "0")),
                     namespace=str(extra.get("namespace", "kvreshard")),
                     fingerprint=";".join(x for x in fp if x), draft_layers=model_drafts)
    placement = kv.Placement(tp=tp, pp=pp, rank=(tp_rank, pp_rank, cp_rank), pp_layers=kv_split, cp=cp,
                             cp_interleave=il)
    if mla:
        regions = [_region(kvb, "the host pool's kv_buffer")]
    else:
        k_buf, v_buf = (comps[0], comps[1]) if len(comps) == 2 else (kvb[0], kvb[1])
        regions = [_region(k_buf, "the host pool's K buffer"), _region(v_buf, "the host pool's V buffer")]
    pool = kv.Pool(layout, regions, pages)
    return Binding(model, placement, pool, layout, page, pages, kv_split,
                   page_bytes=total // pages, cp=cp, cp_rank=cp_rank, cp_interleave=il,
                   host_page=page * cp if widened else page, draft_layers=model_drafts)

