"""The Mooncake scenarios of test_mooncake.py. Each runs inside a network
namespace with only loopback (test_mooncake starts it so), starts its own
mooncake_master and memory holder (kvreshard.mooncake_local), runs writer
and reader ranks as separate processes (mooncake_rank.py, segment 0,
MC_STORE_MEMCPY=false), and prints one JSON line with what it saw; the test
asserts on it. Every wait is bounded and every process is killed at the
end, or when this driver dies (PR_SET_PDEATHSIG).

    python mooncake_scenario.py NAME [JSON options]
"""

import itertools
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from kvreshard import mooncake_local as ml  # noqa: E402

RANK = os.path.join(HERE, "mooncake_rank.py")
TP1PP3 = (1, 3, [2, 2, 3])
TP2PP2 = (2, 2, [3, 4])
SMALL = {"layers": 7, "kv_heads": 4, "head_dim": 16, "dtype": "bf16", "page": 8}
MiB = 1 << 20


def ranks(topo):
    tp, pp, split = topo
    for p, t in itertools.product(range(pp), range(tp)):
        yield t, p


def rank_args(role, url, model, topo, rank, **kw):
    tp, pp, split = topo
    return dict(role=role, url=url, model=model, tp=tp, pp=pp, split=split, rank=list(rank), **kw)


def spawn(args, stdin=None):
    return subprocess.Popen([sys.executable, RANK, json.dumps(args)], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ml.client_env(),
                            preexec_fn=ml.die_with_parent)


def finish(procs, timeout=300):
    """Wait for rank processes; their JSON answers. RuntimeError (with the
    output) when one fails or does not exit in time."""
    end = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError("a rank process did not exit within %ds" % timeout)
        lines = [l for l in so.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError("rank process exit %d\n%s\n%s" % (p.returncode, so[-3000:], se[-3000:]))
        outs.append(json.loads(lines[-1]))
    return outs


def run_topology(role, url, model, topo, jobs, timeout=300):
    """Every rank of topo as its own process, all at once; their answers,
    after all exited."""
    return finish([spawn(rank_args(role, url, model, topo, r, jobs=jobs)) for r in ranks(topo)], timeout)


def keys(prefix, n):
    return ["%s%03d" % (prefix, i) for i in range(n)]


# ---------------------------------------------------------------------------

def reshard(o):
    """TP1/PP3 writers in each part layout (from pools of other layouts),
    exited, then TP2/PP2 readers in every pool layout."""
    n = o.get("pages", 6)
    model = o.get("model", SMALL)
    parts = {"PLHD": "page_first_direct", "LPHD": "page_head", "HPLD": "page_first"}
    sets = {pl: keys("r%s-" % pl.lower(), n) for pl in parts}
    with ml.Master() as m, ml.Holder(m, 64 * MiB):
        w = run_topology("write", m.url, model, TP1PP3, [{"pool": pool, "part": pl, "keys": sets[pl]}
                                                         for pl, pool in parts.items()])
        wpids = [x["pid"] for x in w]
        alive = [pid for pid in wpids if os.path.exists("/proc/%d" % pid)]
        jobs = [{"pool": pool, "sets": [sets[pl] + ["absent"] for pl in parts]} for pool in ml_pools()]
        r = run_topology("read", m.url, model, TP2PP2, jobs)
    return {"parts": list(parts), "pools": ml_pools(), "pages": n, "writers": w, "writer_pids": wpids,
            "writers_alive_at_read": alive, "readers": r}


def ml_pools():
    return ["layer_first", "page_first", "page_first_direct", "page_head"]


def race(o):
    """TP1/PP3 (PLHD parts) and TP2/PP2 (LPHD parts) writers of the same
    pages at once, a reader reading them meanwhile; then every layout reads
    them. A page is one layout's, whole, never a mix."""
    n = o.get("pages", 24)
    model = o.get("model", SMALL)
    ks = keys("race-", n)
    with ml.Master() as m, ml.Holder(m, 64 * MiB):
        loop = spawn(rank_args("loop", m.url, model, TP2PP2, (1, 1), pool="page_first", keys=ks, pause=0.005),
                     stdin=subprocess.PIPE)
        # both start at once, one from the first page, the other from the
        # last, a few pages a call: they meet somewhere in between
        at = time.monotonic() + 3
        a = [spawn(rank_args("write", m.url, model, TP1PP3, r, jobs=[{
            "pool": "page_first", "part": "PLHD", "keys": ks, "batch": 2, "start_at": at}])) for r in ranks(TP1PP3)]
        b = [spawn(rank_args("write", m.url, model, TP2PP2, r, jobs=[{
            "pool": "page_head", "part": "LPHD", "keys": ks, "batch": 2, "start_at": at, "reverse": True}]))
            for r in ranks(TP2PP2)]
        wa, wb = finish(a), finish(b)
        time.sleep(0.5)
        lines = finish_loop(loop)  # its stdin ends: it stops
        jobs = [{"pool": pool, "sets": [ks]} for pool in ml_pools()]
        r3 = run_topology("read", m.url, model, TP1PP3, jobs)
        r2 = run_topology("read", m.url, model, TP2PP2, jobs)
    return {"pages": n, "a": [x["jobs"][0]["statuses"] for x in wa], "b": [x["jobs"][0]["statuses"] for x in wb],
            "loop": lines, "readers": r3 + r2}


def finish_loop(p, timeout=120):
    try:
        so, se = p.communicate("", timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        raise RuntimeError("the reading loop did not exit within %ds after its stdin ended\n%s" % (timeout, se[-3000:]))
    if p.returncode != 0:
        raise RuntimeError("reading loop exit %d\n%s\n%s" % (p.returncode, so[-3000:], se[-3000:]))
    return [json.loads(l) for l in so.splitlines() if l.startswith("{")]


def evict(o):
    """More pages than the holder's memory: the master evicts. Every page a
    reader reads is right; the others are misses."""
    n = o.get("pages", 128)
    model = o.get("model", {"layers": 7, "kv_heads": 4, "head_dim": 64, "dtype": "bf16", "page": 32})
    segment = o.get("segment", 16 * MiB)  # Mooncake's least
    page_bytes = model["layers"] * model["kv_heads"] * model["head_dim"] * 2 * 2 * model["page"]
    ks = keys("ev-", n)
    # Every query or read leases what it touches (10 s by default): nothing
    # leased is evicted, so that a short lease lets the writes go on
    with ml.Master(lease_ms=o.get("lease_ms", 1000)) as m, ml.Holder(m, segment):
        # the ranks of TP1/PP3 in one process, a batch at a time: a page's
        # parts are put close together, so that many pages stay whole
        w = finish([spawn(rank_args("lockstep", m.url, model, TP1PP3, (0, 0), jobs=[{
            "pool": "page_first", "part": "LPHD", "keys": ks, "batch": 8}]))])
        metrics = m.metrics()
        jobs = [{"pool": pool, "sets": [[k] for k in ks] + [ks]} for pool in ("page_first", "page_head")]
        r = run_topology("read", m.url, model, TP2PP2, jobs)
        # a page found missing is written again, and then read
        # (the store is full: the new parts may be evicted in turn, so a
        # writer tries again, as a framework would on the next miss)
        missed = [k for k, x in zip(ks, r[0]["jobs"][0]["reads"]) if x["hit"] == 0][:2]
        again, attempts = None, 0
        while missed and attempts < 3:
            attempts += 1
            run_topology("write", m.url, model, TP1PP3, [{"pool": "page_first", "part": "LPHD", "keys": missed}])
            again = run_topology("read", m.url, model, TP2PP2, [{"pool": "page_first_direct", "sets": [missed]}])
            if all(x["jobs"][0]["reads"][0]["hit"] == len(missed) for x in again):
                break
    return {"pages": n, "page_bytes": page_bytes, "segment": segment, "writers": w, "readers": r,
            "missed": missed, "again": again, "attempts": attempts,
            "evicted": metrics.get("master_evicted_key_count"), "keys": metrics.get("master_key_count")}


class Loop:
    """A reader rank reading the same pages again and again in its own
    process; its lines are collected by a thread."""

    def __init__(self, url, model, ks, pool="page_first"):
        self.p = spawn(rank_args("loop", url, model, TP2PP2, (0, 0), pool=pool, keys=ks, pause=0.01),
                       stdin=subprocess.PIPE)
        self.lines = []
        self.err = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.err.append(self.p.stderr.read()), daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            if line.startswith("{"):
                with self.cv:
                    self.lines.append(json.loads(line))
                    self.cv.notify_all()
        with self.cv:
            self.lines.append({"eof": True})
            self.cv.notify_all()

    def wait(self, what, cond, timeout):
        """The first line (after those seen) for which cond holds; RuntimeError
        after timeout seconds."""
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                for x in self.lines:
                    if x.get("eof"):
                        raise RuntimeError("the reading loop exited while waiting for %s: %s" % (
                            what, "".join(self.err)[-3000:]))
                    if cond(x):
                        return x
                left = end - time.monotonic()
                if left <= 0:
                    raise RuntimeError("no read of the loop %s within %ds (last: %s)" % (
                        what, timeout, self.lines[-1:] or None))
                self.cv.wait(min(left, 1))

    def close(self, timeout=120):
        """End the loop (its stdin); the seconds it took to exit."""
        t0 = time.monotonic()
        self.p.stdin.close()
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None
        time.sleep(0.2)
        return time.monotonic() - t0


def statuses(outs):
    """The write statuses of rank answers, as {status: count}."""
    c = {}
    for x in outs:
        for j in x["jobs"]:
            for s in j["statuses"]:
                c[s] = c.get(s, 0) + 1
    return c


FAULT_MODEL = {"layers": 7, "kv_heads": 4, "head_dim": 128, "dtype": "bf16", "page": 64}


def fault(o):
    """A reader reading in a loop while the holder (or the master) is killed
    with SIGKILL mid-read: every read returns (a failure or a miss) in
    bounded time, never a wrong byte; after a restart and the pages written
    again, the same reader reads them again."""
    victim = o["victim"]
    n = o.get("pages", 32)
    model = o.get("model", FAULT_MODEL)
    ks = keys("f-", n)
    write = [{"pool": "page_first", "part": o.get("part", "LPHD"), "keys": ks}]
    out = {"victim": victim, "pages": n}
    with ml.Master(client_ttl=o.get("client_ttl")) as m:
        holder = ml.Holder(m, 256 * MiB)
        try:
            out["writes"] = [statuses(run_topology("write", m.url, model, TP1PP3, write))]
            loop = Loop(m.url, model, ks)
            try:
                loop.wait("that read every page", lambda x: x.get("hit") == n, 60)
                first = loop.wait("after the first", lambda x: x.get("hit") == n and x["i"] >= 3, 60)
                time.sleep(0.003)
                t_kill = time.monotonic()
                (holder if victim == "holder" else m).kill()
                out["killed_after_read"] = first["i"]
                # Reads go on, failures or misses, each in bounded time. A
                # dead holder's objects go when the master expires it
                # (client_ttl): wait for a miss then. A dead master answers
                # nothing: restart it after a few seconds of failures.
                if victim == "holder":
                    loop.wait("that misses after the kill", lambda x: x.get("t", 0) > t_kill
                              and x["hit"] == 0 and x["stop"] == "MISS", 120)
                else:
                    loop.wait("after the master's outage", lambda x: x.get("t", 0) > t_kill + o.get("outage", 8), 120)
                t_restart = time.monotonic()
                if victim == "holder":
                    holder.close()
                    holder = ml.Holder(m, 256 * MiB)
                else:
                    m.start()  # the same port; the holder mounts its memory again by itself
                    ml.wait_until("the holder's memory at the restarted master",
                                  lambda: m.capacity() >= 256 * MiB, 60)
                # Written again until the reader reads every page, as
                # SGLang's backups write again what the store lacks: until
                # the master drops a dead holder (its lease, client_ttl) it
                # may place puts on it, which fail, and it lists the dead
                # holder's objects, whose keys a put keeps (the first writer
                # wins) until a read finds them lost and removes them.
                out["write_rounds"] = 0
                while True:
                    st = statuses(run_topology("write", m.url, model, TP1PP3, write))
                    out["write_rounds"] += 1
                    t_written = time.monotonic()
                    try:
                        back = loop.wait("that reads every page again", lambda x: x.get("t", 0) > t_written
                                         and x["hit"] == n, 5)
                        break
                    except RuntimeError:
                        if out["write_rounds"] == 24:
                            raise
                out["writes"].append(st)
                out["back_after"] = back["t"] - t_restart
            finally:
                out["exit_seconds"] = loop.close()
                with loop.cv:
                    lines = [x for x in loop.lines if "i" in x]
                out["before"] = [x for x in lines if x["t"] < t_kill] if "killed_after_read" in out else lines
                out["after"] = [x for x in lines if "killed_after_read" in out and x["t"] >= t_kill]
                out["stderr_tail"] = "".join(loop.err)[-1500:]
        finally:
            holder.close()
    return out


def demo(o):
    """python -m kvreshard demo on this master."""
    with ml.Master() as m, ml.Holder(m, 128 * MiB):
        p = subprocess.run([sys.executable, "-m", "kvreshard", "demo", "--store", m.url, "--pages",
                            str(o.get("pages", 8)), "--json"], capture_output=True, text=True, env=ml.client_env(),
                           timeout=600, preexec_fn=ml.die_with_parent)
    return {"code": p.returncode, "stdout": p.stdout[-20000:], "stderr": p.stderr[-3000:]}


def wrap(o):
    """Store.from_mooncake on a client of this process, and the engine's
    life: a store closed while a reader is open closes its client only
    after the reader; after that the engine refuses calls without touching
    the client."""
    import ctypes
    os.environ.update(ml.client_env())
    import kvreshard as kv
    import oracle as orc
    from mooncake.store import MooncakeDistributedStore
    md = SMALL
    sp = orc.Spec(md["layers"], md["kv_heads"], md["head_dim"], md["dtype"], md["page"])
    m_ = kv.Model(**md)
    ks = keys("w-", 4)
    out = {}
    with ml.Master() as m, ml.Holder(m, 64 * MiB):
        c = MooncakeDistributedStore()
        out["setup"] = c.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", m.addr)
        st = kv.Store.from_mooncake(c)
        out["url"] = st.url
        _, comps = orc.new_pool(sp, "page_first", 4, md["layers"], md["kv_heads"])
        for i, k in enumerate(ks):
            orc.fill_slot(comps, "page_first", i, sp, orc.page(sp, k), (0, md["layers"]), (0, md["kv_heads"]))
        with kv.Writer(st, m_, kv.Placement(1, 1), kv.Pool("page_first", comps, 4), "HPLD") as w:
            out["statuses"] = [x.name for x in w.write(ks, range(4))]
        # another client, owned by its store: a reader keeps it open
        st2 = kv.Store(m.url)
        eng2 = st2._engine
        _, comps2 = orc.new_pool(sp, "layer_first", 4, 4, 2)
        r = kv.Reader(st2, m_, kv.Placement(2, 2, rank=(1, 1), pp_layers=[3, 4]), kv.Pool("layer_first", comps2, 4))
        st2.close()
        out["open_while_reader"] = [eng2.closed, eng2._released]
        res = r.read(ks, [3, 2, 1, 0])
        out["read"] = [res.hit, res.stop.name]
        out["bad"] = check_pages(comps2, "layer_first", [3, 2, 1, 0], sp, ks[:res.hit], (3, 7), (2, 4))
        r.close()
        out["after_reader"] = [eng2.closed, eng2._released]
        eng = st._engine
        st.close()
        out["wrapped_after_close"] = [eng.closed, eng._released]
        # the library's close has run: a call now is refused, the client untouched
        err = ctypes.create_string_buffer(256)
        kb = ctypes.create_string_buffer(b"x")
        off = (ctypes.c_int64 * 2)(0, 1)
        ex = (ctypes.c_uint8 * 1)()
        rc = eng._cbs[2](None, 1, ctypes.addressof(kb), ctypes.addressof(off), ctypes.addressof(ex),
                         ctypes.addressof(err), 256)
        out["refused"] = [rc, err.value.decode()]
        out["client_after"] = c.batch_is_exist([b"meta/none"])  # the caller's client still works
        c.close()
    return out


def check_pages(comps, layout, slots, sp, ks, layers, heads):
    import oracle as orc
    for s_, k in zip(slots, ks):
        try:
            orc.check_slot(comps, layout, s_, sp, orc.page(sp, k), layers, heads)
        except AssertionError as e:
            return str(e)
    return None


def sglang(o):
    """SGLang ranks (sglang_rank.py: SGLang's own backend factory and
    storage config) whose extra_config names the store as SGLang's Mooncake
    backend does (master_server_address, protocol, global_segment_size
    0: the holder keeps the memory): TP 2 writers in page_first, exited,
    then TP 1 x PP 2 readers in page_head, every element checked."""
    import sglang_env
    keys_ = ["s1", "s2", "s3", "s4"]

    def run(role, api, topo, layout, ks, slots, extra):
        tp, pp, split = topo
        procs = []
        for p, t in itertools.product(range(pp), range(tp)):
            a = dict(role=role, api=api, url=None, tp=tp, pp=pp, rank=[t, p], split=split, layout=layout,
                     keys=ks, slots=slots, extra=extra)
            procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "sglang_rank.py"), json.dumps(a)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=ml.client_env(sglang_env.subprocess_env()),
                                          preexec_fn=ml.die_with_parent))
        return finish(procs)

    with ml.Master() as m, ml.Holder(m, 64 * MiB):
        extra = {"master_server_address": m.addr, "protocol": "tcp", "metadata_server": "P2PHANDSHAKE",
                 "global_segment_size": 0, "local_hostname": "127.0.0.1"}
        w = run("write", "v1", (2, 1, [7]), "page_first", keys_, [3, 2, 1, 0], extra)
        r = run("read", "v2", (1, 2, [3, 4]), "page_head", keys_ + ["s5"], [0, 1, 5, 4, 2], extra)
    return {"writers": w, "readers": r}


SCENARIOS = {"reshard": reshard, "race": race, "evict": evict, "fault": fault, "demo": demo, "wrap": wrap,
             "sglang": sglang}


def main():
    name = sys.argv[1]
    opts = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    ml.require_loopback_only("mooncake scenario " + name)
    t0 = time.monotonic()
    out = SCENARIOS[name](opts)
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
