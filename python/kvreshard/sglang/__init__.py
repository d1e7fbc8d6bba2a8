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
when SGLang's hicache_storage module is importable; otherwise the package
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
- ``url``: the store, e.g. ``redis://host:6379``, ``file:///dir`` or
  ``mooncake://master:50051?protocol=tcp``; or, instead of ``url``, the keys
  of SGLang's own Mooncake backend, with its meaning and defaults
  (``master_server_address``, ``metadata_server``, ``protocol``,
  ``device_name``, ``global_segment_size``, ``local_buffer_size``: see
  kvreshard.mooncake.url_from_sglang; each of the instance's TP x PP ranks
  contributes its share of global_segment_size), so that moving an instance
  from SGLang's Mooncake backend to kvreshard's changes only the backend's
  name. One of the two is required.
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

# The package's modules: compat (SGLang's classes or their stand-ins, and
# what moved between SGLang versions), binding (a host pool and storage
# config as a kvreshard Model, Placement and Pool) and storage
# (KvreshardStorage). Everything below is the package's public API, as
# kvreshard.sglang was one module before.
from .binding import HOST_LAYOUTS, Binding, ConfigError, bind, context_parallel, sglang_split, sglang_stage
from .compat import (HAVE_SGLANG, HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo, PoolHitPolicy,
                     PoolName, PoolTransfer, PoolTransferResult, storage_metrics_class)
from .storage import KvreshardStorage

__all__ = [
    "KvreshardStorage", "ConfigError", "Binding", "bind", "context_parallel", "sglang_stage", "sglang_split",
    "storage_metrics_class", "HAVE_SGLANG", "HiCacheStorage", "HiCacheStorageConfig", "HiCacheStorageExtraInfo",
    "PoolName", "PoolHitPolicy", "PoolTransfer", "PoolTransferResult", "HOST_LAYOUTS",
]
