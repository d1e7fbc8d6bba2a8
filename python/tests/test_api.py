"""The package's API: arguments, errors, buffers, threads and fork."""

import copy
import ctypes
import gc
import mmap
import os
import pickle
import threading
import time

import numpy as np
import pytest

import kvreshard as kv
import oracle as o
from kvreshard import _lib

M = dict(layers=4, kv_heads=2, head_dim=4, dtype="fp32", page=2)
SP = o.Spec(4, 2, 4, "fp32", 2)


def model(**kw):
    return kv.Model(**dict(M, **kw))


def pool_arrays(layout="page_first", slots=4, fill=0):
    return o.new_pool(SP, layout, slots, 4, 2, fill=fill)


def write_pages(url, keys, layout="page_first"):
    pages = {k: o.page(SP, k) for k in keys}
    _, comps = pool_arrays(layout, slots=len(keys))
    for i, k in enumerate(keys):
        o.fill_slot(comps, layout, i, SP, pages[k], (0, 4), (0, 2))
    with kv.Store(url) as st, kv.Writer(st, model(), kv.Placement(1, 1), kv.Pool(layout, comps, len(keys))) as w:
        assert w.write(keys, range(len(keys))) == [kv.WriteStatus.WRITTEN] * len(keys)
    return pages


def test_exceptions_are_builtin_kinds():
    assert issubclass(kv.InvalidArgument, ValueError) and issubclass(kv.InvalidArgument, kv.KvreshardError)
    assert issubclass(kv.StoreError, OSError) and issubclass(kv.StoreError, kv.KvreshardError)
    assert issubclass(kv.ForkError, RuntimeError) and issubclass(kv.ManifestError, kv.KvreshardError)


def test_library_is_cdll_that_releases_the_gil():
    lib = _lib.lib()
    assert type(lib) is ctypes.CDLL
    assert not lib._func_flags_ & ctypes._FUNCFLAG_PYTHONAPI
    minor = ctypes.c_int32(-1)
    assert lib.kvr_version(ctypes.byref(minor)) == _lib.ABI_VERSION and minor.value == _lib.ABI_MINOR
    assert _lib.version() == (_lib.ABI_VERSION, _lib.ABI_MINOR)
    assert kv.library_path() == os.environ["KVRESHARD_LIB"]


def test_store_url_errors(tmp_path):
    with pytest.raises(kv.InvalidArgument) as e:
        kv.Store("nosuch://x")
    assert e.value.code == _lib.EINVAL
    assert 'unknown scheme "nosuch"' in str(e.value)
    with pytest.raises(kv.InvalidArgument):
        kv.Store("file://relative/dir")
    with pytest.raises(TypeError):
        kv.Store(b"file:///tmp")
    f = tmp_path / "file"
    f.write_bytes(b"x")
    with pytest.raises(kv.KvreshardError):
        kv.Store("file://" + str(f / "store"))


def test_model_errors():
    with pytest.raises(kv.InvalidArgument, match="model layers=-1 is out of range"):
        model(layers=-1)
    with pytest.raises(TypeError, match="model page must be an int, not str"):
        model(page="2")
    with pytest.raises(kv.InvalidArgument, match="drop v_head_dim"):
        model(mla=True, v_head_dim=4)
    with pytest.raises(kv.InvalidArgument, match='dtype "int4" is unknown'):
        model(dtype="int4").domain()
    with pytest.raises(kv.InvalidArgument):
        model(layers=0).domain()


def test_placement_and_pool_errors(tmp_path):
    with pytest.raises(kv.InvalidArgument, match="pp_layers has 1 entries; pp is 2"):
        kv.Placement(1, 2, pp_layers=[4])
    with pytest.raises(TypeError, match="rank must be a"):
        kv.Placement(2, 1, rank=1)
    _, comps = pool_arrays()
    with pytest.raises(kv.InvalidArgument, match="pool region 0: the buffer is read-only"):
        kv.Pool("page_first", [bytes(100), comps[1]], 4)
    ro = comps[0].copy()
    ro.flags.writeable = False
    with pytest.raises(kv.InvalidArgument, match="pool region 1: the buffer is read-only"):
        kv.Pool("page_first", [comps[0], ro], 4)
    with pytest.raises(kv.InvalidArgument, match="pool region 0: the buffer is not C-contiguous"):
        kv.Pool("page_first", [comps[0][:, :, :, ::2], comps[1]], 4)
    with pytest.raises(TypeError, match="neither a buffer"):
        kv.Pool("page_first", [object(), comps[1]], 4)
    with pytest.raises(kv.InvalidArgument, match="slots=0 is not positive"):
        kv.Pool("page_first", comps, 0)
    with pytest.raises(kv.InvalidArgument, match="pool region 0: address 0x0 is not a valid address"):
        kv.Pool("page_first", [(0, 10), comps[1]], 4)
    # the library checks the pool against the model and placement
    with kv.Store("file://" + str(tmp_path)) as st:
        small = [comps[0][:1].reshape(-1), comps[1]]
        with pytest.raises(kv.InvalidArgument) as e:
            kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("page_first", small, 4))
        assert "bytes" in str(e.value)
        with pytest.raises(kv.InvalidArgument) as e:
            kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("no_such_layout", comps, 4))
        assert "no_such_layout" in str(e.value)
        with pytest.raises(kv.InvalidArgument):
            kv.Reader(st, model(), kv.Placement(3, 1), kv.Pool("page_first", comps, 4))
        with pytest.raises(TypeError, match="model must be a kvreshard.Model"):
            kv.Reader(st, M, kv.Placement(1, 1), kv.Pool("page_first", comps, 4))


def test_bad_keys_and_slots(tmp_path):
    url = "file://" + str(tmp_path)
    write_pages(url, ["k1", "k2"])
    _, comps = pool_arrays()
    with kv.Store(url) as st, kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("page_first", comps, 4)) as r:
        with pytest.raises(kv.InvalidArgument, match="2 keys but 1 slots"):
            r.read(["k1", "k2"], [0])
        with pytest.raises(TypeError, match="keys must be str, not int"):
            r.read(["k1", 2], [0, 1])
        with pytest.raises(TypeError, match="sequence of str, not one str"):
            r.exists("k1")
        for keys, slots in ((["k1"], [4]), (["k1"], [-1]), (["k1", "k2"], [1, 1]), (["a_b"], [0]), ([""], [0])):
            with pytest.raises(kv.InvalidArgument) as e:
                r.read(keys, slots)
            assert e.value.code == _lib.EINVAL and str(e.value), (keys, slots)
        # numpy slots and any sequence of ints
        assert r.read(["k1", "k2"], np.array([3, 2])).hit == 2
        assert r.read(["k1", "k2"], (0, 1)).hit == 2
        assert r.read(iter(["k1", "k2"]), range(2)).hit == 2
        with pytest.raises(TypeError, match="slots must be integers, not float64"):
            r.read(["k1"], np.array([1.5]))
        with pytest.raises(TypeError, match="slots must be a sequence of int"):
            r.read(["k1"], [1.5])


def test_keys_are_utf8(tmp_path):
    """Keys of any length and script, in one buffer with offsets."""
    url = "file://" + str(tmp_path)
    keys = ["clé-1", "x" * 300, "鍵", "k"]
    pages = write_pages(url, keys)
    _, comps = pool_arrays()
    with kv.Store(url) as st, kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("page_first", comps, 4)) as r:
        assert r.exists(keys) == 4
        assert r.exists(["k", "clé-1"]) == 2
        assert r.exists(["cle-1"]) == 0
        assert r.read(keys, [3, 2, 1, 0]).hit == 4
    for k, s in zip(keys, [3, 2, 1, 0]):
        o.check_slot(comps, "page_first", s, SP, pages[k], (0, 4), (0, 2))


def test_closed_objects(tmp_path):
    url = "file://" + str(tmp_path)
    st = kv.Store(url)
    _, comps = pool_arrays()
    r = kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("page_first", comps, 4))
    r.close()
    r.close()
    with pytest.raises(kv.InvalidArgument, match="reader is closed"):
        r.read(["k"], [0])
    st.close()
    with pytest.raises(kv.InvalidArgument, match="is closed"):
        kv.Writer(st, model(), kv.Placement(1, 1), kv.Pool("page_first", comps, 4))


def test_buffers_of_every_kind(tmp_path):
    """bytearray, mmap and (address, nbytes) regions; the pool keeps its
    buffers alive after the caller drops them."""
    url = "file://" + str(tmp_path)
    pages = write_pages(url, ["k1", "k2"])
    _, ref = pool_arrays()
    n = ref[0].nbytes
    k = bytearray(n)
    mm = mmap.mmap(-1, n)
    pool = kv.Pool("page_first", [k, mm], 4)
    with pytest.raises(BufferError):
        k.extend(b"x")  # exported while the pool holds it
    del k, mm
    gc.collect()
    with kv.Store(url) as st, kv.Reader(st, model(), kv.Placement(1, 1), pool) as r:
        assert r.read(["k1", "k2"], [3, 1]).hit == 2
    comps = [np.frombuffer(pool.regions[0], np.uint32).reshape(ref[0].shape),
             np.frombuffer(pool.regions[1], np.uint32).reshape(ref[1].shape)]
    o.check_slot(comps, "page_first", 3, SP, pages["k1"], (0, 4), (0, 2))
    o.check_slot(comps, "page_first", 1, SP, pages["k2"], (0, 4), (0, 2))
    # (address, nbytes): what a torch tensor gives with data_ptr()
    _, arrs = pool_arrays()
    pairs = [(a.ctypes.data, a.nbytes) for a in arrs]
    with kv.Store(url) as st, kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("page_first", pairs, 4)) as r:
        assert r.read(["k2"], [0]).hit == 1
    o.check_slot(arrs, "page_first", 0, SP, pages["k2"], (0, 4), (0, 2))


def test_four_threads_read_at_once(tmp_path):
    """Four threads share one reader, each reading into its own slots, many
    times; every element is checked after each read."""
    url = "file://" + str(tmp_path)
    keys = ["t%d" % i for i in range(8)]
    pages = write_pages(url, keys, layout="page_head")
    _, comps = pool_arrays("layer_first", slots=8)
    errors = []
    start = threading.Barrier(4)
    with kv.Store(url) as st, kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("layer_first", comps, 8)) as r:
        def run(t):
            try:
                mine = keys[2 * t:2 * t + 2]
                slots = [2 * t + 1, 2 * t]
                start.wait()
                for i in range(50):
                    for s in slots:
                        o.slot_view(comps[0], "layer_first", s, 2)[...] = 0
                    res = r.read(mine, slots)
                    assert (res.hit, res.stop) == (2, kv.Stop.NONE), res
                    for k, s in zip(mine, slots):
                        o.check_slot(comps, "layer_first", s, SP, pages[k], (0, 4), (0, 2), "thread %d" % t)
            except BaseException as e:  # noqa: B902
                errors.append(e)
        ts = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert errors == []
        s = r.stats()
        assert (s.requests, s.hits, s.misses) == (200, 400, 0)


def test_fork_after_use_fails_cleanly(tmp_path):
    """A forked child of a process that loaded the library gets ForkError at
    once (Go does not survive fork), and the parent goes on working."""
    url = "file://" + str(tmp_path)
    write_pages(url, ["k1"])
    st = kv.Store(url)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 3
        try:
            os.close(rfd)
            try:
                kv.Store(url)
                msg = "no error"
            except kv.ForkError as e:
                msg = "ForkError %d %s" % (e.code, e)
                code = 0
            except BaseException as e:  # noqa: B902
                msg = "%s: %s" % (type(e).__name__, e)
            os.write(wfd, msg.encode())
        finally:
            os._exit(code)
    os.close(wfd)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in the library")
        time.sleep(0.02)
    with os.fdopen(rfd, "rb") as f:
        msg = f.read().decode()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, msg
    assert msg.startswith("ForkError 5 ") and "fork" in msg[len("ForkError 5 "):], msg
    # the parent still works
    _, comps = pool_arrays()
    with kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("page_first", comps, 4)) as r:
        assert r.read(["k1"], [0]).hit == 1
    st.close()


def test_set_max_procs():
    prev = kv.set_max_procs(0)
    assert prev >= 1
    assert kv.set_max_procs(1) == prev
    assert kv.set_max_procs(prev) == 1


def test_model_placement_and_pool_are_immutable():
    """The library reads a Model, Placement or Pool when a Writer or Reader
    opens; an attribute changed afterwards would be ignored, so none can be
    set or deleted (nor added)."""
    _, comps = pool_arrays()
    objs = [(model(), "layers", 5), (kv.Placement(2, 1, rank=(1, 0)), "tp", 4),
            (kv.Pool("page_first", comps, 4), "slots", 2)]
    for obj, attr, value in objs:
        cls = type(obj).__name__
        before = getattr(obj, attr)
        with pytest.raises(AttributeError) as e:
            setattr(obj, attr, value)
        assert str(e.value) == "kvreshard.%s is immutable: cannot set %s; make another %s" % (cls, attr, cls)
        with pytest.raises(AttributeError) as e:
            delattr(obj, attr)
        assert str(e.value) == "kvreshard.%s is immutable: cannot delete %s" % (cls, attr)
        with pytest.raises(AttributeError, match="^kvreshard.%s is immutable: cannot set extra; " % cls):
            obj.extra = 1
        assert getattr(obj, attr) == before
    m, p, pool = (o for o, _, _ in objs)
    assert (m.layers, m.dtype, m.v_head_dim, m.item_size) == (4, "fp32", None, 4)
    assert (p.tp, p.rank, p.cp, p.pp_layers) == (2, (1, 0), 1, None)
    assert type(pool.regions) is tuple and pool.regions[0] is comps[0] and pool.layout == "page_first"


def test_models_and_placements_are_values():
    """Models and Placements of the same fields are equal and hash alike;
    a copy of any of the three is itself; Models and Placements pickle as
    their fields (to a spawned rank), a Pool (this process's memory) not."""
    m = kv.Model(draft_layers=1, name="x", **M)
    same = kv.Model(draft_layers=1, name="x", **M)
    assert m == same and hash(m) == hash(same) and m is not same
    assert m != kv.Model(name="x", **M) and m != kv.Model(draft_layers=1, **M)
    p = kv.Placement(2, 2, rank=(1, 0, 1), pp_layers=[1, 3], cp=2)
    assert p == kv.Placement(2, 2, rank=(1, 0, 1), pp_layers=(1, 3), cp=2)
    assert p != kv.Placement(2, 2, rank=(1, 0, 1), cp=2) and len({p, kv.Placement(2, 2, (1, 0, 1), [1, 3], 2)}) == 1
    _, comps = pool_arrays()
    pool = kv.Pool("page_first", comps, 4)
    for v in (m, p, pool):
        assert copy.copy(v) is v and copy.deepcopy(v) is v
    for v in (m, p):
        back = pickle.loads(pickle.dumps(v))
        assert back == v and repr(back) == repr(v) and back is not v
    assert pickle.loads(pickle.dumps(m)).domain() == m.domain()
    with pytest.raises(TypeError, match="^kvreshard.Pool cannot be pickled: it is memory of this process"):
        pickle.dumps(pool)


def test_a_read_the_store_fails_is_a_result(tmp_path):
    """A store that fails during a read (the C API's KVR_ESTORE) is a
    ReadResult with Stop.FAILED and the store's message, not a StoreError:
    the pages before it are read in full. A Redis server that is gone is
    such a store."""
    import shutil
    import socket
    import subprocess
    redis = shutil.which("redis-server")
    if redis is None:
        pytest.skip("redis-server not found")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([redis, "--port", str(port), "--save", "", "--appendonly", "no"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = "redis://127.0.0.1:%d" % port
        deadline = time.monotonic() + 30
        while True:
            try:
                st = kv.Store(url)
                break
            except kv.StoreError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with st:
            pages = {k: o.page(SP, k) for k in ("k1", "k2")}
            _, comps = pool_arrays(slots=2)
            for i, k in enumerate(("k1", "k2")):
                o.fill_slot(comps, "page_first", i, SP, pages[k], (0, 4), (0, 2))
            with kv.Writer(st, model(), kv.Placement(1, 1), kv.Pool("page_first", comps, 2)) as w:
                assert w.write(["k1", "k2"], [0, 1]) == [kv.WriteStatus.WRITTEN] * 2
            _, out = pool_arrays()
            with kv.Reader(st, model(), kv.Placement(1, 1), kv.Pool("page_first", out, 4)) as r:
                assert r.read(["k1"], [0]).hit == 1
                srv.kill()
                srv.wait()
                res = r.read(["k1", "k2"], [2, 3])
                assert (res.hit, res.stop) == (0, kv.Stop.FAILED), res
                assert res.message != ""
                with pytest.raises(kv.StoreError):
                    r.exists(["k1"])
    finally:
        srv.kill()
        srv.wait()
