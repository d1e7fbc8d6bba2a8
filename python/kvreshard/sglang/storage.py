"""KvreshardStorage: the HiCacheStorage backend over a kvreshard store,
SGLang's v1 (zero-copy, interface_v1) and v2 interfaces."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Set, Union

import kvreshard as kv

from .binding import Binding, ConfigError, bind, extra_flag, extra_positive
from .compat import (METRICS_FIELDS, HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo, PoolName,
                     PoolTransfer, PoolTransferResult, numpy_or_none, storage_metrics_class)

if TYPE_CHECKING:
    import numpy

# A v2 transfer's pool name (SGLang's PoolName, or its str value); what
# batch_get_v2 and batch_set_v2 report, a bool a page of each transfer; and
# the extra_info SGLang passes every call.
PoolKey = Union[PoolName, str]
V2Result = Dict[PoolKey, List[bool]]
ExtraInfo = Optional[HiCacheStorageExtraInfo]

logger = logging.getLogger("kvreshard.sglang")


def store_url(storage_config: HiCacheStorageConfig, extra: Dict[str, Any]) -> str:
    """The store extra_config names: "url", or the keys of SGLang's own
    Mooncake backend (master_server_address, metadata_server, protocol,
    device_name, global_segment_size, local_buffer_size) with their
    meaning there, so that an instance moves from SGLang's Mooncake backend
    to kvreshard's by naming this backend (kvreshard.mooncake.url_from_sglang:
    each rank contributes global_segment_size / (tp_size x pp_size), as in
    SGLang)."""
    url = extra.get("url")
    if "master_server_address" in extra:
        if url is not None:
            raise ConfigError('extra_config has both "url" and "master_server_address"; give one: the store '
                              "URL, or the Mooncake master as SGLang's Mooncake backend takes it")
        from .. import mooncake
        try:
            return mooncake.url_from_sglang(extra, ranks=storage_config.tp_size * storage_config.pp_size,
                                            tp_rank=storage_config.tp_rank)
        except ValueError as e:
            msg = str(e)
            raise ConfigError(msg[len("kvreshard: "):] if msg.startswith("kvreshard: ") else msg) from e
    if not url or not isinstance(url, str):
        raise ConfigError('extra_config needs "url", the store (redis://host:port, file:///dir, mooncake://host:port), '
                          'or "master_server_address" with the keys of SGLang\'s Mooncake backend')
    return url


class KvreshardStorage(HiCacheStorage):
    """SGLang HiCache L3 storage over kvreshard (see the doc of kvreshard.sglang).

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

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[Dict[str, Any]] = None) -> None:
        self.config = storage_config
        extra = dict(storage_config.extra_config or {})
        self.extra = extra
        if not extra.get("interface_v1"):
            raise ConfigError('extra_config needs "interface_v1": 1: kvreshard reads and writes the '
                              "host pool in place (batch_get_v1, batch_set_v1)")
        url = store_url(storage_config, extra)
        if "max_procs" in extra:
            n = extra_positive("max_procs", extra["max_procs"])
            try:
                kv.set_max_procs(n)
            except kv.InvalidArgument as e:
                raise ConfigError("extra_config max_procs=%d: %s" % (n, str(e).replace("kvreshard: set_max_procs: ", "")))
        self.check_parts = extra_flag("check_parts", extra.get("check_parts", False))
        self.binding: Optional[Binding] = None
        self._reader: Optional[kv.Reader] = None
        self._writer: Optional[kv.Writer] = None
        self._mu = threading.Lock()
        self._unstored: Set[str] = set()  # names of pools a v2 call named that are not stored (logged once)
        self._reset_counters()
        self.store = kv.Store(url)
        logger.info("kvreshard: store %s, TP %d/%d, PP %d/%d, attention CP %d/%d", url, storage_config.tp_rank,
                    storage_config.tp_size, storage_config.pp_rank, storage_config.pp_size,
                    getattr(storage_config, "attn_cp_rank", 0), getattr(storage_config, "attn_cp_size", 1))

    def _reset_counters(self) -> None:
        self.counters: Dict[str, int] = {"get_batches": 0, "get_pages": 0, "get_hits": 0, "set_batches": 0,
                         "set_pages": 0, "set_ok": 0, "errors": 0}
        self._metrics: Dict[str, List[float]] = {f: [] for f in METRICS_FIELDS}

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
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

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: PoolKey) -> None:
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

    def on_host_pools_registered(self) -> None:
        """SGLang's registration is over: a KV pool must be bound."""
        if self.binding is None:
            raise ConfigError("SGLang registered no KV host pool")

    def _slots(self, host_indices: Any, n: int) -> Union[List[int], numpy.ndarray]:
        """Host token indices (page_size per page, page-aligned; page_size x
        dcp_size under DCP, whose indices are logical) to pool slots."""
        b = self.binding
        if b is None:
            raise kv.InvalidArgument("kvreshard: no host pool registered", 1)
        ps = b.host_page or b.page
        np = numpy_or_none()
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

    def batch_exists(self, keys: Iterable[str], extra_info: ExtraInfo = None) -> int:
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

    def batch_get_v1(self, keys: Iterable[str], host_indices: Any, extra_info: ExtraInfo = None) -> List[bool]:
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

    def batch_set_v1(self, keys: Iterable[str], host_indices: Any, extra_info: ExtraInfo = None) -> List[bool]:
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

    def _count(self, **kw: int) -> None:
        with self._mu:
            for k, v in kw.items():
                self.counters[k] += v

    # SGLang's v2 interface: the KV pool's transfers are v1's calls; every
    # other pool is one kvreshard does not store (register_mem_host_pool_v2
    # refuses them, so SGLang should never name one).
    def _unstored_pool(self, what: str, name: str) -> None:
        with self._mu:
            self.counters["errors"] += 1
            first = name not in self._unstored
            self._unstored.add(name)
        if first:
            logger.error("kvreshard: %s names the %r pool, which kvreshard does not store: its pages are "
                         "reported missing (logged once a pool)", what, name)

    def batch_exists_v2(self, keys: Iterable[str], pool_transfers: Optional[Iterable[PoolTransfer]] = None,
                        extra_info: ExtraInfo = None) -> PoolTransferResult:
        """PoolTransferResult: kv_hit_pages is the leading run of keys the
        store holds complete, reported for PoolName.KV and for the KV
        transfers among pool_transfers; a transfer of another pool makes
        the prefix unusable (kv_hit_pages 0, no hits). Never raises."""
        try:
            pages = self.batch_exists(keys, extra_info)
            hits: Dict[PoolKey, int] = {}
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

    def batch_get_v2(self, transfers: Iterable[PoolTransfer], extra_info: ExtraInfo = None) -> V2Result:
        """Read each PoolName.KV transfer's pages (batch_get_v1 of its keys
        and host_indices); {transfer name: [page read]} for every transfer,
        all False for a pool kvreshard does not store. Never raises."""
        return self._v2("batch_get_v2", self.batch_get_v1, transfers, extra_info)

    def batch_set_v2(self, transfers: Iterable[PoolTransfer], extra_info: ExtraInfo = None) -> V2Result:
        """Write each PoolName.KV transfer's pages (batch_set_v1);
        {transfer name: [page stored]} for every transfer, all False for a
        pool kvreshard does not store. Never raises."""
        return self._v2("batch_set_v2", self.batch_set_v1, transfers, extra_info)

    def _v2(self, what: str, io: Callable[[List[str], Any, ExtraInfo], List[bool]],
            transfers: Iterable[PoolTransfer], extra_info: ExtraInfo) -> V2Result:
        out: V2Result = {}
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
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> None:
        return None

    def batch_get(self, keys: Iterable[str], target_locations: Any = None, target_sizes: Any = None) -> List[None]:
        try:
            return [None] * len(_key_list(keys))
        except Exception:
            return []

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return False

    def batch_set(self, keys: Iterable[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        return False

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics since the last call (pages and GB/s of
        each read and write batch); None (which SGLang takes for empty
        metrics) when SGLang's StorageMetrics cannot be imported or built."""
        with self._mu:
            lists, self._metrics = self._metrics, {f: [] for f in METRICS_FIELDS}
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

    def stats(self) -> Dict[str, Any]:
        """This backend's counters and the reader's and writer's, as a dict."""
        with self._mu:
            out = dict(self.counters)
        if self._reader is not None and not self._reader.closed:
            out["reader"] = self._reader.stats()._asdict()
        if self._writer is not None and not self._writer.closed:
            out["writer"] = self._writer.stats()._asdict()
        return out

    def clear(self) -> None:
        """Reset this backend's counters and metrics. The store's pages stay:
        they are shared with every other rank and instance (see the class doc)."""
        with self._mu:
            self._reset_counters()

    def close(self) -> None:
        """Close the reader, the writer and the store (SGLang's detach calls it)."""
        for o in (self._reader, self._writer, getattr(self, "store", None)):
            if o is not None:
                try:
                    o.close()
                except Exception as e:
                    logger.error("kvreshard: close: %s", e)


def _key_list(keys: Iterable[str]) -> List[str]:
    """keys (any iterable of str: a list, a generator) as a list."""
    if isinstance(keys, list):
        return keys
    if isinstance(keys, (str, bytes)):
        raise TypeError("keys must be an iterable of str, not one %s" % type(keys).__name__)
    return list(keys)


def _pool_name(name: Any) -> str:
    """A PoolName (or its str value) as its str value."""
    return str(getattr(name, "value", name))

