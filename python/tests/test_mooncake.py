"""kvreshard on a real Mooncake Store (mooncake-transfer-engine-non-cuda from
make venv): a master and a memory holder started by the tests, writers and
readers in separate processes contributing no memory (MC_STORE_MEMCPY=false:
bytes cross TCP), every byte compared with the numpy oracle.

Mooncake's clients listen on every address of the host, so each scenario
runs in a user and network namespace with only loopback (unshare -rn): the
scenario driver (mooncake_scenario.py) runs there and starts the master,
the holder and the ranks (mooncake_rank.py); these tests assert on what it
reports. Without unshare or Mooncake the scenarios skip with the reason,
unless KVRESHARD_REQUIRE_MOONCAKE=1 (CI), where they fail.
"""

import ctypes
import json
import os
import socket
import subprocess
import sys

import pytest

import kvreshard as kv
from kvreshard import mooncake as mc
from kvreshard import mooncake_client
from kvreshard import mooncake_local as ml

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = os.path.join(HERE, "mooncake_scenario.py")
# A read that fails or misses must return within this; it only catches
# hangs (Mooncake's own waits are up to about 5 s: RPC timeouts, our read
# timeout).
BOUND = 60


def need_mooncake():
    reason = ml.mooncake_reason() or ml.netns_reason()
    if reason:
        if os.environ.get("KVRESHARD_REQUIRE_MOONCAKE") == "1":
            pytest.fail("KVRESHARD_REQUIRE_MOONCAKE=1: " + reason, pytrace=False)
        pytest.skip(reason)


def scenario(name, timeout=600, **opts):
    """Run a scenario in a loopback-only network namespace; what it reports."""
    need_mooncake()
    p = subprocess.run(ml.netns_command([sys.executable, SCENARIO, name, json.dumps(opts)]), capture_output=True,
                       text=True, timeout=timeout, env=ml.client_env())
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    assert p.returncode == 0 and lines, "scenario %s: exit %d\n%s\n%s" % (name, p.returncode, p.stdout[-3000:],
                                                                         p.stderr[-6000:])
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------
# URLs, without a master

def err(url):
    with pytest.raises(ValueError) as e:
        kv.Store(url)
    assert isinstance(e.value, kv.InvalidArgument)
    return str(e.value)


@pytest.mark.parametrize("url,msg", [
    ("mooncake://", "want mooncake://HOST:PORT, the master's host and port"),
    ("mooncake://10.0.0.5", "want mooncake://HOST:PORT, the master's host and port"),
    ("mooncake://:50051", "want mooncake://HOST:PORT, the master's host and port"),
    ("mooncake://10.0.0.5:port", "the master's port 'port' is not a port number"),
    ("mooncake://10.0.0.5:99999", "the master's port '99999' is not a port number"),
    ("mooncake://10.0.0.5:0", "the master's port 0 is not a port number"),
    ("mooncake://10.0.0.5:50051/kv", "want mooncake://HOST:PORT?PARAMETERS, the master's address and nothing else "
                                    "before '?'"),
    ("mooncake://u@10.0.0.5:50051", "want mooncake://HOST:PORT?PARAMETERS, the master's address and nothing else "
                                   "before '?'"),
    ("mooncake://10.0.0.5:50051?bogus=1", "unknown parameter 'bogus'; the parameters are metadata, protocol, "
                                          "device, segment, buffer, local_hostname, read_timeout_ms"),
    ("mooncake://10.0.0.5:50051?protocol=tcp&protocol=rdma", "parameter protocol is given twice"),
    ("mooncake://10.0.0.5:50051?protocol", "parameter protocol has no value (want protocol=VALUE)"),
    ("mooncake://10.0.0.5:50051?protocol=", "parameter protocol '' is not one of tcp, rdma"),
    ("mooncake://10.0.0.5:50051?protocol=t%20cp", "parameter protocol 't cp' is not one of tcp, rdma"),
    ("mooncake://10.0.0.5:50051?protocol=TCP", "parameter protocol 'TCP' is not one of tcp, rdma"),
    ("mooncake://10.0.0.5:50051?device=mlx5_0;mlx5_1", "parameter device 'mlx5_0;mlx5_1' is not a list of device "
                                                       "names (mlx5_0,mlx5_1)"),
    ("mooncake://10.0.0.5:50051?segment=lots", "mooncake URL parameter segment 'lots' is not a size (bytes, or a "
                                               "number with kb, mb, gb or tb)"),
    ("mooncake://10.0.0.5:50051?segment=-1", "mooncake URL parameter segment '-1' is not a size (bytes, or a number "
                                             "with kb, mb, gb or tb)"),
    ("mooncake://10.0.0.5:50051?buffer=4pb", "mooncake URL parameter buffer '4pb' is not a size (bytes, or a number "
                                             "with kb, mb, gb or tb)"),
    ("mooncake://10.0.0.5:50051?segment=99999999tb", "mooncake URL parameter segment '99999999tb' is out of range"),
    ("mooncake://10.0.0.5:50051?read_timeout_ms=5s", "parameter read_timeout_ms '5s' is not a number of "
                                                     "milliseconds"),
    ("mooncake://10.0.0.5:50051?local_hostname=", "parameter local_hostname '' is empty or holds blanks"),
    ("mooncake://10.0.0.5:50051?metadata=a%20b", "parameter metadata 'a b' is empty or holds blanks"),
])
def test_url_errors(url, msg):
    """Every bad part of a mooncake:// URL is a ValueError naming it, before
    any Mooncake client is made."""
    assert err(url) == "kvreshard: mooncake URL %r: %s" % (url, msg)


def test_url_parameters():
    assert mc.parse_url("mooncake://10.0.0.5:50051") == {
        "master": "10.0.0.5:50051", "metadata": "P2PHANDSHAKE", "protocol": "tcp", "device": "", "segment": 0,
        "buffer": 0, "local_hostname": "localhost", "read_timeout_ms": 5000}
    assert mc.parse_url("MOONCAKE://[fe80::1]:50051?metadata=etcd://10.0.0.2:2379&protocol=rdma&device=mlx5_0,mlx5_1"
                        "&segment=4gb&buffer=16MiB&local_hostname=10.0.0.7&read_timeout_ms=0&") == {
        "master": "[fe80::1]:50051", "metadata": "etcd://10.0.0.2:2379", "protocol": "rdma",
        "device": "mlx5_0,mlx5_1", "segment": 4 << 30, "buffer": 16 << 20, "local_hostname": "10.0.0.7",
        "read_timeout_ms": 0}
    assert [mc.parse_size("s", v) for v in (0, "123", "2k", "3KB", "1kib", "5m", "7G", "1tb", 12)] == [
        0, 123, 2048, 3072, 1024, 5 << 20, 7 << 30, 1 << 40, 12]


def test_sglang_extra_config(monkeypatch):
    """url_from_sglang reads the keys of SGLang's Mooncake backend as it does."""
    monkeypatch.delenv("MOONCAKE_PROTOCOL", raising=False)
    monkeypatch.delenv("MOONCAKE_LOCAL_HOSTNAME", raising=False)
    monkeypatch.delenv("LOCAL_HOSTNAME", raising=False)
    u = mc.url_from_sglang({"master_server_address": "10.0.0.5:50051", "metadata_server": "P2PHANDSHAKE",
                            "protocol": "tcp", "device_name": "", "global_segment_size": "8gb",
                            "local_buffer_size": 1 << 20})
    assert u == ("mooncake://10.0.0.5:50051?metadata=P2PHANDSHAKE&protocol=tcp&segment=8589934592&buffer=1048576"
                 "&local_hostname=localhost")
    # SGLang's defaults: rdma, 4gb for the instance (each of its ranks a share), 16 MiB buffer
    cfg = mc.parse_url(mc.url_from_sglang({"master_server_address": "m:1"}, ranks=8))
    assert (cfg["protocol"], cfg["segment"], cfg["buffer"], cfg["metadata"]) == ("rdma", (4 << 30) // 8, 16 << 20,
                                                                                 "P2PHANDSHAKE")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "10.0.0.9")
    cfg = mc.parse_url(mc.url_from_sglang({"master_server_address": "m:1", "global_segment_size": 1 << 30,
                                           "device_name": '{"0": "mlx5_0", "1": "mlx5_1"}',
                                           "local_hostname": "ignored"}, tp_rank=1))
    assert (cfg["protocol"], cfg["segment"], cfg["device"], cfg["local_hostname"]) == ("tcp", 1 << 30, "mlx5_1",
                                                                                       "10.0.0.9")
    for extra, msg in [
        ({}, "kvreshard: extra_config master_server_address: required: the Mooncake master, HOST:PORT, not None"),
        ({"master_server_address": "m:1", "global_segment_size": "four"},
         "kvreshard: extra_config global_segment_size: 'four' is not a size in bytes or gb"),
        ({"master_server_address": "m:1", "protocol": 5},
         "kvreshard: extra_config protocol: must be a string, not int"),
        ({"master_server_address": "m:1", "client_server_address": "127.0.0.1:50052"},
         "kvreshard: extra_config client_server_address: kvreshard runs its own Mooncake client in each rank; a "
         "standalone (dummy) client is not supported: give master_server_address"),
        ({"master_server_address": "m:1", "protocol": ""},
         "kvreshard: extra_config protocol: mooncake URL 'mooncake://m:1?metadata=P2PHANDSHAKE&protocol=&segment="
         "4294967296&buffer=16777216&local_hostname=10.0.0.9': parameter protocol '' is not one of tcp, rdma"),
        ({"master_server_address": "m:1", "device_name": "a b"},
         "kvreshard: extra_config device_name: mooncake URL 'mooncake://m:1?metadata=P2PHANDSHAKE&protocol=tcp&device="
         "a%20b&segment=4294967296&buffer=16777216&local_hostname=10.0.0.9': parameter device 'a b' is not a list of "
         "device names (mlx5_0,mlx5_1)"),
        ({"master_server_address": "nohostport"},
         "kvreshard: extra_config master_server_address: mooncake URL 'mooncake://nohostport?metadata=P2PHANDSHAKE&"
         "protocol=tcp&segment=4294967296&buffer=16777216&local_hostname=10.0.0.9': want mooncake://HOST:PORT, the "
         "master's host and port"),
    ]:
        with pytest.raises(ValueError) as e:
            mc.url_from_sglang(extra)
        assert str(e.value) == msg


def test_unreachable_master():
    """A master that does not answer is a StoreError at once (Mooncake's
    setup would retry it for about 90 s)."""
    if ml.mooncake_reason():
        pytest.skip(ml.mooncake_reason())
    port = ml.free_port()
    url = "mooncake://127.0.0.1:%d?local_hostname=127.0.0.1" % port
    with pytest.raises(kv.StoreError) as e:
        kv.Store(url)
    assert str(e.value).startswith("kvreshard: %s: cannot reach the Mooncake master at 127.0.0.1:%d: " % (url, port))


def test_what_this_host_lacks(monkeypatch, tmp_path):
    """What Mooncake's setup would wait minutes on, then fail without
    naming, is refused first: an RDMA device this host lacks (ValueError
    naming protocol or device), a segment past its memory (ValueError), a
    metadata server that takes no connection (StoreError, within seconds)."""
    monkeypatch.setattr(mooncake_client, "RDMA_DEVICES", str(tmp_path / "infiniband"))
    url = "mooncake://127.0.0.1:1?protocol=rdma"
    assert err(url) == ("kvreshard: mooncake URL %r: protocol rdma: this host has no RDMA device (%s is empty); "
                        "use protocol=tcp" % (url, tmp_path / "infiniband"))
    (tmp_path / "infiniband").mkdir()
    (tmp_path / "infiniband" / "mlx5_0").mkdir()
    url = "mooncake://127.0.0.1:1?protocol=rdma&device=mlx5_0,mlx5_1"
    assert err(url) == ("kvreshard: mooncake URL %r: parameter device 'mlx5_1': this host has no RDMA device mlx5_1 "
                        "(it has mlx5_0)" % url)
    total = mooncake_client._host_memory()
    assert total > 0
    url = "mooncake://127.0.0.1:1?segment=%d" % (total + 1)
    assert err(url) == ("kvreshard: mooncake URL %r: parameter segment %d: more than the %d bytes of memory of this "
                        "host" % (url, total + 1, total))
    # a metadata server is asked before Mooncake's setup: a master that
    # answers (this socket), a metadata server that does not
    with socket.socket() as master:
        master.bind(("127.0.0.1", 0))
        master.listen(1)
        port = ml.free_port()
        for md in ("etcd://127.0.0.1:%d" % port, "http://127.0.0.1:%d/metadata" % port):
            url = "mooncake://127.0.0.1:%d?metadata=%s" % (master.getsockname()[1], md)
            with pytest.raises(kv.StoreError) as e:
                mooncake_client.connect(url)
            assert str(e.value).startswith("kvreshard: %s: cannot reach the metadata server %s: " % (url, md))


def test_callbacks_never_raise():
    """A failing client gives the library a negative code and the message,
    never an exception through ctypes."""
    class Broken:
        def __getattr__(self, name):
            def f(*a, **k):
                raise RuntimeError("the client is broken")
            return f
    eng = mc.MooncakeEngine(Broken(), "mooncake://broken:1")
    err = ctypes.create_string_buffer(200)
    kb = ctypes.create_string_buffer(b"ab")
    off = (ctypes.c_int64 * 3)(0, 1, 2)
    ex = (ctypes.c_uint8 * 2)()
    rc = eng._cbs[2](None, 2, ctypes.addressof(kb), ctypes.addressof(off), ctypes.addressof(ex),
                     ctypes.addressof(err), 200)
    assert (rc, err.value) == (-1, b"mooncake://broken:1 exists: RuntimeError: the client is broken")
    small = ctypes.create_string_buffer(8)
    eng._cbs[2](None, 2, ctypes.addressof(kb), ctypes.addressof(off), ctypes.addressof(ex),
                ctypes.addressof(small), 8)
    assert small.value == b"mooncak"  # truncated, NUL-terminated


# ---------------------------------------------------------------------------
# Against a master

def test_reshard_between_processes():
    """TP1/PP3 writer processes, exited, then TP2/PP2 reader processes: pages
    in each part layout (written from pools of other layouts) read into each
    pool layout, every element checked; a missing page after them is a
    miss."""
    d = scenario("reshard")
    n = d["pages"]
    assert d["writers_alive_at_read"] == []
    assert [j["statuses"] for w in d["writers"] for j in w["jobs"]] == [["WRITTEN"] * n] * (3 * 3)
    assert not set(d["writer_pids"]) & {r["pid"] for r in d["readers"]}
    assert len(d["readers"]) == 4
    got = [[(x["hit"], x["stop"], x["checked"], x["bad"]) for x in j["reads"]] for r in d["readers"] for j in r["jobs"]]
    assert got == [[(n, "MISS", n, None)] * 3] * (4 * 4)


def test_two_layouts_race():
    """TP1/PP3 (PLHD) and TP2/PP2 (LPHD) writers of the same pages at once:
    each page is one layout's, every rank of it written, none of the other;
    a reader reading meanwhile and readers afterwards of both topologies in
    every pool layout get right bytes only."""
    d = scenario("race")
    n = d["pages"]
    for i in range(n):
        a, b = [s[i] for s in d["a"]], [s[i] for s in d["b"]]
        won = [all(x == "WRITTEN" for x in a), all(x == "WRITTEN" for x in b)]
        assert won.count(True) == 1, (i, a, b)
        loser = b if won[0] else a
        assert set(loser) <= {"REFUSED", "COMPLETE"}, (i, a, b)
    assert d["loop"] and all(x["bad"] is None for x in d["loop"] if "i" in x)
    got = [(x["hit"], x["checked"], x["bad"]) for r in d["readers"] for j in r["jobs"] for x in j["reads"]]
    assert got == [(n, n, None)] * (4 * 7)


def test_eviction_is_a_miss():
    """More pages than the holder's memory: whatever the master evicts, every
    page read is right and the others are misses; a page found missing and
    written again is read."""
    d = scenario("evict")
    assert d["pages"] * d["page_bytes"] > d["segment"]  # not all of them can stay
    for w in d["writers"][0]["jobs"][0]["statuses"]:
        assert set(w) <= {"WRITTEN", "FAILED"}
    for r in d["readers"]:
        for j in r["jobs"]:
            single = j["reads"][:-1]
            assert all(x["bad"] is None for x in j["reads"])
            assert all(x["checked"] == x["hit"] for x in j["reads"])
            for x in j["reads"]:
                # a miss, or a read whose lease ran out under eviction: a clean failure
                assert x["stop"] in ("NONE", "MISS") or x["stop"] == "FAILED" and "LEASE_EXPIRED" in x["message"], x
            assert any(x["hit"] == 0 for x in single)
    assert d["missed"]
    assert [x["jobs"][0]["reads"][0]["hit"] for x in d["again"]] == [len(d["missed"])] * 4
    assert all(x["jobs"][0]["reads"][0]["bad"] is None for x in d["again"])


def check_fault(d):
    n = d["pages"]
    assert d["writes"][0] == {"WRITTEN": 3 * n}
    # written again (in rounds, until the reader read every page): the last
    # round answered for every part
    assert d["write_rounds"] >= 1 and sum(d["writes"][1].values()) == 3 * n, d["writes"]
    assert len(d["before"]) >= 4 and all(x["hit"] == n and x["bad"] is None for x in d["before"])
    after = d["after"]
    assert after, "no read after the kill"
    for x in after:
        assert x["bad"] is None, x
        assert x["seconds"] < BOUND, x  # a failure or a miss, never a hang
        assert x["hit"] == n or x["stop"] in ("FAILED", "MISS"), x
    assert any(x["hit"] < n for x in after)  # it saw the fault
    assert after[-1]["hit"] == n  # and read every page again
    assert d["back_after"] < BOUND
    assert d["exit_seconds"] is not None and d["exit_seconds"] < BOUND


def test_holder_killed_mid_read():
    """kill -9 of the process holding the memory while a reader reads in a
    loop: each read fails or misses within seconds (Mooncake's ranged read
    does not return; the read timeout ends it), none hangs, no wrong byte;
    with a new holder and the pages written again the same reader reads
    them; it exits promptly."""
    d = scenario("fault", victim="holder")
    check_fault(d)
    # the dead holder's objects are misses, at once: a transfer from it
    # failed, and it does not answer
    assert any(x["stop"] == "MISS" for x in d["after"])


def test_master_killed_mid_read():
    """kill -9 of the master mid-read: reads fail within seconds while it is
    down; restarted on the same port (its objects are lost: misses), the
    pages written again, the same reader reads them again."""
    d = scenario("fault", victim="master")
    check_fault(d)
    assert any(x["stop"] == "FAILED" for x in d["after"])


def test_from_mooncake_and_close():
    """Store.from_mooncake wraps a client of the process and does not close
    it; a mooncake:// store closed while a reader is open keeps its client
    until the reader closes; a closed engine refuses calls."""
    d = scenario("wrap")
    assert d["setup"] == 0 and d["url"].startswith("mooncake://(client 127.0.0.1:")
    assert d["statuses"] == ["WRITTEN"] * 4
    assert d["open_while_reader"] == [False, False]
    assert d["read"] == [4, "NONE"] and d["bad"] is None
    assert d["after_reader"] == [True, True]
    assert d["wrapped_after_close"][0] is True
    assert d["refused"] == [-1, "mooncake engine of %s is closed" % d["url"]]
    assert d["client_after"] == [0]


def test_sglang_on_mooncake():
    """SGLang ranks configured with the keys of SGLang's own Mooncake
    backend (no "url") write and read through a real master: TP 2 writers,
    exited, then TP 1 x PP 2 readers of another host layout, every element
    checked, an absent page a miss."""
    import sglang_env
    sglang_env.require_sglang()
    need_mooncake()
    d = scenario("sglang")
    assert [x["stored"] for x in d["writers"]] == [[True] * 4] * 2
    assert [(x["exists"], x["read"], x["checked"], x["errors"]) for x in d["readers"]] == \
        [(4, [True] * 4 + [False], 4, 0)] * 2


def test_demo_on_mooncake():
    """python -m kvreshard demo --store mooncake://...: TP1/PP3 writer
    processes, TP2/PP2 reader processes, every byte verified."""
    d = scenario("demo", pages=6)
    assert d["code"] == 0, d["stdout"] + d["stderr"]
    out = json.loads(d["stdout"].strip().splitlines()[-1])
    assert out["verified"] is True and out["errors"] == []
    assert (out["writers"], out["readers"]) == ("TP1/PP3", "TP2/PP2")
    assert len(out["reads"]) == 12 and all(r["verified"] and r["pages"] == 6 for r in out["reads"])
    assert [w["statuses"] for w in out["writes"]] in ([{"WRITTEN": 18}] * 3, [{"COMPLETE": 18}] * 3)


def test_demo_on_file(tmp_path):
    """The demo on any store URL: a file store, in the table's words."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    p = subprocess.run([sys.executable, "-m", "kvreshard", "demo", "--store", "file://%s" % tmp_path, "--pages", "3",
                        "--pools", "page_head,layer_first"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "kvreshard demo: store file://%s" % tmp_path
    rows = [l.split() for l in lines if l.startswith("TP1/PP3")]
    assert [(r[1], r[2], r[3], r[4], r[5], r[-1]) for r in rows] == [
        (part, pool, "TP2/PP2", layout, "3", "true") for part, pool in (
            ("PLHD", "page_first"), ("LPHD", "page_first_direct"), ("HPLD", "page_head"))
        for layout in ("page_head", "layer_first")]
    assert lines[-1] == "every byte of every page verified, by every reader rank, in every pool layout."
    p = subprocess.run([sys.executable, "-m", "kvreshard", "demo", "--store", "mooncake://nohost"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert (p.returncode, p.stderr.strip()) == (2, "kvreshard demo: kvreshard: mooncake URL 'mooncake://nohost': "
                                                   "want mooncake://HOST:PORT, the master's host and port")


class _Recorder:
    """A stand-in of MooncakeDistributedStore that records the engine's
    calls and answers from `answers` (key -> result of each range)."""

    def __init__(self, answers=None):
        self.calls = []
        self.answers = answers or {}

    def get_into_ranges(self, buffers, keys, dsts, srcs, sizes):
        self.calls.append(("get_into_ranges", buffers, keys, dsts, srcs, sizes))
        return [[[self.answers.get(k, z) for z in zs] for k, zs in zip(ks, zss)] for ks, zss in zip(keys, sizes)]

    def batch_get_into(self, keys, ptrs, sizes):
        self.calls.append(("batch_get_into", keys, ptrs, sizes))
        return [self.answers.get(k, z) for k, z in zip(keys, sizes)]

    def batch_get_replica_desc(self, keys):
        return {}  # no replica: no holder to ask whether it is alive

    def batch_remove(self, keys, force=False):
        self.calls.append(("batch_remove", keys, force))
        return [0] * len(keys)

    def __getattr__(self, name):
        return lambda *a, **k: 0


def read_cb(eng, keys, ranges):
    """Call the engine's read callback as the library does: ranges of
    (key index, offset, dst offset, length, buffer, whole) over buffers
    given as {name: base address}. Returns (rc, results, message)."""
    n = len(ranges)
    kb = ctypes.create_string_buffer(b"".join(keys))
    off = (ctypes.c_int64 * (len(keys) + 1))(*[sum(len(k) for k in keys[:i]) for i in range(len(keys) + 1)])
    arr = lambda t, xs: (t * n)(*xs)
    key = arr(ctypes.c_int64, [r[0] for r in ranges])
    offs = arr(ctypes.c_int64, [r[1] for r in ranges])
    dst = arr(ctypes.c_void_p, [r[4] + r[2] for r in ranges])
    lens = arr(ctypes.c_int64, [r[3] for r in ranges])
    base = arr(ctypes.c_void_p, [r[4] for r in ranges])
    whole = arr(ctypes.c_uint8, [r[5] for r in ranges])
    res = (ctypes.c_int64 * n)()
    err = ctypes.create_string_buffer(300)
    A = ctypes.addressof
    rc = eng._cbs[4](None, len(keys), A(kb), A(off), n, A(key), A(offs), A(dst), A(lens), A(base), A(whole), A(res),
                     A(err), 300)
    return rc, list(res), err.value.decode()


def test_read_groups_ranges():
    """One get_into_ranges a call, nested [buffer][object][fragment] by the
    bases the library gives, whatever the order of the ranges; whole
    objects by batch_get_into; OBJECT_NOT_FOUND is a missing object, and so
    is one whose transfer failed (TRANSFER_FAIL: its holder died), which is
    removed; Mooncake's -1 is not."""
    c = _Recorder()
    eng = mc.MooncakeEngine(c, "mooncake://rec:1")
    b1, b2 = 0x10000, 0x90000
    ranges = [(1, 0, 0, 8, b2, 0), (0, 16, 8, 4, b1, 0), (1, 40, 64, 8, b1, 0), (0, 0, 100, 32, b1, 1),
              (0, 4, 0, 4, b1, 0)]
    rc, res, msg = read_cb(eng, [b"ka", b"kb"], ranges)
    assert (rc, res, msg) == (0, [8, 4, 8, 32, 4], "")
    assert c.calls == [
        ("batch_get_into", [b"ka"], [b1 + 100], [32]),
        ("get_into_ranges", [b1, b2], [[b"ka", b"kb"], [b"kb"]], [[[8, 0], [64]], [[0]]], [[[16, 4], [40]], [[0]]],
         [[[4, 4], [8]], [[8]]]),
    ]
    # already in order: as they come
    c.calls.clear()
    rc, res, msg = read_cb(eng, [b"ka", b"kb"], [(0, 0, 0, 4, b1, 0), (0, 8, 4, 4, b1, 0), (1, 0, 8, 4, b1, 0)])
    assert (rc, res) == (0, [4, 4, 4])
    assert c.calls == [("get_into_ranges", [b1], [[b"ka", b"kb"]], [[[0, 4], [8]]], [[[0, 8], [0]]], [[[4, 4], [4]]])]
    c.answers = {b"kb": -704}
    rc, res, msg = read_cb(eng, [b"ka", b"kb"], [(0, 0, 0, 4, b1, 0), (1, 0, 8, 4, b1, 0)])
    assert (rc, res, msg) == (0, [4, -1], "")
    c.answers = {b"ka": -1, b"kb": -800}
    c.calls.clear()
    rc, res, msg = read_cb(eng, [b"ka", b"kb"], [(0, 0, 0, 4, b1, 1), (1, 0, 8, 4, b1, 0)])
    assert (rc, res) == (0, [-2, -1])
    assert msg == "mooncake://rec:1: read 'ka' [0,+4): batch_get_into -1 (INTERNAL_ERROR)"
    assert c.calls[-1] == ("batch_remove", [b"kb"], True) and eng.counts["dropped"] == 1


def test_put_gathers_fragments():
    """An object of one fragment is put from where it is; the fragments of
    others are gathered into one buffer; manifests are soft-pinned; a put
    refused for want of memory is tried again, then fails with its code."""
    puts = []

    class C(_Recorder):
        def batch_put_from(self, keys, ptrs, sizes, config=None):
            puts.append((keys, [ctypes.string_at(p, n) for p, n in zip(ptrs, sizes)], ptrs, config))
            return [self.answers.get(k, 0) for k in keys]
    c = C()
    eng = mc.MooncakeEngine(c, "mooncake://rec:1")
    a, b, m = ctypes.create_string_buffer(b"AAAA"), ctypes.create_string_buffer(b"BBBBBB"), ctypes.create_string_buffer(b"MM")
    keys = [b"x/p/d/0", b"meta/kv/m", b"x/done"]
    kb = ctypes.create_string_buffer(b"".join(keys))
    off = (ctypes.c_int64 * 4)(0, 7, 16, 22)
    A = ctypes.addressof
    frags = (ctypes.c_void_p * 4)(A(a), A(b) + 2, A(m), A(b))
    flens = (ctypes.c_int64 * 4)(4, 4, 2, 1)
    foff = (ctypes.c_int64 * 4)(0, 2, 3, 4)
    res = (ctypes.c_int32 * 3)()
    err = ctypes.create_string_buffer(300)

    def put():
        puts.clear()
        return eng._cbs[0](None, 3, A(kb), A(off), A(frags), A(flens), A(foff), A(res), A(err), 300)
    assert put() == 0 and list(res) == [0, 0, 0] and err.value == b""
    assert [(p[0], p[1]) for p in puts] == [([b"meta/kv/m"], [b"MM"]), ([b"x/p/d/0", b"x/done"], [b"AAAABBBB", b"B"])]
    assert puts[1][2][1] == A(b)  # one fragment: from where it is
    assert puts[0][3] is eng._pinned and puts[1][3] is eng._plain
    c.answers = {b"x/done": -200}
    assert put() == 0
    assert list(res) == [0, 0, -200] and len(puts) == 1 + 1 + mc.PUT_RETRIES
    assert err.value.decode().startswith("mooncake://rec:1: put 'x/done': -200 (NO_AVAILABLE_HANDLE) (no memory left")
