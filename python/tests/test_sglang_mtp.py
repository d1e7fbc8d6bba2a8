"""The SGLang backend with MTP draft layers folded into the host pool:
pages across topologies, MLA, what refuses to start, and the model domain
of kvreshard.Model's draft_layers."""

import hashlib

import pytest

import kvreshard as kv
import kvreshard.sglang as ks
from sglang_pools import DIM, FakeMHAHostPool, FakeMLAHostPool, indices
from sglang_instances import KEYS, KV_HEADS, LAYERS, check, close, config, instance, load_backend, spec, write


# MTP: SGLang folds the draft layers of speculative decoding into the host
# pool (layer_num = target layers + drafts, the drafts after them;
# start_layer and end_layer the target's), on the last PP stage only.

def test_mtp_pages_across_topologies(tmp_path):
    """A TP 2 writer's pages with one draft layer are read exactly, draft
    layer included, by a TP 1 reader of another layout and by a TP 1 x PP 2
    one whose last stage holds the draft; a reader of the same model
    without draft layers finds none of them, and the other way round."""
    url = "file://" + str(tmp_path)
    sp = spec(drafts=1)
    w = instance(url, 2, 1, [LAYERS], "page_first", drafts=1)
    b = w[0][0].binding
    assert (b.draft_layers, b.model.layers, b.model.draft_layers, b.pp_layers) == (1, LAYERS + 1, 1, [LAYERS + 1])
    assert w[0][1].kv_buffer.shape == (2, 24, LAYERS + 1, 2, DIM)
    assert write(w, KEYS, [4, 0, 2], sp) == [[True] * 3] * 2
    r = instance(url, 1, 1, [LAYERS], "page_head", drafts=1)
    assert r[0][0].batch_exists(KEYS) == 3
    assert r[0][0].batch_get_v1(KEYS, indices([1, 5, 3])) == [True] * 3
    check(r, KEYS, [1, 5, 3], sp)
    pp = instance(url, 1, 2, [3, 4], "layer_first", drafts=1, draft_layers=1)
    assert [x[0].binding.pp_layers for x in pp] == [[3, 5]] * 2
    assert [x[2] for x in pp] == [(0, 3), (3, LAYERS + 1)]
    assert [x[0].batch_get_v1(KEYS, indices([2, 3, 0])) for x in pp] == [[True] * 3] * 2
    check(pp, KEYS, [2, 3, 0], sp)
    plain = instance(url, 1, 1, [LAYERS], "page_first")
    assert plain[0][0].batch_exists(KEYS) == 0
    assert write(plain, ["p" + k for k in KEYS], [0, 1, 2], spec()) == [[True] * 3]
    assert r[0][0].batch_exists(["p" + k for k in KEYS]) == 0
    assert plain[0][0].binding.model.domain() != r[0][0].binding.model.domain()
    close(w, r, pp, plain)


def test_mtp_mla(tmp_path):
    """MLA with two draft layers: TP 2 (rank 1 a replica) to PP 2 and back."""
    url = "file://" + str(tmp_path)
    sp = spec(mla=True, drafts=2)
    w = instance(url, 2, 1, [LAYERS], "page_first_direct", mla=True, drafts=2)
    assert write(w, KEYS, [0, 1, 2], sp) == [[True] * 3] * 2
    r = instance(url, 1, 2, [4, 3], "layer_first", mla=True, drafts=2, draft_layers=2, pp_layers=[4, 3])
    assert [x[0].binding.pp_layers for x in r] == [[4, 5]] * 2
    assert [x[0].batch_get_v1(KEYS, indices([5, 4, 3])) for x in r] == [[True] * 3] * 2
    check(r, KEYS, [5, 4, 3], sp)
    keys = ["m" + k for k in KEYS]
    assert write(r, keys, [0, 1, 2], sp) == [[True] * 3] * 2
    assert [x[0].batch_get_v1(keys, indices([3, 4, 5])) for x in w] == [[True] * 3] * 2
    check(w, keys, [3, 4, 5], sp)
    close(w, r)


def test_mtp_refuses_to_start(tmp_path):
    url = "file://" + str(tmp_path)

    def refused(cfg, pool, msg):
        with pytest.raises(ks.ConfigError) as e:
            b = load_backend(cfg)
            try:
                b.register_mem_pool_host(pool)
            finally:
                b.close()
        assert str(e.value) == "kvreshard sglang: " + msg

    last = FakeMHAHostPool("page_first", 4, 3, 7, KV_HEADS, draft_layers=1)
    refused(config(1, 2, 0, 1, url, layers=7), last,
            "the host pool holds 1 MTP draft layers after its target layers [3, 7); the other PP stages' pools do "
            "not show them: give every rank extra_config draft_layers=1")
    refused(config(1, 2, 0, 1, url, layers=7, draft_layers=2), last,
            "extra_config draft_layers=2, but the host pool of the last PP stage holds 1 (layer_num 5, target "
            "layers [3, 7))")
    refused(config(1, 2, 0, 1, url, layers=7, draft_layers=1), FakeMHAHostPool("page_first", 4, 3, 7, KV_HEADS),
            "extra_config draft_layers=1, but the host pool of the last PP stage holds 0 (layer_num 4, target "
            "layers [3, 7))")
    refused(config(1, 2, 0, 0, url, layers=7, draft_layers=1),
            FakeMHAHostPool("page_first", 4, 0, 3, KV_HEADS, draft_layers=1),
            "PP rank 0's host pool holds 1 MTP draft layers, but SGLang runs the draft on the last PP stage (1) "
            "only")
    refused(config(1, 1, 0, 0, url, draft_layers=-1), FakeMHAHostPool("page_first", 4, 0, 7, KV_HEADS),
            "extra_config draft_layers=-1 is not a whole number >= 0")
    p = FakeMLAHostPool("page_first", 4, 0, 7)
    p.target_layer_num = 4  # MLA layer sharding: the rank holds 4 of the stage's 7 layers
    refused(config(1, 1, 0, 0, url, mla=True), p, "the host pool's target_layer_num is 4 but "
                                                  "start_layer..end_layer is [0, 7): MLA layer sharding is not "
                                                  "supported")
    # the first stage of PP 2 with MTP binds the model with the draft layers
    b = load_backend(config(1, 2, 0, 0, url, layers=7, draft_layers=1))
    b.register_mem_pool_host(FakeMHAHostPool("page_first", 4, 0, 3, KV_HEADS))
    assert (b.binding.model.layers, b.binding.model.draft_layers, b.binding.pp_layers) == (8, 1, [3, 5])
    b.close()


def test_model_draft_layers_domain():
    """kvreshard.Model's draft_layers reaches the library (the last field
    of kvr_model): the domain is the SHA-256 of the canonical JSON with
    "draft_layers" first in the descriptor, and without it for 0."""
    def want(draft):
        d = '"draft_layers":%d,' % draft if draft else ""
        js = ('{"descriptor":{%s"dtype":"bf16","head_dims":[8,8],"item_size":2,"kv_heads":2,'
              '"layers":[0,1,2,3,4],"page_size":4},"fingerprint":"","model_id":"model","namespace":"kvreshard",'
              '"revision":"0"}' % d)
        return hashlib.sha256(js.encode()).hexdigest()

    for draft in (0, 1, 5):
        m = kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4, draft_layers=draft)
        assert m.domain() == want(draft)
    assert "draft_layers=2" in repr(kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4,
                                             draft_layers=2))
    with pytest.raises(kv.InvalidArgument, match="model: draft_layers 6 is not from 0 to the 5 layers"):
        kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4, draft_layers=6).domain()
    with pytest.raises(kv.InvalidArgument, match="draft_layers=-1 is out of range"):
        kv.Model(layers=5, kv_heads=2, head_dim=8, dtype="bf16", page=4, draft_layers=-1)
