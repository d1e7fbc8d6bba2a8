"""kvreshard.sglang driven through SGLang 0.5.23's own HiCache storage files:
hicache_storage.py (HiCacheStorage, HiCacheStorageConfig, PoolName,
PoolTransfer, PoolTransferResult) and storage/backend_factory.py
(StorageBackendFactory.create_backend("dynamic", ...) with module_path
kvreshard.sglang, class_name KvreshardStorage), imported without torch in
processes of their own (sglang_env explains how and why). Writers and
readers are separate rank processes (sglang_rank.py); bytes are compared
with the oracle. Without sglang in .venv these tests skip and say `make
venv`, unless KVRESHARD_REQUIRE_PYTHON=1, where they fail."""

import itertools
import json
import os
import subprocess
import sys

import pytest

import sglang_env

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ["p1", "p2", "p3", "p4"]


def run_ranks(role, api, url, topo, layout, keys, slots, mla=False, drafts=0, extra=None):
    """One sglang_rank.py process per rank of topo (tp, pp, split), all at
    once; their JSON lines in rank order (PP-major)."""
    tp, pp, split = topo
    procs = []
    for p, t in itertools.product(range(pp), range(tp)):
        a = dict(role=role, api=api, url=url, tp=tp, pp=pp, rank=[t, p], split=split, layout=layout, mla=mla,
                 drafts=drafts, keys=keys, slots=slots, extra=extra or {})
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "sglang_rank.py"), json.dumps(a)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=sglang_env.subprocess_env()))
    outs = []
    for pr in procs:
        so, se = pr.communicate(timeout=300)
        assert pr.returncode == 0, "exit %d\n%s%s" % (pr.returncode, so, se)
        outs.append(json.loads(so.strip().splitlines()[-1]))
    assert len({x["pid"] for x in outs}) == len(outs)
    return outs


# (writer topology, layout, api), (reader topology, layout, api), mla, drafts
CASES = {
    "mha-v1": (((1, 3, [2, 2, 3]), "page_first", "v1"), ((2, 2, [3, 4]), "page_head", "v1"), False, 0),
    "mha-v2-to-v1": (((2, 2, [3, 4]), "layer_first", "v2"), ((1, 3, [2, 2, 3]), "page_first_direct", "v1"),
                     False, 0),
    "mha-v1-to-v2": (((2, 1, [7]), "page_head", "v1"), ((1, 2, [3, 4]), "page_first", "v2"), False, 0),
    "mla": (((2, 1, [7]), "page_first", "v1"), ((1, 2, [3, 4]), "layer_first", "v2"), True, 0),
    "mtp-mha": (((2, 1, [7]), "page_first", "v2"), ((1, 1, [7]), "page_head", "v1"), False, 1),
    "mtp-mha-pp": (((2, 1, [7]), "page_first_direct", "v1"), ((1, 2, [3, 4]), "layer_first", "v2"), False, 1),
    "mtp-mla": (((2, 1, [7]), "page_first_direct", "v2"), ((1, 2, [3, 4]), "page_first", "v1"), True, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_writers_and_readers_through_sglang(tmp_path, case):
    sglang_env.require_sglang()
    (wtopo, wl, wapi), (rtopo, rl, rapi), mla, drafts = CASES[case]
    url = "file://" + str(tmp_path / "store")
    extra = {"draft_layers": drafts} if drafts else {}
    outs = run_ranks("write", wapi, url, wtopo, wl, KEYS, [3, 2, 1, 0], mla=mla, drafts=drafts, extra=extra)
    assert [x["stored"] for x in outs] == [[True] * 4] * len(outs)
    if mla:  # TP rank 0 writes the latent, the others hold replicas
        assert [x["writer"]["written"] for x in outs] == [4 if i % wtopo[0] == 0 else 0 for i in range(len(outs))]
    assert {x["draft_layers"] for x in outs} == {drafts}
    outs = run_ranks("read", rapi, url, rtopo, rl, KEYS + ["p5"], [0, 1, 5, 4, 2], mla=mla, drafts=drafts,
                     extra=extra)
    assert [(x["exists"], x["read"], x["checked"], x["errors"]) for x in outs] == \
        [(4, [True] * 4 + [False], 4, 0)] * len(outs)
    if rapi == "v2":
        assert [x["exists_pools"] for x in outs] == [{"kv": 4}] * len(outs)
    # the last PP stage's pool holds the draft layers, after the target's
    assert outs[-1]["layers"][1] == sum(rtopo[2]) + drafts
    assert {tuple(x["pp_layers"]) for x in outs} == {tuple(rtopo[2][:-1] + [rtopo[2][-1] + drafts])}
    if drafts:
        # the same model without draft layers sees none of these pages
        outs = run_ranks("read", "v1", url, (1, 1, [7]), "page_first", KEYS, [0, 1, 2, 3], mla=mla)
        assert [(x["exists"], x["read"]) for x in outs] == [(0, [False] * 4)]


def test_sglang_api_in_process():
    """sglang_suite.py under pytest, in a process of SGLang's own classes."""
    sglang_env.require_sglang()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                        os.path.join(HERE, "sglang_suite.py")], capture_output=True, text=True, timeout=600,
                       cwd=HERE, env=sglang_env.subprocess_env(PYTHONDONTWRITEBYTECODE="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert " passed" in p.stdout.strip().splitlines()[-1] and "skipped" not in p.stdout, p.stdout


def test_stand_ins_without_sglang(tmp_path):
    """With SGLang not importable at all the module uses its stand-ins, and
    v1 and v2 work on them."""
    code = """
import sys
sys.modules["sglang"] = None  # no SGLang at all
import kvreshard.sglang as ks
from sglang_pools import FakeMHAHostPool, indices
assert not ks.HAVE_SGLANG and ks.PoolName.KV == "kv" and ks.storage_metrics_class() is None
cfg = ks.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, True, True, "m",
                              extra_config={"interface_v1": 1, "url": sys.argv[1]})
b = ks.KvreshardStorage(cfg, {})
pool = FakeMHAHostPool("page_first", 4, 0, 3, 2)
b.register_mem_pool_host(pool)
b.register_mem_host_pool_v2(pool, ks.PoolName.KV)
b.on_host_pools_registered()
t = ks.PoolTransfer(ks.PoolName.KV, host_indices=indices([0, 1]), keys=["a", "b"])
assert b.batch_set_v2([t]) == {ks.PoolName.KV: [True, True]}
assert b.batch_exists_v2(["a", "b", "c"]) == ks.PoolTransferResult(2, {ks.PoolName.KV: 2})
assert b.batch_get_v1(["a"], indices([2])) == [True]
assert b.get_stats() is None
b.close()
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]))
    p = subprocess.run([sys.executable, "-c", code, "file://" + str(tmp_path)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (0, "ok\n", "")
