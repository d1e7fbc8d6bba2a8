"""The tests' oracle: pages as logical arrays and host pools of SGLang's
exact shapes, with numpy indexing only (nothing from kvreshard).

A page is one array per component (K, V; one latent for MLA) indexed
[token, layer, head, element], i.e. the logical [component, token, layer,
head, element] array. A rank's pool holds its own layers, heads and (with
context parallelism) tokens; slot s of a pool, seen through slot_view, is
indexed the same way, its tokens in the order of cp_tokens.

Any other pool layout is modelled from its order, as kvreshard.h writes
it ("L C S T H D", split axes as "D/8 ... D%8"): order_offsets gives each
logical element's dense offset, and new_order_pool, fill_order_slot and
check_order_slot use those offsets into flat regions.
"""

import hashlib

import numpy as np

UINT = {"fp32": np.uint32, "bf16": np.uint16, "fp16": np.uint16, "fp8": np.uint8}
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


class Spec:
    """A model as the oracle sees it."""

    def __init__(self, layers, kv_heads, head_dim, dtype, page, v_head_dim=None, mla=False, salt=""):
        self.layers, self.kv_heads, self.page, self.dtype, self.mla = layers, kv_heads, page, dtype, mla
        self.dims = [head_dim] if mla else [head_dim, v_head_dim or head_dim]
        self.salt = salt

    @property
    def uint(self):
        return UINT[self.dtype]


def page(spec, key):
    """The logical page of key: one [T, L, H, D_c] array per component,
    random bits seeded by the key (and the spec's salt)."""
    seed = int.from_bytes(hashlib.sha256((spec.salt + "/" + key).encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    info = np.iinfo(spec.uint)
    return [rng.integers(0, info.max, size=(spec.page, spec.layers, spec.kv_heads, d), dtype=spec.uint,
                         endpoint=True) for d in spec.dims]


def stages(split):
    """[start, end) of each PP stage of a split (layers per stage)."""
    out, at = [], 0
    for n in split:
        out.append((at, at + n))
        at += n
    return out


def heads_of(kv_heads, tp, tp_rank):
    """[start, end) of the KV heads TP rank tp_rank holds (replicated when tp > kv_heads)."""
    if tp <= kv_heads:
        per = kv_heads // tp
        return tp_rank * per, (tp_rank + 1) * per
    h = tp_rank // (tp // kv_heads)
    return h, h + 1


def cp_tokens(page, cp, cp_rank, interleave):
    """The page's tokens CP rank cp_rank holds, in its local order: the
    tokens p whose run of `interleave` tokens, counted from the page's
    start, is dealt to it round-robin ((p // interleave) % cp == cp_rank),
    ascending. None without context parallelism (every token)."""
    if cp == 1:
        return None
    return np.array([p for p in range(page) if (p // interleave) % cp == cp_rank], dtype=np.int64)


def page_tokens(spec, tokens):
    """Tokens a pool slot holds: the CP rank's, or the whole page."""
    return spec.page if tokens is None else len(tokens)


def comp_shape(layout, slots, page, layers, heads, dim):
    """One component's buffer in SGLang's host pool (memory_pool_host):
    the kv_buffer shape without its leading 2."""
    size = slots * page
    return {"layer_first": (layers, size, heads, dim),
            "page_first": (size, layers, heads, dim),
            "page_first_direct": (slots, layers, page, heads, dim),
            "page_head": (slots, heads, page, layers, dim)}[layout]


def new_pool(spec, layout, slots, layers, heads, fill=0, tokens=None):
    """A host pool as SGLang allocates it: MHA one (2, ...) kv_buffer whose
    halves are K and V (when K and V dims are equal), MLA one buffer with one
    head; a slot holds the CP rank's tokens (all without tokens). Returns
    (kv_buffer or None, [component arrays])."""
    page = page_tokens(spec, tokens)
    if spec.mla:
        kvb = np.full(comp_shape(layout, slots, page, layers, 1, spec.dims[0]), fill, spec.uint)
        return kvb, [kvb]
    if spec.dims[0] == spec.dims[1]:
        kvb = np.full((2,) + comp_shape(layout, slots, page, layers, heads, spec.dims[0]), fill, spec.uint)
        return kvb, [kvb[0], kvb[1]]
    return None, [np.full(comp_shape(layout, slots, page, layers, heads, d), fill, spec.uint)
                  for d in spec.dims]


def slot_view(comp, layout, slot, page):
    """Slot `slot` of one component buffer as a [T, L, H, D] view (page:
    the tokens a slot holds)."""
    if layout == "layer_first":
        L, size, H, D = comp.shape
        return comp.reshape(L, size // page, page, H, D)[:, slot].transpose(1, 0, 2, 3)
    if layout == "page_first":
        size, L, H, D = comp.shape
        return comp.reshape(size // page, page, L, H, D)[slot]
    if layout == "page_first_direct":
        return comp[slot].transpose(1, 0, 2, 3)
    if layout == "page_head":
        return comp[slot].transpose(1, 2, 0, 3)
    raise ValueError(layout)


def share(pg, layers, heads, tokens=None):
    """The part of a logical page a rank holds (tokens: its CP tokens, in
    order; None for every token)."""
    (l0, l1), (h0, h1) = layers, heads
    return [(c if tokens is None else c[tokens])[:, l0:l1, h0:h1, :] for c in pg]


def fill_slot(comps, layout, slot, spec, pg, layers, heads, tokens=None):
    for c, want in zip(comps, share(pg, layers, heads, tokens)):
        slot_view(c, layout, slot, page_tokens(spec, tokens))[...] = want


def check_slot(comps, layout, slot, spec, pg, layers, heads, what="", tokens=None):
    """Assert slot holds the rank's share of pg, element by element."""
    for ci, (c, want) in enumerate(zip(comps, share(pg, layers, heads, tokens))):
        got = slot_view(c, layout, slot, page_tokens(spec, tokens))
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)
            t, l, h, d = bad[0]
            raise AssertionError(
                "%s component %d slot %d: %d of %d elements differ; first at token %d layer %d head %d "
                "element %d: got %#x, want %#x" % (what, ci, slot, len(bad), want.size,
                                                   t if tokens is None else tokens[t], l + layers[0],
                                                   h + heads[0], d, got[t, l, h, d], want[t, l, h, d]))


def check_untouched(comps, layout, slots, spec, fill, what="", tokens=None):
    """Assert the given slots still hold `fill` only."""
    for ci, c in enumerate(comps):
        for s in slots:
            v = slot_view(c, layout, s, page_tokens(spec, tokens))
            if not (v == fill).all():
                raise AssertionError("%s component %d slot %d was written" % (what, ci, s))


# Layouts by their order.


def parse_order(order):
    """The modes of a layout's order, outermost first: (axis, op, factor),
    op "" for a whole axis, "/" for its blocks of factor elements and "%"
    for the factor elements of a block."""
    out = []
    for tok in order.split():
        for op in "/%":
            if op in tok:
                axis, f = tok.split(op)
                out.append((axis, op, int(f)))
                break
        else:
            out.append((tok, "", 0))
    return out


def order_offsets(order, ext):
    """The dense offset of every element under order, as an int64 array
    indexed by the order's axes in the logical order C, S, T, L, H, D (the
    axes it has), and those axes. ext: each axis's extent."""
    modes = parse_order(order)
    shape = [ext[a] // f if op == "/" else f if op == "%" else ext[a] for a, op, f in modes]
    off = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    axes = [a for a in "CSTLHD" if any(m[0] == a for m in modes)]
    perm = []
    for a in axes:  # a split axis: its blocks, then the elements of a block
        perm += sorted((i for i, m in enumerate(modes) if m[0] == a), key=lambda i: modes[i][1] == "%")
    return off.transpose(perm).reshape([ext[a] for a in axes]), axes


def _order_comp(spec, order, slots, layers, heads, c, tokens):
    """(region, offsets[S, T, L, H, D]) of component c of a pool of layout
    order, whose regions are one a component when C is outermost, else one
    holding every component (of equal dims)."""
    T = page_tokens(spec, tokens)
    modes = order.split()
    if modes[0] == "C":
        off, _ = order_offsets(" ".join(modes[1:]), dict(S=slots, T=T, L=layers, H=heads, D=spec.dims[c]))
        return c, off
    assert len(set(spec.dims)) == 1, "one region holds components of equal dims"
    off, _ = order_offsets(order, dict(C=len(spec.dims), S=slots, T=T, L=layers, H=heads, D=spec.dims[0]))
    return 0, off[c]


def new_order_pool(spec, order, slots, layers, heads, fill=0, tokens=None):
    """The flat regions of a pool of layout order (layers, heads: counts)."""
    T = page_tokens(spec, tokens)
    sizes = [slots * T * layers * heads * d for d in spec.dims]
    if order.split()[0] != "C":
        sizes = [sum(sizes)]
    return [np.full(n, fill, spec.uint) for n in sizes]


def _order_slot(regions, order, spec, slot, layers, heads, tokens):
    """(region, offsets[T, L, H, D]) of slot of each component of a pool of
    layout order; its slot count is what its regions hold."""
    nl, nh = layers[1] - layers[0], heads[1] - heads[0]
    per_slot = page_tokens(spec, tokens) * nl * nh * (spec.dims[0] if order.split()[0] == "C" else sum(spec.dims))
    slots = len(regions[0]) // per_slot
    for c in range(len(spec.dims)):
        r, off = _order_comp(spec, order, slots, nl, nh, c, tokens)
        yield regions[r], off[slot]


def fill_order_slot(regions, order, slot, spec, pg, layers, heads, tokens=None):
    """Put the rank's share of page pg into slot of a pool of layout order."""
    for (reg, off), want in zip(_order_slot(regions, order, spec, slot, layers, heads, tokens),
                                share(pg, layers, heads, tokens)):
        reg[off] = want


def check_order_slot(regions, order, slot, spec, pg, layers, heads, what="", tokens=None):
    """Assert slot of a pool of layout order holds the rank's share of pg."""
    for ci, ((reg, off), want) in enumerate(zip(_order_slot(regions, order, spec, slot, layers, heads, tokens),
                                                 share(pg, layers, heads, tokens))):
        got = reg[off]
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)
            t, l, h, d = bad[0]
            raise AssertionError(
                "%s %s component %d slot %d: %d of %d elements differ; first at token %d layer %d head %d "
                "element %d: got %#x, want %#x" % (what, order, ci, slot, len(bad), want.size, t, l + layers[0],
                                                   h + heads[0], d, got[t, l, h, d], want[t, l, h, d]))


def check_order_untouched(regions, order, slots, spec, fill, layers, heads, what="", tokens=None):
    """Assert the given slots of a pool of layout order still hold fill."""
    for s in slots:
        for ci, (reg, off) in enumerate(_order_slot(regions, order, spec, s, layers, heads, tokens)):
            if not (reg[off] == fill).all():
                raise AssertionError("%s %s component %d slot %d was written" % (what, order, ci, s))
