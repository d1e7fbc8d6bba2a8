"""One serving rank in its own process, for test_processes: writes or reads
pages of the oracle with kvreshard and prints one JSON line.

    python rank_main.py '{"role": "write"|"read", "url": ..., "tp": .., "pp": ..,
                          "split": [..], "rank": [t, p], "layout": .., "part_layout": ..,
                          "keys": [..], "slots": [..]}'
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE)), HERE]

import kvreshard as kv  # noqa: E402
import oracle as o  # noqa: E402

SLOTS = 6


def main():
    a = json.loads(sys.argv[1])
    m = kv.Model(layers=7, kv_heads=4, head_dim=8, dtype="bf16", page=4)
    sp = o.Spec(7, 4, 8, "bf16", 4)
    t, p = a["rank"]
    layers = o.stages(a["split"])[p]
    heads = o.heads_of(4, a["tp"], t)
    pl = kv.Placement(a["tp"], a["pp"], rank=(t, p), pp_layers=a["split"])
    _, comps = o.new_pool(sp, a["layout"], SLOTS, layers[1] - layers[0], heads[1] - heads[0])
    out = {"pid": os.getpid()}
    with kv.Store(a["url"]) as st:
        pool = kv.Pool(a["layout"], comps, SLOTS)
        if a["role"] == "write":
            for k, s in zip(a["keys"], a["slots"]):
                o.fill_slot(comps, a["layout"], s, sp, o.page(sp, k), layers, heads)
            with kv.Writer(st, m, pl, pool, a.get("part_layout")) as w:
                out["statuses"] = [s.name for s in w.write(a["keys"], a["slots"])]
        else:
            with kv.Reader(st, m, pl, pool) as r:
                res = r.read(a["keys"], a["slots"])
                out.update(hit=res.hit, stop=res.stop.name, bytes=res.bytes)
            for k, s in zip(a["keys"][:res.hit], a["slots"]):
                o.check_slot(comps, a["layout"], s, sp, o.page(sp, k), layers, heads, "rank %r" % ((t, p),))
            out["checked"] = res.hit
    print(json.dumps(out))


if __name__ == "__main__":
    main()
