"""SGLang compatibility of kvreshard.sglang, and what it may run without:
SGLang's HiCache storage classes when its hicache_storage module is
importable, else stand-ins with the same names and fields (so that the
package imports, and is tested, without SGLang or torch); the lookups of
SGLang's StorageMetrics, which moved in 0.5.10, and of its PP split rule;
and numpy, optional. Written against SGLang 0.5.23."""

import importlib
import logging
from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

# the package's one logger (every module logs as kvreshard.sglang)
logger = logging.getLogger("kvreshard.sglang")

try:  # the real classes when SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import (  # noqa: F401
        HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo)
    HAVE_SGLANG = True
except Exception:  # ImportError, or SGLang without torch or a GPU
    HAVE_SGLANG = False

    class HiCacheStorage:
        """Stand-in for sglang.srt.mem_cache.hicache_storage.HiCacheStorage
        (same method names) when SGLang is not importable."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def on_host_pools_registered(self) -> None:
            pass

        def batch_exists(self, keys: List[str], extra_info: Optional["HiCacheStorageExtraInfo"] = None) -> int:
            for i, k in enumerate(keys):
                if not self.exists(k):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self) -> Any:
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

        def __str__(self) -> str:
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
METRICS_MODULES = ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")
METRICS_FIELDS = ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")
_metrics_class: Optional[Tuple[Optional[type]]] = None  # (the class or None,) once looked up


def storage_metrics_class() -> Optional[type]:
    """SGLang's StorageMetrics class, or None when it cannot be imported
    (looked up once; SGLang asserts that get_stats returns that class or
    None)."""
    global _metrics_class
    if _metrics_class is None:
        found, why = None, []
        for mod in METRICS_MODULES:
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


def sglang_pp_indices() -> Optional[Callable[[int, int, int], Tuple[int, int]]]:
    """SGLang's get_pp_indices (its PP layer split, which honours
    SGLANG_PP_LAYER_PARTITION), or None when it cannot be imported."""
    try:
        from sglang.srt.distributed.utils import get_pp_indices
    except Exception:
        return None
    return get_pp_indices


_np: Any = False  # numpy, or None without it, once looked up


def numpy_or_none() -> Optional[ModuleType]:
    """numpy, or None when it is not installed: imported on first use, so
    that the package imports without it (host indices are then read as a
    sequence of ints)."""
    global _np
    if _np is False:
        try:
            import numpy
            _np = numpy
        except ImportError:
            _np = None
    return _np
