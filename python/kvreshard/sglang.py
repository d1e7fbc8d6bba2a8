"""An SGLang HiCache storage backend (L3) over kvreshard.

SGLang loads it with its dynamic backend::

    python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct \\
        --tp-size 4 --pp-size 2 --page-size 64 \\
        --enable-hierarchical-cache --hicache-mem-layout page_first \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvreshard",
            "module_path": "kvreshard.sglang", "class_name": "KvreshardStorage",
            "interface_v1": 1, "url": "redis://10.0.0.5:6379", "layers": 80}'

so that instances of other TP, PP and host-pool layouts (page_first,
page_first_direct, layer_first, page_head) share one copy of each page: each
rank writes its own part and reads only its layers, heads and (with context
parallelism) tokens from any layout. The SGLang classes (HiCacheStorage,
HiCacheStorageConfig, PoolName, PoolTransfer, PoolTransferResult) are used
when SGLang's hicache_storage module is importable; otherwise the module
defines stand-ins with the same names and fields, so that it imports (and
is tested) without SGLang or torch. Written against SGLang 0.5.23.

What it stores: the KV host pool, SGLang's PoolName.KV, in place:

- MHA (MHATokenToKVPoolHost; K and V of other head dims too, when SGLang
  keeps them in two buffers) and MLA (MLATokenToKVPoolHost, the latent).
- MTP speculative decoding whose draft layers SGLang folds into that pool
  (EAGLE with NextN/MTP layers: the pool's layer_num is its target layers
  plus one layer a draft, the drafts after the target layers, while
  start_layer and end_layer stay the target's). A page then holds the
  target's layers and then the draft's; the model domain records the
  draft layers (kvreshard.Model draft_layers), so pools with and without
  them never share a page, and any TP, PP and layout with the same draft
  layers reads them. SGLang runs the draft on the last PP stage only, so
  with PP > 1 the other stages cannot see the draft layers: give every
  rank extra_config ``draft_layers``.
- Context parallelism: SGLang's DCP and attention CP (below).

Both of SGLang's interfaces move the same pages: v1 (batch_exists,
batch_get_v1, batch_set_v1, with ``interface_v1``) and v2 (batch_exists_v2,
batch_get_v2, batch_set_v2 for PoolName.KV transfers; kv_hit_pages is the
leading run of complete pages). SGLang 0.5.23 moves KV pages through v1
and asks v2 about side pools only; the KV transfers of v2 serve callers
that send KV through it. A pool other than KV (Mamba, SWA,
auxiliary SWA, indexer, the DeepSeek-V4 pools, draft sidecars, ...) is not
stored: register_mem_host_pool_v2 refuses it (ConfigError naming it)
before serving starts, and should a v2 call name one anyway its entry is
all False and batch_exists_v2 reports no hit. A KV pool without bytes
(kv_buffer None: DeepSeek-V4's logical anchor, an allocator-only MLA pool)
is refused too. No v1 or v2 call raises or returns None (either kills
SGLang's prefetch or backup thread for good): errors are logged and the
pages reported as not read, not written or missing.

extra_config keys (besides SGLang's backend_name, module_path, class_name):

- ``interface_v1``: must be 1: kvreshard reads and writes the host pool in
  place (batch_get_v1, batch_set_v1, and v2 on top of them) and has no
  copying interface.
- ``url`` (required): the store, e.g. ``redis://host:6379`` or ``file:///dir``.
- ``layers``: the model's layers (without MTP draft layers); required with
  PP > 1 unless ``pp_layers`` or SGLANG_PP_LAYER_PARTITION gives the split.
- ``pp_layers``: the PP split (layers per stage, a list or "a,b,c", without
  draft layers); by default SGLang's own rule
  (sglang.srt.distributed.utils.get_pp_indices, which honours
  SGLANG_PP_LAYER_PARTITION; the same rule is built in when SGLang is not
  importable). Every rank checks that its host pool's start_layer and
  end_layer are its stage of the split, and refuses to start otherwise: a
  wrong split puts layers in the wrong place.
- ``draft_layers``: the MTP draft layers (0 or more) the last PP stage's
  host pool holds after its target layers; by default what the pool says.
  Required on every rank with PP > 1 and MTP (the last stage refuses to
  start without it); checked against the pool where the pool has them.
- ``kv_heads``: the model's KV heads; by default head_num x tp_size (x
  tp_size / dcp_size under DCP), which is wrong when TP exceeds the KV heads
  (heads replicated): give it then.
- ``namespace`` (default "kvreshard"), ``revision`` (default "0"),
  ``fingerprint``, ``model_name`` (default SGLang's model name): with the
  dtype and the shapes they make the model domain, so another model, dtype,
  revision or tenant never shares pages. An fp8 cache (stored as uint8)
  adds its variant (float8_e4m3fn, float8_e5m2) to the fingerprint, from
  the pool where it says (older SGLang's device_pool) or ``fp8_variant``,
  which SGLang 0.5.23's host pools need.
- ``part_layout``: PLHD, LPHD or HPLD, how this instance's parts are
  stored (default: the pool layout's own).
- ``check_parts`` (default false): kvreshard.Reader's check_parts: every
  byte a read copies into the host pool is checked against the checksums
  its part was stored with, and a page that fails is not a hit. Checked
  reads are staged (through a buffer, with the checksum blocks around the
  bytes needed), never direct: see the package README for what it costs.
- ``max_procs``: cap the Go runtime's threads in this rank process.
- ``cp_interleave``: the tokens of each run of a page dealt to a CP rank
  round-robin (context parallelism, below); ``cp``: the CP size, checked
  against the framework's when given.

SGLang's own extra_config keys (prefetch_threshold, prefetch_timeout_base,
prefetch_timeout_per_ki_token, hicache_storage_pass_prefix_keys,
tp_lcm_size) are SGLang's: it takes them out before the backend sees the
rest.

Context parallelism. Under SGLang's decode context parallelism
(``--dcp-size``) the host pool carries ``dcp_size`` and ``dcp_rank``: a
logical page spans page_size x dcp_size tokens ("DCP widens the page size"),
token i of it lives on DCP rank i % dcp_size (interleave 1; extra_config
cp_interleave may say otherwise), each rank's pool holds page_size of them a
page, and the host indices SGLang passes are logical (page_size x dcp_size a
page). The backend binds model page = page_size x dcp_size, CP = dcp_size,
CP rank = dcp_rank, and TP = tp_size / dcp_size with TP rank tp_rank /
dcp_size (SGLang's DCP groups are runs of dcp_size TP ranks holding the same
heads), so that such an instance and one of another DCP size, or none, share
pages. (SGLang 0.5.23 attaches only its file and mooncake backends under
DCP.) Attention context parallelism (the storage config's ``attn_cp_size``
and ``attn_cp_rank``, SGLang's NSA context parallel) binds CP = attn_cp_size
and CP rank = attn_cp_rank over pages of page_size x attn_cp_size tokens,
host indices page_size a page, once extra_config ``cp_interleave`` says how
its tokens are dealt (SGLang's config does not): without it the backend
refuses to start.

Not supported (refused at start): pools other than KV (above), a KV pool
without bytes, DCP and attention context parallelism at once, head
splitting across heterogeneous TP (should_split_heads), MLA layer sharding
(target_layer_num not end_layer - start_layer), page-interleaved KV sharding
(shard_size > 1), pools with KV scales (MXFP8), SGLang's page_unified and
page_first_kv_split layouts, and MTP draft layers on a PP stage other than
the last.
"""

import importlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Optional

import kvreshard as kv

logger = logging.getLogger(__name__)

try:  # the real classes when SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import (  # noqa: F401
        HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo)
    HAVE_SGLANG = True
except Exception:  # ImportError, or SGLang without torch or a GPU
    HAVE_SGLANG = False

    class HiCacheStorage:
        """Stand-in for sglang.srt.mem_cache.hicache_storage.HiCacheStorage
        (same method names) when SGLang is not importable."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name):
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def on_host_pools_registered(self):
            pass

        def batch_exists(self, keys, extra_info=None):
            for i, k in enumerate(keys):
                if not self.exists(k):
                    return i
            return len(keys)

        def clear(self):
            pass

        def get_stats(self):
            return None

    @dataclass
    class HiCacheStorageConfig:
        """Stand-in for SGLang's HiCacheStorageConfig (0.5.23's fields)."""
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        dp_rank: int = 0
        extra_config: Optional[dict] = None
        dcp_size: int = 1
        dcp_rank: int = 0
        logical_page_size: Optional[int] = None

    @dataclass
    class HiCacheStorageExtraInfo:
        """Stand-in for SGLang's HiCacheStorageExtraInfo."""
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

try:  # the v2 interface's classes (SGLang 0.5.10 and later)
    from sglang.srt.mem_cache.hicache_storage import (  # noqa: F401
        PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult)
except Exception:
    class PoolName(str, Enum):
        """Stand-in for SGLang's PoolName: the pools this module's docs and
        tests name. SGLang has more, and adds some in most releases: the
        backend treats names as an open set (anything but "kv" is a pool
        it does not store)."""
        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DRAFT = "draft"

        def __str__(self):
            return self.value

    class PoolHitPolicy(str, Enum):
        """Stand-in for SGLang's PoolHitPolicy."""
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"
        BLOCK_GROUPS = "block_groups"

    @dataclass
    class PoolTransfer:
        """Stand-in for SGLang's PoolTransfer (the fields a storage backend
        reads: host_indices are slots of the host pool registered under
        name, page_size of them a page)."""
        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[List[str]] = None
        hit_policy: Any = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Any = None
        block_pages: int = 0
        group_pages: int = 0

    @dataclass
    class PoolTransferResult:
        """Stand-in for SGLang's PoolTransferResult."""
        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int]
        restorable_prefix_pages: Optional[List[int]] = None


# StorageMetrics, what get_stats returns, is where SGLang keeps it since
# 0.5.10, else where it was before. Importing it pulls in torch-heavy
# modules, so storage_metrics_class looks it up on first use, not here.
_METRICS_MODULES = ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")
_METRICS = ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")
_metrics_class = None  # (the class or None,) once looked up


def storage_metrics_class():
    """SGLang's StorageMetrics class, or None when it cannot be imported
    (looked up once; SGLang asserts that get_stats returns that class or
    None)."""
    global _metrics_class
    if _metrics_class is None:
        found, why = None, []
        for mod in _METRICS_MODULES:
            try:
                found = importlib.import_module(mod).StorageMetrics
                break
            except Exception as e:
                why.append("%s: %s" % (mod, e))
        if found is None:
            logger.info("kvreshard: SGLang's StorageMetrics is not importable (%s): get_stats returns None",
                        "; ".join(why))
        _metrics_class = (found,)
    return _metrics_class[0]


class ConfigError(kv.InvalidArgument):
    """The backend cannot start: its configuration, the host pool and the
    framework's placement disagree."""

    def __init__(self, message):
        super().__init__("kvreshard sglang: " + message, 1)


def sglang_stage(layers, pp_rank, pp_size):
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


def sglang_split(layers, pp_size):
    """The layers of each PP stage as SGLang splits them: its own
    get_pp_indices when importable, else sglang_stage."""
    try:
        from sglang.srt.distributed.utils import get_pp_indices
    except Exception:
        get_pp_indices = sglang_stage
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


_FP8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
           "float32": "fp32", "float": "fp32", "fp32": "fp32", "fp8": "fp8", "uint8": "fp8"}
_DTYPES.update((v, "fp8") for v in _FP8)


def _dtype_name(d):
    """A torch or numpy dtype (or a kvreshard dtype name) as its bare name."""
    name = getattr(d, "name", None)  # numpy dtype
    if not isinstance(name, str):
        name = str(d)
    return name.rsplit(".", 1)[-1]


def _comp_shape(layout, layers, size, pages, page, heads, dim):
    """The shape of one component (K, V or the MLA latent, heads 1) of
    SGLang's host pool of a layout (pool_host/mha.py and mla.py); an MHA
    kv_buffer of equal K and V dims is (2,) + this."""
    return {"layer_first": (layers, size, heads, dim),
            "page_first": (size, layers, heads, dim),
            "page_first_direct": (pages, layers, page, heads, dim),
            "page_head": (pages, heads, page, layers, dim)}[layout]


def _region(t, what):
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


def _nbytes(t):
    n = getattr(t, "nbytes", None)
    if isinstance(n, int):
        return n
    return t.numel() * t.element_size()


def _int_list(what, v):
    if isinstance(v, str):
        v = [x for x in v.replace("/", ",").split(",") if x.strip()]
    try:
        out = [int(x) for x in v]
    except (TypeError, ValueError):
        raise ConfigError("extra_config %s=%r is not a list of layer counts" % (what, v)) from None
    if not out or any(x <= 0 for x in out):
        raise ConfigError("extra_config %s=%r is not a list of positive layer counts" % (what, v))
    return out


def _count(what, v):
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError("extra_config %s=%r is not a whole number >= 0" % (what, v))
    return v


def _positive(what, v):
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError("extra_config %s=%r is not a positive whole number" % (what, v))
    return v


@dataclass
class Binding:
    """What a host pool and the storage config bind to in kvreshard."""
    model: Any
    placement: Any
    pool: Any
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


def _pool_int(p, name, default):
    v = getattr(p, name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise ConfigError("the host pool's %s is %r, not an int" % (name, v))
    return v.__index__()


def context_parallel(config, pool, extra):
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
        want = _positive("cp", extra["cp"])
        if source is None and want != 1:
            raise ConfigError("extra_config cp=%d, but this rank runs without context parallelism (the host "
                              "pool's dcp_size and the storage config's attn_cp_size are 1): no CP rank to bind"
                              % want)
        if source is not None and want != cp:
            raise ConfigError("extra_config cp=%d, but %s is %d" % (want, source, cp))
    if "cp_interleave" in extra:
        il = _positive("cp_interleave", extra["cp_interleave"])
    elif acp > 1:
        raise ConfigError("attention context parallelism (attn_cp_size=%d): give extra_config cp_interleave, "
                          "the tokens of each run of a page dealt to a CP rank round-robin (the page size for "
                          "contiguous slices)" % acp)
    else:
        il = 1
    return cp, cp_rank, il, widened


def bind(config, mem_pool_host, extra=None):
    """The kvreshard Model, Placement and Pool of a rank from SGLang's
    storage config and host pool; ConfigError when they disagree or are not
    supported."""
    extra = dict(config.extra_config or {}) if extra is None else extra
    p = mem_pool_host
    cls = type(p).__name__

    def attr(name):
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
    if layout not in kv.POOL_LAYOUTS:
        raise ConfigError("host pool layout %r is not one of %s" % (layout, ", ".join(kv.POOL_LAYOUTS)))
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
        split = _int_list("pp_layers", extra["pp_layers"])
        if len(split) != pp:
            raise ConfigError("extra_config pp_layers=%r has %d stages; pp_size is %d"
                              % (extra["pp_layers"], len(split), pp))
        layers = sum(split)
        if "layers" in extra and _positive("layers", extra["layers"]) != layers:
            raise ConfigError("extra_config pp_layers=%r sums to %d layers, layers is %s"
                              % (extra["pp_layers"], layers, extra["layers"]))
    else:
        if "layers" in extra:
            layers = _positive("layers", extra["layers"])
        elif pp == 1:
            layers = end
        elif os.environ.get("SGLANG_PP_LAYER_PARTITION"):
            layers = sum(_int_list("SGLANG_PP_LAYER_PARTITION", os.environ["SGLANG_PP_LAYER_PARTITION"]))
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
        model_drafts = _count("draft_layers", extra["draft_layers"])
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
        kv_heads = _positive("kv_heads", extra["kv_heads"])
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


class KvreshardStorage(HiCacheStorage):
    """SGLang HiCache L3 storage over kvreshard (see the module doc).

    The v1 and v2 calls never raise and never return None (an exception or
    None kills SGLang's prefetch or backup thread for good): errors are
    logged and the pages reported as not read, not written or missing.
    Configuration errors raise ConfigError at registration, before serving
    starts.

    clear() cannot clear the store: kvreshard's pages are immutable,
    content-addressed and shared by every rank, instance and tenant of the
    store, so one instance must not delete them (and the C API has no
    delete). clear() resets this backend's counters and metrics only;
    evicting is the store's job (Redis maxmemory, or removing a file
    store's directory while no process uses it).
    """

    def __init__(self, storage_config, kwargs=None):
        self.config = storage_config
        extra = dict(storage_config.extra_config or {})
        self.extra = extra
        if not extra.get("interface_v1"):
            raise ConfigError('extra_config needs "interface_v1": 1: kvreshard reads and writes the '
                              "host pool in place (batch_get_v1, batch_set_v1)")
        url = extra.get("url")
        if not url or not isinstance(url, str):
            raise ConfigError('extra_config needs "url", the store (redis://host:port, file:///dir)')
        if "max_procs" in extra:
            kv.set_max_procs(_positive("max_procs", extra["max_procs"]))
        self.check_parts = _flag("check_parts", extra.get("check_parts", False))
        self.binding = None
        self._reader = self._writer = None
        self._mu = threading.Lock()
        self._unstored = set()  # names of pools a v2 call named that are not stored (logged once)
        self._reset_counters()
        self.store = kv.Store(url)
        logger.info("kvreshard: store %s, TP %d/%d, PP %d/%d, attention CP %d/%d", url, storage_config.tp_rank,
                    storage_config.tp_size, storage_config.pp_rank, storage_config.pp_size,
                    getattr(storage_config, "attn_cp_rank", 0), getattr(storage_config, "attn_cp_size", 1))

    def _reset_counters(self):
        self.counters = {"get_batches": 0, "get_pages": 0, "get_hits": 0, "set_batches": 0,
                         "set_pages": 0, "set_ok": 0, "errors": 0}
        self._metrics = {f: [] for f in _METRICS}

    def register_mem_pool_host(self, mem_pool_host):
        """Bind the rank's host pool: refuses (ConfigError) when the pool,
        the storage config and the PP split disagree, and publishes the
        manifest so that a store that fails stops the start."""
        b = bind(self.config, mem_pool_host, self.extra)
        reader = kv.Reader(self.store, b.model, b.placement, b.pool, check_parts=self.check_parts)
        try:
            writer = kv.Writer(self.store, b.model, b.placement, b.pool, self.extra.get("part_layout"))
        except Exception:
            reader.close()
            raise
        try:
            writer.publish()
        except Exception:
            writer.close()
            reader.close()
            raise
        super().register_mem_pool_host(mem_pool_host)
        self.binding, self._reader, self._writer = b, reader, writer
        logger.info("kvreshard: %r, %r, %r%s", b.model, b.placement, b.pool,
                    ", parts checked" if self.check_parts else "")

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Register a host pool of SGLang's v2 interface: the KV pool (the
        one register_mem_pool_host bound, or bound now) is stored; any other
        pool raises ConfigError naming it: kvreshard does not store it, and
        the model's pages cannot be restored without it."""
        name = _pool_name(host_pool_name)
        if name != "kv":
            raise ConfigError("SGLang registers its %r host pool (%s), which kvreshard does not store: kvreshard "
                              "stores the KV pool only (MHA or MLA, MTP draft layers folded in), not the Mamba, "
                              "SWA, indexer, DeepSeek-V4 or draft sidecar pools of hybrid models"
                              % (name, type(host_pool).__name__))
        if self.binding is None:
            self.register_mem_pool_host(host_pool)
        elif host_pool is not getattr(self, "mem_pool_host", None):
            raise ConfigError("SGLang registers a KV host pool (%s) other than the one bound (%s)"
                              % (type(host_pool).__name__, type(self.mem_pool_host).__name__))
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def on_host_pools_registered(self):
        """SGLang's registration is over: a KV pool must be bound."""
        if self.binding is None:
            raise ConfigError("SGLang registered no KV host pool")

    def _slots(self, host_indices, n):
        """Host token indices (page_size per page, page-aligned; page_size x
        dcp_size under DCP, whose indices are logical) to pool slots."""
        b = self.binding
        if b is None:
            raise kv.InvalidArgument("kvreshard: no host pool registered", 1)
        ps = b.host_page or b.page
        np = kv._numpy()
        if np is not None:
            idx = np.asarray(host_indices)
            if idx.ndim != 1 or idx.shape[0] != n * ps:
                raise kv.InvalidArgument("kvreshard: %s host indices for %d pages of %d tokens"
                                         % ("x".join(map(str, idx.shape)), n, ps), 1)
            if n == 0:
                return np.zeros(0, np.int64)
            if idx.dtype.kind not in "iu":
                raise kv.InvalidArgument("kvreshard: host indices are %s, not integers" % idx.dtype, 1)
            idx = idx.astype(np.int64, copy=False).reshape(n, ps)
            first = idx[:, 0]
            bad = np.flatnonzero(first % ps)
            if len(bad):
                i = int(bad[0])
                raise kv.InvalidArgument("kvreshard: page %d starts at host index %d, not a multiple "
                                         "of the page size %d" % (i, first[i], ps), 1)
            bad = np.flatnonzero((idx != first[:, None] + np.arange(ps)).any(axis=1))
            if len(bad):
                i = int(bad[0])
                raise kv.InvalidArgument("kvreshard: page %d's host indices from %d are not %d "
                                         "consecutive tokens" % (i, first[i], ps), 1)
            slots = first // ps
            bad = np.flatnonzero((slots < 0) | (slots >= b.slots))
            if len(bad):
                i = int(bad[0])
                raise kv.InvalidArgument("kvreshard: page %d's host index %d is outside the host pool "
                                         "of %d tokens" % (i, first[i], b.slots * ps), 1)
            return slots
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) != n * ps:
            raise kv.InvalidArgument("kvreshard: %d host indices for %d pages of %d tokens"
                                     % (len(idx), n, ps), 1)
        slots = []
        for i in range(n):
            f = idx[i * ps]
            if f % ps:
                raise kv.InvalidArgument("kvreshard: page %d starts at host index %d, not a multiple "
                                         "of the page size %d" % (i, f, ps), 1)
            if idx[i * ps:(i + 1) * ps] != list(range(f, f + ps)):
                raise kv.InvalidArgument("kvreshard: page %d's host indices from %d are not %d "
                                         "consecutive tokens" % (i, f, ps), 1)
            if not 0 <= f // ps < b.slots:
                raise kv.InvalidArgument("kvreshard: page %d's host index %d is outside the host pool "
                                         "of %d tokens" % (i, f, b.slots * ps), 1)
            slots.append(f // ps)
        return slots

    def batch_exists(self, keys, extra_info=None):
        """How many leading pages of keys the store holds complete (0 on error, logged)."""
        n = 0
        try:
            keys = _key_list(keys)
            n = len(keys)
            if self._reader is None:
                raise kv.InvalidArgument("kvreshard: no host pool registered", 1)
            return self._reader.exists(keys)
        except Exception as e:
            self._count(errors=1)
            logger.error("kvreshard: batch_exists of %d pages failed: %s", n, e)
            return 0

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read pages (keys: any iterable of page hashes) into the host
        pool; True for each leading page read in full."""
        n, out = 0, []
        try:
            keys = _key_list(keys)
            n = len(keys)
            out = [False] * n
            slots = self._slots(host_indices, n)
            t = time.perf_counter()
            res = self._reader.read(keys, slots)
            dt = time.perf_counter() - t
            for i in range(res.hit):
                out[i] = True
            if res.stop not in (kv.Stop.NONE, kv.Stop.MISS):
                logger.warning("kvreshard: read of %d pages stopped after %d (%s): %s", n, res.hit,
                               res.stop.name.lower(), res.message)
            with self._mu:
                c = self.counters
                c["get_batches"] += 1
                c["get_pages"] += n
                c["get_hits"] += res.hit
                if res.hit:
                    self._metrics["prefetch_pgs"].append(res.hit)
                    self._metrics["prefetch_bandwidth"].append(res.bytes / max(dt, 1e-9) / 1e9)
        except Exception as e:
            self._count(errors=1)
            logger.error("kvreshard: batch_get_v1 of %d pages failed: %s", n, e)
        return out

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Write pages from the host pool; True for each page the store
        holds afterwards (written, already complete, or written by the rank
        that owns the replicated heads). keys: any iterable of page hashes."""
        n, out = 0, []
        try:
            keys = _key_list(keys)
            n = len(keys)
            out = [False] * n
            slots = self._slots(host_indices, n)
            t = time.perf_counter()
            st = self._writer.write(keys, slots)
            dt = time.perf_counter() - t
            good = (kv.WriteStatus.WRITTEN, kv.WriteStatus.COMPLETE, kv.WriteStatus.REPLICA)
            out = [s in good for s in st]
            written = sum(1 for s in st if s == kv.WriteStatus.WRITTEN)
            if not all(out):
                bad = [(keys[i], st[i].name.lower()) for i in range(n) if not out[i]]
                logger.warning("kvreshard: %d of %d pages not written: %s", len(bad), n, bad[:4])
            with self._mu:
                c = self.counters
                c["set_batches"] += 1
                c["set_pages"] += n
                c["set_ok"] += sum(out)
                if written:
                    self._metrics["backup_pgs"].append(written)
                    self._metrics["backup_bandwidth"].append(
                        written * self.binding.page_bytes / max(dt, 1e-9) / 1e9)
        except Exception as e:
            self._count(errors=1)
            logger.error("kvreshard: batch_set_v1 of %d pages failed: %s", n, e)
        return out

    def _count(self, **kw):
        with self._mu:
            for k, v in kw.items():
                self.counters[k] += v

    # SGLang's v2 interface: the KV pool's transfers are v1's calls; every
    # other pool is one kvreshard does not store (register_mem_host_pool_v2
    # refuses them, so SGLang should never name one).
    def _unstored_pool(self, what, name):
        with self._mu:
            self.counters["errors"] += 1
            first = name not in self._unstored
            self._unstored.add(name)
        if first:
            logger.error("kvreshard: %s names the %r pool, which kvreshard does not store: its pages are "
                         "reported missing (logged once a pool)", what, name)

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """PoolTransferResult: kv_hit_pages is the leading run of keys the
        store holds complete, reported for PoolName.KV and for the KV
        transfers among pool_transfers; a transfer of another pool makes
        the prefix unusable (kv_hit_pages 0, no hits). Never raises."""
        try:
            pages = self.batch_exists(keys, extra_info)
            hits = {}
            for t in pool_transfers or ():
                name = getattr(t, "name", None)
                if _pool_name(name) != "kv":
                    self._unstored_pool("batch_exists_v2", _pool_name(name))
                    pages, hits = 0, {}
                    break
                hits[name] = pages
            if pages:
                hits.setdefault(PoolName.KV, pages)
            else:
                hits = {}
            return PoolTransferResult(pages, hits)
        except Exception as e:
            self._count(errors=1)
            logger.error("kvreshard: batch_exists_v2 failed: %s", e)
            return PoolTransferResult(0, {})

    def batch_get_v2(self, transfers, extra_info=None):
        """Read each PoolName.KV transfer's pages (batch_get_v1 of its keys
        and host_indices); {transfer name: [page read]} for every transfer,
        all False for a pool kvreshard does not store. Never raises."""
        return self._v2("batch_get_v2", self.batch_get_v1, transfers, extra_info)

    def batch_set_v2(self, transfers, extra_info=None):
        """Write each PoolName.KV transfer's pages (batch_set_v1);
        {transfer name: [page stored]} for every transfer, all False for a
        pool kvreshard does not store. Never raises."""
        return self._v2("batch_set_v2", self.batch_set_v1, transfers, extra_info)

    def _v2(self, what, io, transfers, extra_info):
        out = {}
        try:
            transfers = list(transfers or ())
        except Exception as e:
            self._count(errors=1)
            logger.error("kvreshard: %s of transfers %r failed: %s", what, transfers, e)
            return out
        for t in transfers:
            try:
                name = getattr(t, "name", None)
                try:
                    keys = _key_list(getattr(t, "keys", None) or ())
                except Exception:
                    keys = []
                if _pool_name(name) == "kv":
                    out[name] = io(keys, getattr(t, "host_indices", None), extra_info)
                else:
                    self._unstored_pool(what, _pool_name(name))
                    out[name] = [False] * len(keys)
            except Exception as e:  # an unhashable name: nothing to report it under
                self._count(errors=1)
                logger.error("kvreshard: %s of transfer %r failed: %s", what, t, e)
        return out

    # The copying interface of HiCacheStorage: kvreshard has only the
    # zero-copy one (interface_v1), so these report misses and failures.
    def exists(self, key):
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        try:
            return [None] * len(_key_list(keys))
        except Exception:
            return []

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        return False

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (pages and GB/s of
        each read and write batch); None (which SGLang takes for empty
        metrics) when SGLang's StorageMetrics cannot be imported or built."""
        with self._mu:
            lists, self._metrics = self._metrics, {f: [] for f in _METRICS}
        cls = storage_metrics_class()
        if cls is None:
            return None
        try:
            m = cls()
            for f, v in lists.items():
                getattr(m, f).extend(v)
            return m
        except Exception as e:
            logger.error("kvreshard: get_stats: %s", e)
            return None

    def stats(self):
        """This backend's counters and the reader's and writer's, as a dict."""
        with self._mu:
            out = dict(self.counters)
        if self._reader is not None and not self._reader.closed:
            out["reader"] = self._reader.stats()._asdict()
        if self._writer is not None and not self._writer.closed:
            out["writer"] = self._writer.stats()._asdict()
        return out

    def clear(self):
        """Reset this backend's counters and metrics. The store's pages stay:
        they are shared with every other rank and instance (see the class doc)."""
        with self._mu:
            self._reset_counters()

    def close(self):
        """Close the reader, the writer and the store (SGLang's detach calls it)."""
        for o in (self._reader, self._writer, getattr(self, "store", None)):
            if o is not None:
                try:
                    o.close()
                except Exception as e:
                    logger.error("kvreshard: close: %s", e)


def _key_list(keys):
    """keys (any iterable of str: a list, a generator) as a list."""
    if isinstance(keys, list):
        return keys
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be an iterable of str, not one %s" % type(keys).__name__)
    return list(keys)


def _pool_name(name):
    """A PoolName (or its str value) as its str value."""
    return str(getattr(name, "value", name))


def _flag(what, v):
    """A boolean extra_config value: true/false (JSON), or 1/0."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ConfigError("extra_config %s=%r is not true or false" % (what, v))
