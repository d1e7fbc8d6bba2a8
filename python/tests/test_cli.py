"""Pages written by the kvreshard command are found by the package with
the same model fields (the command's defaults are the package's) and the
keys the header documents: "%016x" % (i * 0x9e3779b97f4a7c15)."""

import os
import subprocess

import numpy as np

import kvreshard as kv
import oracle as o

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_pages_of_the_command(tmp_path):
    exe = str(tmp_path / "kvreshard")
    p = subprocess.run(["go", "build", "-o", exe, "./cmd/kvreshard"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    url = "file://" + str(tmp_path / "store")
    p = subprocess.run([exe, "write", "--store", url, "--model", "layers=6,kv-heads=4,head-dim=8,dtype=fp16,page=4",
                        "--src", "tp=2,pp=3,layout=HPLD", "--pages", "5"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    keys = ["%016x" % ((i * 0x9e3779b97f4a7c15) & (1 << 64) - 1) for i in range(6)]
    sp = o.Spec(6, 4, 8, "fp16", 4)
    _, comps = o.new_pool(sp, "page_first_direct", 6, 3, 2)
    m = kv.Model(layers=6, kv_heads=4, head_dim=8, dtype="fp16", page=4)
    with kv.Store(url) as st, kv.Reader(st, m, kv.Placement(2, 2, rank=(1, 1)), kv.Pool("page_first_direct", comps, 6)) as r:
        assert r.exists(keys) == 5
        res = r.read(keys, [5, 4, 3, 2, 1, 0])
        assert (res.hit, res.stop, res.bytes) == (5, kv.Stop.MISS, 5 * 4 * 3 * 2 * 8 * 2 * 2)
        other = kv.Model(layers=6, kv_heads=4, head_dim=8, dtype="fp16", page=4, name="other")
        with kv.Reader(st, other, kv.Placement(2, 2, rank=(1, 1)), kv.Pool("page_first_direct", comps, 6)) as r2:
            assert r2.exists(keys) == 0
    # every element of every page read is one the command wrote (no zero left)
    for s in range(1, 6):
        for c in comps:
            assert np.count_nonzero(o.slot_view(c, "page_first_direct", s, 4) == 0) == 0


def test_demo_when_a_writer_fails(tmp_path, monkeypatch, capsys):
    """A writer rank that fails makes the demo exit 1 with its error, the
    readers not started (their answers were a list, not a dict, and the
    report raised AttributeError)."""
    from kvreshard import demo

    calls = []

    def run_ranks(role, *args):
        calls.append(role)
        return {}, ["write rank (0, 0): exit 1\nboom"]
    monkeypatch.setattr(demo, "run_ranks", run_ranks)
    assert demo.main(["--store", "file://" + str(tmp_path), "--pages", "1"]) == 1
    assert calls == ["write"]
    out, err = capsys.readouterr()
    assert "kvreshard demo: write rank (0, 0): exit 1\nboom" in err
    assert out.rstrip().endswith("the demo failed")
