"""kvreshard on Mooncake Store: an object engine (kvreshard.h, kvr_engine) over
Mooncake's Python client, mooncake.store.MooncakeDistributedStore.

Open a store with its URL, or wrap a client the process already has::

    st = kvreshard.Store("mooncake://10.0.0.5:50051?protocol=rdma&device=mlx5_0")
    st = kvreshard.Store.from_mooncake(client)   # the caller keeps and closes client

The URL names the master (HOST:PORT) and takes the parameters metadata,
protocol, device, segment, buffer, local_hostname and read_timeout_ms:
see kvreshard.mooncake_url, which reads them (parse_url, parse_size), and
maps SGLang's own Mooncake backend's extra_config to such a URL
(url_from_sglang); kvreshard.mooncake_client sets up a client as the URL
says (connect) and names Mooncake's return codes (code_name). This module
re-exports those names, and holds the engine and the opening of stores on
it (open_url, open_client: Store's and Store.from_mooncake's).

How kvreshard's pages map onto Mooncake objects (claims, parts whose keys
name their manifest, commits) is the Go runtime's (runtime/store/enginestore);
this module only moves objects:

- put: batch_put_from, of an object's bytes where they are when they are
  one fragment, else gathered into one buffer first (Mooncake's TCP
  transport breaks down under a batch of thousands of small buffers, which
  batch_put_from_multi_buffers of a part's runs would be); an object whose
  key exists keeps its first value (Mooncake's put returns 0 for it). A put refused for want of memory
  (-200) is retried a few times a few milliseconds apart, then fails.
  Manifests (the library's objects under meta/) are soft-pinned: Mooncake
  evicts them only when nothing else is left to evict, since every page of
  their layout needs them.
- get (small objects: claims, commits, manifests): batch_get_into;
  exists: batch_is_exist; sizes: batch_get_replica_desc.
- read: one get_into_ranges call for every range of a batch, grouped
  [registered buffer][object][fragment]; ranges that are whole objects go
  through batch_get_into (faster, and it fails within about a second when
  a holder died). Mooncake's OBJECT_NOT_FOUND (-704) is a missing object: a
  miss, never an error. So is an object whose transfer failed
  (TRANSFER_FAIL, -800: its one replica's holder died or cannot be reached,
  and the master lists it until that holder's lease expires): the engine
  removes it, so that a writer's put stores the key anew instead of keeping
  the lost object. A transfer that failed for another reason loses a good
  object that way: a miss, which the next write mends.
- remove: batch_remove(force=True) (a read or an exist check leases an
  object for a while; a removal must not wait for that).
- register_memory and unregister_memory: register_buffer and
  unregister_buffer (ranged reads need registered memory).

Mooncake's client crashes the process when called after its close(): the
engine refuses every call once it is closed, and closes a client it owns
only when the store is closed and no call is in flight.

Mooncake's clients listen on every address of the host: see
kvreshard.mooncake_local for running them on loopback only (tests).
"""

import ctypes
import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import _lib
from ._lib import InvalidArgument, StoreError  # noqa: F401 (kvreshard.mooncake.StoreError)
# re-exported: the URL's and the client's names are kvreshard.mooncake's too
from .mooncake_client import (ERRORS, LEASE_EXPIRED, NO_SPACE, NOT_FOUND, NOT_READY, TRANSFER_FAIL,  # noqa: F401
                              code_name, connect, refused)
from .mooncake_url import DEFAULT_READ_TIMEOUT_MS, parse_size, parse_url, url_from_sglang  # noqa: F401

__all__ = ["MooncakeEngine", "parse_url", "parse_size", "url_from_sglang", "DEFAULT_READ_TIMEOUT_MS"]

# A put refused for want of memory (-200) is tried again this many times,
# after PUT_BACKOFF seconds, then doubling: the master evicts within about
# 10 ms of a failed allocation.
PUT_RETRIES = 5
PUT_BACKOFF = 0.002
# A holder that a transfer failed with, and that does not answer a TCP
# connection within DEAD_HOLDER_CONNECT seconds, is taken for dead for
# DEAD_HOLDER_SECONDS: the master lists its objects until the holder's
# lease (--client_ttl, 10 s by default) expires, and a transfer from it
# fails (or does not return). Meanwhile the engine answers every object the
# master places only there as missing, reads nothing from it, and removes
# such objects as it meets them, so that a put of their keys stores them
# anew (on a live holder) instead of keeping the lost ones.
DEAD_HOLDER_SECONDS = 30
DEAD_HOLDER_CONNECT = 1.0
# A dead holder is asked again at most this often (seconds): one that
# answers is alive again (a new holder at the same address, whose objects
# are not the dead one's), or was never dead.
DEAD_HOLDER_REPROBE = 1.0
# A get of an object that another client is putting (-703) is tried again
# this many times, after GET_BACKOFF seconds, then doubling (0.5 s in all).
GET_RETRIES = 8
GET_BACKOFF = 0.002


def _np() -> Any:
    try:
        import numpy
    except ImportError:
        raise InvalidArgument("kvreshard: the Mooncake engine needs numpy (pip install numpy)", _lib.EINVAL) from None
    return numpy


# Engines whose store is open: their callbacks must outlive every call of
# the library, which ends with their close callback.
_LIVE: Set["MooncakeEngine"] = set()
_LIVE_LOCK = threading.Lock()


class _Closed(Exception):
    pass


class MooncakeEngine:
    """A kvr_engine over a MooncakeDistributedStore client. owned: close the
    client when the store closes. open_store() opens the library's store
    on it, once."""

    def __init__(self, client: Any, name: str, owned: bool = False, read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS,
                 lease_ms: int = 0) -> None:
        if isinstance(read_timeout_ms, bool) or not isinstance(read_timeout_ms, int) or read_timeout_ms < 0:
            raise InvalidArgument("kvreshard: read_timeout_ms must be a non-negative int, not %r"
                                  % (read_timeout_ms,), _lib.EINVAL)
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms < 0:
            raise InvalidArgument("kvreshard: lease_ms must be a non-negative int, not %r" % (lease_ms,),
                                  _lib.EINVAL)
        for m in ("batch_put_from", "batch_get_into", "get_into_ranges", "batch_is_exist", "register_buffer"):
            if not callable(getattr(client, m, None)):
                raise TypeError("kvreshard: the Mooncake client %r has no %s: want a "
                                "mooncake.store.MooncakeDistributedStore (0.3.10 or later)" % (client, m))
        self.np = _np()
        self.client = client
        self._plain, self._pinned = _configs()
        self.name = name
        self.owned = owned
        self.read_timeout_ms = read_timeout_ms
        self.lease_ms = lease_ms
        # transport endpoint of a dead holder -> (monotonic time it is dead until, last probed)
        self._dead: Dict[str, Tuple[float, float]] = {}
        self._mu = threading.Lock()
        self._inflight = 0
        self._closed = False          # the library closed the engine
        self._released = False
        self._opened = False
        self.counts = {"put": 0, "get": 0, "exists": 0, "sizes": 0, "read": 0, "ranges": 0, "whole": 0,
                       "remove": 0, "put_retries": 0, "dropped": 0}
        L = _lib
        self._cbs = (L.ENGINE_PUT(self._wrap("put", self._put)), L.ENGINE_GET(self._wrap("get", self._get)),
                     L.ENGINE_EXISTS(self._wrap("exists", self._exists)),
                     L.ENGINE_SIZES(self._wrap("sizes", self._sizes)), L.ENGINE_READ(self._wrap("read", self._read)),
                     L.ENGINE_REMOVE(self._wrap("remove", self._remove)),
                     L.ENGINE_MEMORY(self._wrap("register_memory", self._register)),
                     L.ENGINE_MEMORY(self._wrap("unregister_memory", self._unregister)),
                     L.ENGINE_CLOSE(self._close_cb))
        c = self._cbs
        self.table = L.CEngine(ctypes.sizeof(L.CEngine), None, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
                               c[8], read_timeout_ms, lease_ms)

    def open_store(self) -> Optional[int]:
        """Open the library's store on this engine; its handle. When the open
        fails the engine is closed (with the client, if owned) and the
        error raised."""
        if self._opened:
            raise InvalidArgument("kvreshard: the Mooncake engine of %s is already open" % self.name, _lib.EINVAL)
        self._opened = True
        with _LIVE_LOCK:
            _LIVE.add(self)
        h = _lib.HANDLE()
        err = _lib.errbuf()
        try:
            rc = _lib.lib().kvr_store_open_engine(ctypes.byref(self.table), self.name.encode("utf-8"),
                                                  ctypes.byref(h), err, _lib.ERRLEN)
            _lib.check(rc, err)
        except BaseException:
            # a refused open does not call close: the engine is still ours
            self._close_cb(None)
            raise
        return h.value

    # -- the life of the client

    def _enter(self) -> None:
        with self._mu:
            if self._closed:
                raise _Closed()
            self._inflight += 1

    def _leave(self) -> None:
        with self._mu:
            self._inflight -= 1
            last = self._closed and self._inflight == 0
        if last:
            self._close_client()

    def _close_cb(self, ctx: Optional[int]) -> None:
        """The library's close: no call enters after it; the client (when
        owned) is closed now, or when the last call in flight returns (a
        read the library gave up on may still be blocked in Mooncake)."""
        try:
            with self._mu:
                self._closed = True
                idle = self._inflight == 0
            if idle:
                self._close_client()
            with _LIVE_LOCK:
                _LIVE.discard(self)
        except BaseException:
            pass

    def _close_client(self) -> None:
        with self._mu:
            if self._released:
                return
            self._released = True
        if self.owned:
            try:
                self.client.close()
            except Exception:
                pass

    @property
    def closed(self) -> bool:
        return self._closed

    def _wrap(self, what: str, f: Callable[..., int]) -> Callable[..., int]:
        """A callback of f: never raises; a failure is a negative return with
        the message in err."""
        def cb(*args: Any) -> int:
            err, errlen = args[-2], args[-1]
            try:
                self._enter()
            except _Closed:
                _write_err(err, errlen, "mooncake engine of %s is closed" % self.name)
                return -1
            except BaseException as e:
                _write_err(err, errlen, "%s: %s" % (what, e))
                return -1
            try:
                return f(*args[1:-2], err, errlen) or 0
            except BaseException as e:
                _write_err(err, errlen, "%s %s: %s: %s" % (self.name, what, type(e).__name__, e))
                return -1
            finally:
                try:
                    self._leave()
                except BaseException:
                    pass
        return cb

    # -- helpers over the C arrays

    def _arr(self, addr: Optional[int], n: int, dtype: Any) -> Any:
        """A numpy view of n elements of dtype at addr (C memory, valid during the call)."""
        np = self.np
        if n == 0 or not addr:
            return np.zeros(0, dtype)
        return np.frombuffer((ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(addr), dtype)

    def _keys(self, n: int, keys: Optional[int], offsets: Optional[int]) -> List[bytes]:
        """The n keys as bytes."""
        off = self._arr(offsets, n + 1, self.np.int64).tolist()
        raw = ctypes.string_at(keys, off[-1]) if off[-1] else b""  # type: ignore[arg-type]  # not NULL then
        return list(map(raw.__getitem__, itertools.starmap(slice, zip(off, off[1:]))))

    # -- callbacks

    def _put(self, n: int, keys: Optional[int], offsets: Optional[int], frags: Optional[int],
             frag_lens: Optional[int], frag_off: Optional[int], results: Optional[int], err: Optional[int],
             errlen: int) -> int:
        np = self.np
        self.counts["put"] += 1
        ks = self._keys(n, keys, offsets)
        if self._dead:
            self._stale(ks)  # a put of a key on a dead holder would keep the lost object
        fo = self._arr(frag_off, n + 1, np.int64)
        nf = int(fo[-1])
        ptrs = self._arr(frags, nf, np.uint64).tolist()
        lens = self._arr(frag_lens, nf, np.int64).tolist()
        res = self._arr(results, n, np.int32)
        counts = np.diff(fo)
        fol = fo.tolist()
        # An object of one fragment is put from where it is; the fragments
        # of the others are gathered into one buffer first: Mooncake's TCP
        # transport fails (TRANSFER_FAIL, and then every transfer to that
        # holder for a while) when a batch carries thousands of small
        # buffers, as batch_put_from_multi_buffers of a part's runs does.
        src, size = [0] * n, [0] * n
        multi = [i for i in range(n) if counts[i] > 1]
        gathered = None
        if multi:
            total = sum(sum(lens[fol[i]:fol[i + 1]]) for i in multi)
            gathered = np.empty(max(total, 1), np.uint8)
            at = gathered.ctypes.data
            move = ctypes.memmove
            for i in multi:
                src[i] = at
                for f in range(fol[i], fol[i + 1]):
                    move(at, ptrs[f], lens[f])
                    at += lens[f]
                size[i] = at - src[i]
        for i in range(n):
            if counts[i] == 1:
                src[i], size[i] = ptrs[fol[i]], lens[fol[i]]

        def put(idx: List[int], config: Any) -> List[int]:
            if not idx:
                return []
            args = ([ks[i] for i in idx], [src[i] for i in idx], [size[i] for i in idx])
            return self.client.batch_put_from(*args) if config is None else self.client.batch_put_from(*args, config)
        todo = [i for i in range(n) if counts[i] > 0]
        for i in range(n):
            if counts[i] == 0:
                res[i] = -600
        first = None
        delay = PUT_BACKOFF
        for attempt in range(PUT_RETRIES + 1):
            # manifests (meta/...) are few, small and needed by every page
            # of their layout: soft-pinned, evicted only when nothing else is
            meta = [i for i in todo if ks[i].startswith(b"meta/")]
            rest = [i for i in todo if not ks[i].startswith(b"meta/")] if meta else todo
            rs = list(put(meta, self._pinned)) + list(put(rest, self._plain))
            todo = meta + rest
            if len(rs) != len(todo):
                raise RuntimeError("batch put answered %d of %d objects" % (len(rs), len(todo)))
            again = []
            for i, r in zip(todo, rs):
                res[i] = 0 if r >= 0 else max(r, -(1 << 31))
                if r == NO_SPACE and attempt < PUT_RETRIES:
                    again.append(i)
                elif r < 0 and first is None:
                    first = (i, r)
            if not again:
                break
            self.counts["put_retries"] += 1
            todo = again
            time.sleep(delay)
            delay *= 2
        if first is not None:
            i, r = first
            _write_err(err, errlen, "%s: put %s: %s%s" % (
                self.name, _show(ks[i]), code_name(r), " (no memory left: evicting was not fast enough, "
                "or the holders are full of leased objects)" if r == NO_SPACE else ""))
        return 0

    def _get(self, n: int, keys: Optional[int], offsets: Optional[int], bufs: Optional[int], caps: Optional[int],
             sizes: Optional[int], err: Optional[int], errlen: int) -> int:
        np = self.np
        self.counts["get"] += 1
        ks = self._keys(n, keys, offsets)
        bl = self._arr(bufs, n, np.uint64).tolist()
        cl = self._arr(caps, n, np.int64).tolist()
        out = self._arr(sizes, n, np.int64)
        stale = self._stale(ks) if self._dead else ()
        if stale:
            live = [i for i in range(n) if ks[i] not in stale]
            rs = [NOT_FOUND] * n
            for i, r in zip(live, self.client.batch_get_into([ks[i] for i in live], [bl[i] for i in live],
                                                            [cl[i] for i in live]) if live else []):
                rs[i] = r
        else:
            rs = list(self.client.batch_get_into(ks, bl, cl))
        if len(rs) != n:
            raise RuntimeError("batch_get_into answered %d of %d objects" % (len(rs), n))
        # An object another client is putting is not ready (-703) for the
        # put's length, and one whose lease ran out while it was read
        # (-707, eviction) may have moved: ask again a few times; an object
        # still not ready is missing (a writer that died mid-put leaves it
        # so for half a minute).
        delay = GET_BACKOFF
        for _ in range(GET_RETRIES):
            busy = [i for i, r in enumerate(rs) if r in (NOT_READY, LEASE_EXPIRED)]
            if not busy:
                break
            time.sleep(delay)
            delay *= 2
            again = self.client.batch_get_into([ks[i] for i in busy], [bl[i] for i in busy], [cl[i] for i in busy])
            for i, r in zip(busy, again):
                rs[i] = r
        lost = [ks[i] for i, r in enumerate(rs) if r == TRANSFER_FAIL]
        if lost:
            self._failed(lost)
        for i, r in enumerate(rs):
            if r == NOT_READY:
                out[i] = _lib.ENGINE_MISSING
                continue
            if r >= 0:
                out[i] = r
            elif r in (NOT_FOUND, TRANSFER_FAIL):
                out[i] = _lib.ENGINE_MISSING
            elif r == -600:
                # a buffer too small, or another invalid argument: ask the size
                size = self.client.get_size(ks[i])
                if size == NOT_FOUND:
                    out[i] = _lib.ENGINE_MISSING
                elif size > cl[i]:
                    out[i] = size  # the library asks again with a buffer of that size
                else:
                    _write_err(err, errlen, "%s: get %s: batch_get_into %s; its size is %s" % (
                        self.name, _show(ks[i]), code_name(r), code_name(size)))
                    return -1
            else:
                _write_err(err, errlen, "%s: get %s: batch_get_into %s" % (self.name, _show(ks[i]), code_name(r)))
                return -1
        return 0

    def _exists(self, n: int, keys: Optional[int], offsets: Optional[int], exists: Optional[int],
                err: Optional[int], errlen: int) -> int:
        np = self.np
        self.counts["exists"] += 1
        ks = self._keys(n, keys, offsets)
        rs = self.client.batch_is_exist(ks)
        if len(rs) != n:
            raise RuntimeError("batch_is_exist answered %d of %d keys" % (len(rs), n))
        try:
            b = bytes(rs)  # 0 and 1, the usual answer
        except ValueError:
            b = None
        if b is None or b.strip(b"\0\1"):
            a = np.asarray(rs, np.int64)
            if (a < 0).any():
                i = int(np.flatnonzero(a < 0)[0])
                _write_err(err, errlen, "%s: batch_is_exist %s: %s" % (self.name, _show(ks[i]), code_name(rs[i])))
                return -1
            b = (a > 0).astype(np.uint8).tobytes()
        if self._dead and b.strip(b"\0"):
            stale = self._stale(ks)
            if stale:
                b = bytes(0 if k in stale else x for k, x in zip(ks, b))
        if n:
            ctypes.memmove(exists, b, n)  # type: ignore[arg-type]  # not NULL when n > 0
        return 0

    def _sizes(self, n: int, keys: Optional[int], offsets: Optional[int], sizes: Optional[int],
               err: Optional[int], errlen: int) -> int:
        np = self.np
        self.counts["sizes"] += 1
        ks = self._keys(n, keys, offsets)
        out = self._arr(sizes, n, np.int64)
        stale = self._stale(ks) if self._dead else ()
        try:
            desc = self.client.batch_get_replica_desc(ks)
        except UnicodeError:  # keys that are not UTF-8: one at a time
            desc = None
        for i, k in enumerate(ks):
            size = None
            if k in stale:
                out[i] = _lib.ENGINE_MISSING
                continue
            if desc is not None:
                reps = desc.get(k.decode("utf-8"))
                if not reps:
                    out[i] = _lib.ENGINE_MISSING
                    continue
                for r in reps:
                    if str(r.status).endswith("COMPLETE") and r.is_memory_replica():
                        size = r.get_memory_descriptor().buffer_descriptor.size
                        break
            if size is None:
                size = self.client.get_size(k)
            if size < 0 and size not in (NOT_FOUND, NOT_READY):
                _write_err(err, errlen, "%s: size of %s: %s" % (self.name, _show(k), code_name(size)))
                return -1
            out[i] = size if size >= 0 else _lib.ENGINE_MISSING
        return 0

    def _read(self, nkeys: int, keys: Optional[int], offsets: Optional[int], nranges: int, key: Optional[int],
              offs: Optional[int], dst: Optional[int], lens: Optional[int], base: Optional[int],
              whole: Optional[int], results: Optional[int], err: Optional[int], errlen: int) -> int:
        np = self.np
        self.counts["read"] += 1
        ks = self._keys(nkeys, keys, offsets)
        K = self._arr(key, nranges, np.int64)
        O = self._arr(offs, nranges, np.int64)
        D = self._arr(dst, nranges, np.uint64)
        L = self._arr(lens, nranges, np.int64)
        B = self._arr(base, nranges, np.uint64)
        W = self._arr(whole, nranges, np.uint8)
        R = self._arr(results, nranges, np.int64)
        got = np.empty(nranges, np.int64)
        skip = None  # ranges of objects on a dead holder: missing, not read
        if self._dead:
            stale = self._stale(ks)
            if stale:
                skip = np.isin(K, [i for i, k in enumerate(ks) if k in stale])
                got[skip] = NOT_FOUND
        wi = np.flatnonzero(W if skip is None else W.astype(bool) & ~skip)
        if len(wi):
            # whole objects: batch_get_into, which fails fast when a holder died
            self.counts["whole"] += len(wi)
            rs = self.client.batch_get_into([ks[k] for k in K[wi].tolist()], D[wi].tolist(), L[wi].tolist())
            if len(rs) != len(wi):
                raise RuntimeError("batch_get_into answered %d of %d objects" % (len(rs), len(wi)))
            got[wi] = rs
        if skip is not None:
            ri = np.flatnonzero((W == 0) & ~skip)
        elif len(wi):
            ri = np.flatnonzero(W == 0)
        else:
            ri = None  # every range, in the library's order
        if ri is None or len(ri):
            self.counts["ranges"] += nranges if ri is None else len(ri)
            # [registered buffer][object][fragment], in one call: the ranges
            # sorted by buffer, then object (the library's usually are)
            if ri is None and (nranges == 1 or (K[1:] >= K[:-1]).all() and (B == B[0]).all()):
                order, b, k, d, o, z = slice(None), B, K, D, O, L
            else:
                order = (ri if ri is not None else np.arange(nranges))
                order = order[np.lexsort((K[order], B[order]))]
                b, k, d, o, z = B[order], K[order], D[order], O[order], L[order]
            m = len(k)
            newb = np.zeros(m, bool)
            newb[0] = True
            np.not_equal(b[1:], b[:-1], out=newb[1:])
            newk = newb.copy()
            newk[1:] |= k[1:] != k[:-1]
            starts = np.flatnonzero(newk)
            bounds = starts.tolist() + [m]
            dl = (d - b).astype(np.int64).tolist()
            sl = o.tolist()
            zl = z.tolist()
            kl = k[starts].tolist()
            gb = np.flatnonzero(newb[starts]).tolist() + [len(starts)]  # the object groups of each buffer
            buffers = b[starts[gb[:-1]]].tolist()
            all_keys, all_dst, all_src, all_sizes = [], [], [], []
            for g0, g1 in zip(gb, gb[1:]):
                all_keys.append([ks[x] for x in kl[g0:g1]])
                spans = list(itertools.starmap(slice, zip(bounds[g0:g1], bounds[g0 + 1:g1 + 1])))
                all_dst.append(list(map(dl.__getitem__, spans)))
                all_src.append(list(map(sl.__getitem__, spans)))
                all_sizes.append(list(map(zl.__getitem__, spans)))
            rs = self.client.get_into_ranges(buffers, all_keys, all_dst, all_src, all_sizes)
            flat = list(itertools.chain.from_iterable(itertools.chain.from_iterable(rs)))
            if len(flat) != m:
                raise RuntimeError("get_into_ranges answered %d of %d ranges" % (len(flat), m))
            got[order] = flat
        bad = got != L
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            r = int(got[j])
            failed = got == TRANSFER_FAIL
            if failed.any():
                self._failed(sorted(set(ks[x] for x in K[failed].tolist())))
            R[:] = got
            R[(got == NOT_FOUND) | failed] = _lib.ENGINE_MISSING
            R[got == -1] = -2  # Mooncake's INTERNAL_ERROR is not a missing object
            if r not in (NOT_FOUND, TRANSFER_FAIL):
                _write_err(err, errlen, "%s: read %s [%d,+%d): %s %s" % (
                    self.name, _show(ks[int(K[j])]), int(O[j]), int(L[j]),
                    "batch_get_into" if W[j] else "get_into_ranges", code_name(r) if r < 0 else "%d bytes" % r))
        else:
            R[:] = got
        return 0

    def _failed(self, keys: Sequence[bytes]) -> None:
        """Objects whose transfer failed: the holders of their replicas that
        do not answer a connection are dead (see DEAD_HOLDER_SECONDS), and
        the objects are dropped."""
        now = time.monotonic()
        for ep in set(itertools.chain.from_iterable(self._endpoints(keys).values())):
            if ep not in self._dead and not _answers(ep):
                self._dead[ep] = (now + DEAD_HOLDER_SECONDS, now)
        self._drop(keys)

    def _stale(self, keys: Sequence[bytes]) -> Set[bytes]:
        """The keys whose replicas are all on dead holders, dropped; empty
        when no holder is dead (then without a call to Mooncake)."""
        now = time.monotonic()
        for ep, (until, probed) in list(self._dead.items()):
            if until <= now:
                self._dead.pop(ep, None)
            elif now - probed >= DEAD_HOLDER_REPROBE:
                if _answers(ep):
                    self._dead.pop(ep, None)  # a new holder there, or it was not dead
                else:
                    self._dead[ep] = (until, time.monotonic())
        if not self._dead:
            return set()
        stale = {k for k, eps in self._endpoints(keys).items() if eps and all(e in self._dead for e in eps)}
        if stale:
            self._drop(sorted(stale))
        return stale

    def _endpoints(self, keys: Sequence[bytes]) -> Dict[bytes, List[str]]:
        """{key: the transport endpoints of its complete memory replicas}
        for the keys Mooncake lists (one batch_get_replica_desc; keys that
        are not UTF-8 are left out)."""
        pairs: List[Tuple[bytes, str]] = []
        for k in keys:
            try:
                pairs.append((k, k.decode("utf-8")))
            except UnicodeError:
                pass
        if not pairs:
            return {}
        desc = self.client.batch_get_replica_desc([s for _, s in pairs])
        out = {}
        for k, s in pairs:
            eps = [r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in desc.get(s) or ()
                   if r.is_memory_replica() and str(r.status).endswith("COMPLETE")]
            if eps:
                out[k] = eps
        return out

    def _drop(self, keys: Sequence[bytes]) -> None:
        """Remove objects whose transfer failed (TRANSFER_FAIL): their one
        replica's holder is gone or cannot be reached, so they are missing.
        The master lists them until the holder's lease (--client_ttl)
        expires, and a put of such a key would keep the lost object (the
        first writer wins): removed, the key can be stored again at once.
        Best effort."""
        self.counts["dropped"] += len(keys)
        try:
            self.client.batch_remove(keys, force=True)
        except Exception:
            pass

    def _remove(self, n: int, keys: Optional[int], offsets: Optional[int], err: Optional[int], errlen: int) -> int:
        self.counts["remove"] += 1
        ks = self._keys(n, keys, offsets)
        rs = self.client.batch_remove(ks, force=True)
        for k, r in zip(ks, rs):
            if r < 0 and r != NOT_FOUND:
                _write_err(err, errlen, "%s: remove %s: %s" % (self.name, _show(k), code_name(r)))
                return -1
        return 0

    def _register(self, base: Optional[int], n: int, err: Optional[int], errlen: int) -> int:
        rc = self.client.register_buffer(base or 0, n)
        if rc != 0:
            _write_err(err, errlen, "%s: register_buffer of %d bytes at %#x: %s" % (
                self.name, n, base or 0, code_name(rc)))
            return -1
        return 0

    def _unregister(self, base: Optional[int], n: int, err: Optional[int], errlen: int) -> int:
        rc = self.client.unregister_buffer(base or 0)
        if rc != 0:
            _write_err(err, errlen, "%s: unregister_buffer at %#x: %s" % (self.name, base or 0, code_name(rc)))
            return -1
        return 0


def _configs() -> Tuple[Any, Any]:
    """Mooncake's ReplicateConfig of a plain put and of a soft-pinned one
    (None, None without Mooncake: a stand-in client of a test)."""
    try:
        from mooncake.store import ReplicateConfig
    except ImportError:
        return None, None
    plain, pinned = ReplicateConfig(), ReplicateConfig()
    try:
        from mooncake.store import SoftPinAction
        pinned.soft_pin_action = SoftPinAction.ENABLE
    except (ImportError, AttributeError):
        pinned.with_soft_pin = True  # before SoftPinAction
    return plain, pinned


def _answers(endpoint: str) -> bool:
    """Whether a Mooncake peer's transport endpoint "host:port" accepts a
    TCP connection within DEAD_HOLDER_CONNECT seconds."""
    return refused(endpoint, DEAD_HOLDER_CONNECT) is None


def _show(k: bytes) -> str:
    return repr(k.decode("utf-8", "backslashreplace"))


def _write_err(err: Optional[int], errlen: int, msg: str) -> None:
    """Write msg, NUL-terminated and truncated at a UTF-8 boundary, into the
    C buffer err of errlen bytes."""
    try:
        if not err or not errlen:
            return
        b = msg.encode("utf-8", "replace")[:errlen - 1]
        b = b.decode("utf-8", "ignore").encode("utf-8") + b"\0"
        ctypes.memmove(err, b, len(b))
    except BaseException:
        pass


def open_url(url: str) -> Tuple[Optional[int], MooncakeEngine]:
    """(handle, engine) of a store on a new client of the URL (Store's mooncake:// branch)."""
    client, cfg = connect(url)
    eng = MooncakeEngine(client, "mooncake://" + cfg["master"], owned=True, read_timeout_ms=cfg["read_timeout_ms"])
    return eng.open_store(), eng


def open_client(client: Any, read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS,
                name: Optional[str] = None) -> Tuple[Optional[int], MooncakeEngine]:
    """(handle, engine) of a store on a client the caller keeps (Store.from_mooncake)."""
    if name is None:
        name = "mooncake://(client %s)" % _client_name(client)
    elif not isinstance(name, str):
        raise TypeError("kvreshard: name must be a str, not %s" % type(name).__name__)
    elif not name.startswith(("mooncake://", "engine:")):
        name = "engine:" + name  # the library's names of engine stores
    eng = MooncakeEngine(client, name, owned=False, read_timeout_ms=read_timeout_ms)
    return eng.open_store(), eng


def _client_name(client: Any) -> str:
    try:
        return str(client.get_hostname())
    except Exception:
        return "client"
