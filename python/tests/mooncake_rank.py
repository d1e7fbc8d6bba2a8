"""One serving rank in its own process, for the Mooncake scenarios
(mooncake_scenario.py): writes or reads pages of the oracle with kvreshard
on a store URL and prints JSON lines. Run with a JSON argument:

    {"role": "write", "url": U, "model": {...}, "tp": T, "pp": P, "split": [...],
     "rank": [t, p], "jobs": [{"pool": L, "part": PL, "keys": [...]}]}
        writes each job's keys from slots 0.. of a pool of layout L in part
        layout PL; prints {"pid", "jobs": [{"statuses": [...]}]}, a status
        a key. A job may also say "reverse": write the keys last first,
        "batch": pages a write call, "start_at": the time.monotonic() at
        which to start writing (after the manifest is published).
    {"role": "read", ..., "jobs": [{"pool": L, "sets": [[...keys], ...]}]}
        reads each key set into a pool of layout L (slots in reverse order),
        checks every element of the pages read; prints {"pid", "jobs":
        [{"reads": [{"hit", "stop", "message", "checked", "bad"}]}]}.
    {"role": "lockstep", ..., "jobs": [{"pool", "part", "keys", "batch"}]}
        every rank of the topology in this one process, each batch of keys
        written by every rank before the next batch; prints {"pid", "jobs":
        [{"statuses": [[...] a rank]}]}.
    {"role": "loop", ..., "pool": L, "keys": [...], "pause": s}
        reads the keys again and again until its stdin ends, a JSON line a
        read: {"i", "t" (monotonic), "seconds", "hit", "stop", "message",
        "bad"}; "bad" is the first element that differs, or null.

The model is {"layers", "kv_heads", "head_dim", "dtype", "page"}; the page
of key k is oracle.page(Spec(...), k) under every topology and layout.
"""

import itertools
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import kvreshard as kv  # noqa: E402
import oracle as o  # noqa: E402


def main():
    a = json.loads(sys.argv[1])
    md = a["model"]
    m = kv.Model(layers=md["layers"], kv_heads=md["kv_heads"], head_dim=md["head_dim"], dtype=md["dtype"],
                 page=md["page"])
    sp = o.Spec(md["layers"], md["kv_heads"], md["head_dim"], md["dtype"], md["page"])
    out = {"pid": os.getpid(), "jobs": []}
    st = kv.Store(a["url"])
    if a["role"] == "lockstep":
        lockstep(st, m, sp, a, out)
        st.close()
        print(json.dumps(out), flush=True)
        return
    t, p = a["rank"]
    layers = o.stages(a["split"])[p]
    heads = o.heads_of(md["kv_heads"], a["tp"], t)
    nl, nh = layers[1] - layers[0], heads[1] - heads[0]
    pl = kv.Placement(a["tp"], a["pp"], rank=(t, p), pp_layers=a["split"])
    if a["role"] == "write":
        for job in a["jobs"]:
            keys = job["keys"]
            _, comps = o.new_pool(sp, job["pool"], len(keys), nl, nh)
            for s, k in enumerate(keys):
                o.fill_slot(comps, job["pool"], s, sp, o.page(sp, k), layers, heads)
            with kv.Writer(st, m, pl, kv.Pool(job["pool"], comps, len(keys)), job["part"]) as w:
                w.publish()
                order = list(range(len(keys)))[::-1 if job.get("reverse") else 1]
                statuses = [None] * len(keys)
                if "start_at" in job:  # CLOCK_MONOTONIC: the machine's, shared by the processes
                    time.sleep(max(0, job["start_at"] - time.monotonic()))
                b = job.get("batch") or len(keys)
                for i in range(0, len(order), b):
                    idx = order[i:i + b]
                    for j, s in zip(idx, w.write([keys[j] for j in idx], idx)):
                        statuses[j] = s.name
                out["jobs"].append({"statuses": statuses})
    elif a["role"] == "read":
        for job in a["jobs"]:
            n = max(len(ks) for ks in job["sets"])
            _, comps = o.new_pool(sp, job["pool"], n, nl, nh)
            reads = []
            with kv.Reader(st, m, pl, kv.Pool(job["pool"], comps, n)) as r:
                for keys in job["sets"]:
                    slots = list(range(len(keys) - 1, -1, -1))
                    res = r.read(keys, slots)
                    reads.append({"hit": res.hit, "stop": res.stop.name, "message": res.message,
                                  "checked": 0, "bad": check(comps, job["pool"], slots, sp, keys[:res.hit],
                                                             layers, heads)})
                    if reads[-1]["bad"] is None:
                        reads[-1]["checked"] = res.hit
            out["jobs"].append({"reads": reads})
    else:
        loop(st, m, pl, sp, a, layers, heads, nl, nh)
        return
    st.close()
    print(json.dumps(out), flush=True)


def lockstep(st, m, sp, a, out):
    """Every rank of the topology in this process, writing the job's keys
    a batch at a time, each batch by every rank before the next: the parts
    of a page are put close together in time."""
    job = a["jobs"][0]
    keys, b = job["keys"], job.get("batch") or len(job["keys"])
    writers = []
    for p, t in itertools.product(range(a["pp"]), range(a["tp"])):
        layers, heads = o.stages(a["split"])[p], o.heads_of(sp.kv_heads, a["tp"], t)
        _, comps = o.new_pool(sp, job["pool"], len(keys), layers[1] - layers[0], heads[1] - heads[0])
        for s, k in enumerate(keys):
            o.fill_slot(comps, job["pool"], s, sp, o.page(sp, k), layers, heads)
        writers.append(kv.Writer(st, m, kv.Placement(a["tp"], a["pp"], rank=(t, p), pp_layers=a["split"]),
                                 kv.Pool(job["pool"], comps, len(keys)), job["part"]))
    statuses = [[] for _ in writers]
    for i in range(0, len(keys), b):
        for w, sts in zip(writers, statuses):
            sts += [s.name for s in w.write(keys[i:i + b], range(i, min(i + b, len(keys))))]
    for w in writers:
        w.close()
    out["jobs"].append({"statuses": statuses})


def check(comps, layout, slots, sp, keys, layers, heads):
    """None when every page of keys is in its slot, else what differs."""
    for s, k in zip(slots, keys):
        try:
            o.check_slot(comps, layout, s, sp, o.page(sp, k), layers, heads, "page %s" % k)
        except AssertionError as e:
            return str(e)
    return None


def loop(st, m, pl, sp, a, layers, heads, nl, nh):
    keys = a["keys"]
    _, comps = o.new_pool(sp, a["pool"], len(keys), nl, nh)
    pages = {k: o.page(sp, k) for k in keys}
    stop = threading.Event()

    def watch():
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    slots = list(range(len(keys) - 1, -1, -1))
    r = kv.Reader(st, m, pl, kv.Pool(a["pool"], comps, len(keys)))
    i = 0
    while not stop.is_set():
        for c in comps:
            c.fill(0)
        t0 = time.monotonic()
        res = r.read(keys, slots)
        d = time.monotonic() - t0
        bad = None
        for s, k in zip(slots, keys[:res.hit]):
            try:
                o.check_slot(comps, a["pool"], s, sp, pages[k], layers, heads, "page %s" % k)
            except AssertionError as e:
                bad = str(e)
                break
        print(json.dumps({"i": i, "t": t0, "seconds": d, "hit": res.hit, "stop": res.stop.name,
                          "message": res.message[:300], "bad": bad}), flush=True)
        i += 1
        stop.wait(a.get("pause", 0.02))
    r.close()
    t0 = time.monotonic()
    st.close()
    print(json.dumps({"closed": time.monotonic() - t0}), flush=True)


if __name__ == "__main__":
    main()
