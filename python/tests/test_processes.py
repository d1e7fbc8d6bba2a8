"""Writers and readers in different Python processes, each rank its own
process (as serving ranks are): pages written by processes that have
exited are read by others, every element checked."""

import itertools
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_topology(role, url, topo, layout, keys, slots, part_layout=None):
    tp, pp, split = topo
    procs = []
    for pr, t in itertools.product(range(pp), range(tp)):
        a = dict(role=role, url=url, tp=tp, pp=pp, split=split, rank=[t, pr], layout=layout,
                 keys=keys, slots=slots, part_layout=part_layout)
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "rank_main.py"), json.dumps(a)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for pr in procs:
        so, se = pr.communicate(timeout=300)
        assert pr.returncode == 0 and se == "", "exit %d\n%s%s" % (pr.returncode, so, se)
        outs.append(json.loads(so))
    assert len({x["pid"] for x in outs}) == len(outs)
    return outs


@pytest.mark.parametrize("src,dst", [((1, 3, [2, 2, 3]), (2, 2, [3, 4])),
                                     ((2, 2, [3, 4]), (1, 3, [2, 2, 3]))])
def test_writer_and_reader_processes(tmp_path, src, dst):
    url = "file://" + str(tmp_path / "store")
    keys = ["p1", "p2", "p3", "p4"]
    outs = run_topology("write", url, src, "page_first", keys, [3, 2, 1, 0], part_layout="LPHD")
    assert [x["statuses"] for x in outs] == [["WRITTEN"] * 4] * len(outs)
    outs = run_topology("read", url, dst, "page_head", keys + ["p5"], [0, 1, 5, 4, 2])
    assert [(x["hit"], x["stop"], x["checked"]) for x in outs] == [(4, "MISS", 4)] * len(outs)
