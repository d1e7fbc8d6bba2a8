"""kvreshard.layouts() and define_layout(): the built-ins, layouts defined
at run time from their order, pages moved through them on the library's
interpreter (every element checked against the oracle of their order),
the errors with kvlc's messages, and a library of an older minor ABI
version."""

import itertools
import os
import shutil
import subprocess

import numpy as np
import pytest

import kvreshard as kv
import oracle as o
from kvreshard import _lib

BUILTINS = [
    ("PLHD", "part", "C T L H D", None),
    ("LPHD", "part", "C L T H D", None),
    ("HPLD", "part", "C H T L D", None),
    ("page_first", "pool", "C S T L H D", "PLHD"),
    ("page_first_direct", "pool", "C S L T H D", "LPHD"),
    ("layer_first", "pool", "C L S T H D", "LPHD"),
    ("page_head", "pool", "C S H T L D", "HPLD"),
]

# vLLM's x-blocked key cache as a part layout, and the per-layer host pool
# of examples/customlayout (which the library does not link: defined here).
XBLOCK = ("xblock8", "part", "C L H D/8 T D%8")
VLLM_HOST = ("vllm_host", "pool", "L C S T H D")

SPEC = dict(layers=7, kv_heads=4, head_dim=16, dtype="bf16", page=4)
SP = o.Spec(7, 4, 16, "bf16", 4)
TP1PP3 = (1, 3, [2, 2, 3])
TP2PP2 = (2, 2, [3, 4])
SLOTS = 5
FILL = 0xA5A5


def define_custom():
    return kv.define_layout(*XBLOCK), kv.define_layout(*VLLM_HOST)


def ranks(topo):
    tp, pp, split = topo
    st = o.stages(split)
    for p, t in itertools.product(range(pp), range(tp)):
        yield kv.Placement(tp, pp, rank=(t, p), pp_layers=split), st[p], o.heads_of(SP.kv_heads, tp, t)


def pool(layout, order, layers, heads, fill=0):
    """A rank's pool of a layout, as the oracle of its order lays it out:
    (kvreshard Pool, regions)."""
    regions = o.new_order_pool(SP, order, SLOTS, layers[1] - layers[0], heads[1] - heads[0], fill=fill)
    return kv.Pool(layout, regions, SLOTS), regions


def write(url, topo, layout, order, part_layout, keys, slots):
    """Every rank of topo writes keys from its pool of layout (of order)."""
    m = kv.Model(**SPEC)
    pages = {k: o.page(SP, k) for k in keys}
    with kv.Store(url) as st:
        for pl, layers, heads in ranks(topo):
            p, regions = pool(layout, order, layers, heads)
            for k, s in zip(keys, slots):
                o.fill_order_slot(regions, order, s, SP, pages[k], layers, heads)
            with kv.Writer(st, m, pl, p, part_layout) as w:
                assert w.write(keys, slots) == [kv.WriteStatus.WRITTEN] * len(keys)
    return pages


def read(url, topo, layout, order, keys, slots, pages):
    """Every rank of topo reads keys into its pool of layout (of order) and
    checks every element, and that the other slots are untouched."""
    m = kv.Model(**SPEC)
    fill = FILL & np.iinfo(SP.uint).max
    fallbacks = 0
    with kv.Store(url) as st:
        for pl, layers, heads in ranks(topo):
            p, regions = pool(layout, order, layers, heads, fill=fill)
            with kv.Reader(st, m, pl, p) as r:
                res = r.read(keys, slots)
                assert (res.hit, res.stop, res.message) == (len(keys), kv.Stop.NONE, ""), pl
                fallbacks += r.stats().fallbacks
            for k, s in zip(keys, slots):
                o.check_order_slot(regions, order, s, SP, pages[k], layers, heads, "%s rank %r" % (layout, pl.rank))
            o.check_order_untouched(regions, order, sorted(set(range(SLOTS)) - set(slots)), SP, fill, layers, heads,
                                    "%s rank %r" % (layout, pl.rank))
    return fallbacks


def test_layouts_lists_the_builtins():
    ls = kv.layouts()
    assert [(l.name, l.kind, l.order, l.writes) for l in ls[:7]] == BUILTINS
    assert "PLHD" in ls and "page_head" in ls and "nope" not in ls
    assert [l.kind for l in ls[:7]] == ["part"] * 3 + ["pool"] * 4
    assert all(type(l) is kv.Layout and isinstance(l, str) for l in ls)
    assert ls[3] == "page_first" and str(ls[3]) == "page_first" and ls[3].name == "page_first"
    assert repr(ls[3]) == "Layout('page_first', kind='pool', order='C S T L H D', writes='PLHD')"
    assert repr(ls[0]) == "Layout('PLHD', kind='part', order='C T L H D')"
    for attr in ("name", "kind", "order", "writes", "other"):
        with pytest.raises(AttributeError, match="^kvreshard.Layout is immutable: cannot set %s; " % attr):
            setattr(ls[0], attr, "x")
    with pytest.raises(AttributeError, match="^kvreshard.Layout is immutable: cannot delete kind$"):
        del ls[0].kind


def test_define_layout():
    x, v = define_custom()
    assert (x.name, x.kind, x.order, x.writes) == ("xblock8", "part", "C L H D/8 T D%8", None)
    assert (v.name, v.kind, v.order, v.writes) == ("vllm_host", "pool", "L C S T H D", None)
    ls = kv.layouts()
    assert "xblock8" in ls and "vllm_host" in ls
    assert ls[:7] == [b[0] for b in BUILTINS], "the built-ins stay first"
    # the same declaration again is the same layout; white space is not the order
    assert kv.define_layout("xblock8", "part", "C  L H D/8\tT D%8") == x
    assert kv.define_layout("PLHD", "part", "C T L H D").writes is None
    w = kv.define_layout("vllm_host_xb", "pool", "L C S T H D", writes="xblock8")
    assert (w.kind, w.order, w.writes) == ("pool", "L C S T H D", "xblock8")


@pytest.mark.parametrize("name,kind,order,writes,msg", [
    ("x", "part", "C T T H D", None,
     'layout "x": order "C T T H D": layout x is missing axis L; column 5: axis T appears twice in layout x, first at 1:3'),
    ("x", "part", "C S T L H D", None,
     'layout "x": order "C S T L H D": column 3: part layout x has a slot axis S; only pool layouts have one'),
    ("x", "pool", "", None, 'layout "x": order "": order is empty'),
    ("x", "tile", "C T L H D", None,
     'layout "x": order "C T L H D": unknown layout kind "tile"; kinds are part and pool'),
    ("writes", "part", "C T L H D", None,
     'layout "writes": order "C T L H D": invalid layout name "writes"; part, pool, order and writes are keywords'),
    ("x", "part", "C T L H D", "PLHD", 'layout "x": a part layout writes no part layout (writes "PLHD")'),
    ("x", "pool", "C S T L H D", "page_head",
     'layout "x": writes page_head, a pool layout; a pool writes a part layout (PLHD, LPHD, HPLD'),
    ("PLHD", "part", "C L T H D", None,
     'layout "PLHD" is already part(C T L H D) (builtin.kvl:5:1); defined at run time declares it part(C L T H D)'),
    ("vllm_host", "pool", "C L S T H D", None,
     'layout "vllm_host" is already pool(L C S T H D) (defined at run time); defined at run time declares it '
     'pool(C L S T H D)'),
])
def test_define_layout_errors(name, kind, order, writes, msg):
    define_custom()
    before = kv.layouts()
    with pytest.raises(ValueError) as e:
        kv.define_layout(name, kind, order, writes)
    assert type(e.value) is kv.InvalidArgument and e.value.code == _lib.EINVAL
    if msg.endswith("(PLHD, LPHD, HPLD"):  # the part layouts defined so far follow
        assert str(e.value).startswith(msg) and str(e.value).endswith(")")
    else:
        assert str(e.value) == msg
    assert kv.layouts() == before


def test_define_layout_types():
    with pytest.raises(TypeError, match="^kvreshard: layout order must be a str, not bytes$"):
        kv.define_layout("x", "part", b"C T L H D")
    with pytest.raises(TypeError, match="^kvreshard: layout writes must be a str, not int$"):
        kv.define_layout("x", "pool", "C S T L H D", writes=1)
    with pytest.raises(kv.InvalidArgument, match="^kvreshard: layout name contains a NUL byte$"):
        kv.define_layout("x\0", "part", "C T L H D")


def test_pages_through_defined_layouts(tmp_path):
    """TP1 x PP3 page_first writers store pages in xblock8; TP2 x PP2
    vllm_host readers read them. Then TP2 x PP2 vllm_host writers store
    pages in PLHD and xblock8, read by TP1 x PP3 page_head readers. Every
    element is checked against the oracle of the layouts' orders."""
    define_custom()
    url = "file://" + str(tmp_path)
    keys = ["a0f1", "b1e2", "c2d3"]
    pages = write(url, TP1PP3, "page_first", "C S T L H D", "xblock8", keys, [4, 0, 2])
    assert read(url, TP2PP2, "vllm_host", "L C S T H D", keys, [1, 3, 0], pages) > 0, \
        "pairs with a defined layout are planned on the interpreter"
    for part in ("PLHD", "xblock8"):
        more = [k + part for k in keys]
        pages = write(url, TP2PP2, "vllm_host", "L C S T H D", part, more, [0, 1, 2])
        read(url, TP1PP3, "page_head", "C S H T L D", more, [2, 4, 3], pages)


def test_defined_pool_writes(tmp_path):
    """A defined pool writes the part layout it names (writes), or none:
    then its writer must name one."""
    define_custom()
    kv.define_layout("vllm_host_xb", "pool", "L C S T H D", writes="xblock8")
    m = kv.Model(**SPEC)
    pl0, layers, heads = next(ranks(TP2PP2))
    with kv.Store("file://" + str(tmp_path)) as st:
        p, _ = pool("vllm_host", "L C S T H D", layers, heads)
        with pytest.raises(kv.InvalidArgument) as e:
            kv.Writer(st, m, pl0, p)
        assert str(e.value).startswith("writer: pool layout vllm_host names no part layout to write (writes); "
                                       "name one (PLHD, LPHD, HPLD, ")
        # rank 0 writes in xblock8 (vllm_host_xb's): a PLHD writer of the
        # same page is refused, an xblock8 writer is not
        p, _ = pool("vllm_host_xb", "L C S T H D", layers, heads)
        with kv.Writer(st, m, pl0, p) as w:
            assert w.write(["w0"], [0]) == [kv.WriteStatus.WRITTEN]
        pl1, layers, heads = list(ranks(TP2PP2))[1]
        p, _ = pool("vllm_host", "L C S T H D", layers, heads)
        with kv.Writer(st, m, pl1, p, "PLHD") as w:
            assert w.write(["w0"], [0]) == [kv.WriteStatus.REFUSED]
        with kv.Writer(st, m, pl1, p, "xblock8") as w:
            assert w.write(["w0"], [0]) == [kv.WriteStatus.WRITTEN]


# A library of ABI 2.0: this one's functions behind a kvr_version that says
# 2.0 (the dynamic linker finds kvr_version in the shim first, and every
# other function in the library it links).
ABI20_SHIM = r"""
#include "kvreshard.h"
int kvr_version(int32_t *minor) {
    if (minor) *minor = 0;
    return KVR_ABI_VERSION;
}
"""


def abi20_library(tmp_path):
    """The path of a library of ABI 2.0 built from ABI20_SHIM over this one."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.fail("no C compiler (gcc) to build a library of ABI 2.0 with", pytrace=False)
    src, out = tmp_path / "abi20.c", tmp_path / "libkvreshard20.so"
    src.write_text(ABI20_SHIM)
    lib = os.path.abspath(kv.library_path())
    include = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "cmd", "libkvreshard")
    subprocess.run([gcc, "-shared", "-fPIC", "-I", include, "-o", str(out), str(src), "-Wl,--no-as-needed", lib],
                   check=True, capture_output=True, text=True)
    return str(out)


def test_an_older_library_loads(monkeypatch, tmp_path):
    """A library of the same major version and an older minor loads: the
    functions added since raise, naming both versions, and the others work.
    The library is this one behind a kvr_version of ABI 2.0, which lacks
    kvr_layouts and kvr_define_layout."""
    kv.set_max_procs(0)  # the library this process uses is loaded
    path = abi20_library(tmp_path)
    for name in ("_loaded", "_path", "_minor"):  # restored after the test
        monkeypatch.setattr(_lib, name, getattr(_lib, name))
    monkeypatch.setenv("KVRESHARD_LIB", path)
    _lib._loaded = None
    assert _lib.version() == (2, 0)
    assert kv.library_path() == path
    for call, name in ((kv.layouts, "layouts()"), (lambda: kv.define_layout(*XBLOCK), "define_layout()")):
        with pytest.raises(kv.KvreshardError) as e:
            call()
        assert type(e.value) is kv.KvreshardError
        assert str(e.value) == "kvreshard: %s needs libkvreshard ABI 2.1; the library is 2.0 (%s)" % (name, path)
    # everything of ABI 2.0 works
    url = "file://" + str(tmp_path)
    keys = ["o1", "o2"]
    pages = write(url, TP1PP3, "page_first", "C S T L H D", "LPHD", keys, [0, 1])
    read(url, TP2PP2, "layer_first", "C L S T H D", keys, [3, 2], pages)
    assert len(kv.Model(**SPEC).domain()) == 64
    prev = kv.set_max_procs(0)
    assert kv.set_max_procs(prev) == prev
