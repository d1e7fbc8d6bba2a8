"""The values the library reads: Model, Placement and Pool (a writer's or
reader's model, topology and host pool, each with the C struct the
library takes) and Layout (a layout the library knows), all immutable.

A private module: kvreshard re-exports the classes and DTYPES (import them
from there; its documentation is the manual); c_struct is what Writer and
Reader hand the library.
"""

import ctypes
from typing import Any, Iterable, NoReturn, Optional, Sequence, Tuple, Union

from . import _lib
from ._args import I32, Region, cstr, int32, region
from ._lib import InvalidArgument

# bytes of an element of each dtype (Model.item_size)
DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class _Frozen:
    """An object whose attributes are set in __init__ only (by _init):
    setting or deleting one afterwards raises AttributeError naming the
    class, since the library has read them already."""

    __slots__ = ()

    def _init(self, **attrs: Any) -> None:
        for name, value in attrs.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError("kvreshard.%s is immutable: cannot set %s; make another %s"
                             % (type(self).__name__, name, type(self).__name__))

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("kvreshard.%s is immutable: cannot delete %s" % (type(self).__name__, name))

    # An immutable value is its own copy.
    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self


class _Value(_Frozen):
    """A _Frozen made from arguments it keeps: equal, hashed and pickled as
    those arguments (a Model or Placement sent to a spawned rank process is
    the same value there)."""

    __slots__ = ()

    def _args(self) -> Tuple[Tuple[Any, ...], Tuple[Tuple[str, Any], ...]]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._args() == other._args()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._args()))

    def __reduce__(self) -> Any:
        args, kwargs = self._args()
        return (_make, (type(self), args, kwargs))


def _make(cls: Any, args: Tuple[Any, ...], kwargs: Tuple[Tuple[str, Any], ...]) -> Any:
    return cls(*args, **dict(kwargs))


class Layout(_Frozen, str):
    """A layout the library knows: a str, its name, with the read-only
    attributes name, kind ("part": how a writer rank's share of a page lies
    in the store; "pool": how a host pool holds its pages), order (its
    axes, outermost first, as "C L H D/8 T D%8"; see kvreshard.h) and writes
    (the part layout a pool's writers store pages in when they name none;
    None for a part layout and for a pool that names none). So both
    ``"PLHD" in kv.layouts()`` and ``[l.kind for l in kv.layouts()]``
    work."""

    # attributes of the str's __dict__, set once by __new__
    _kind: str
    _order: str
    _writes: Optional[str]

    def __new__(cls, name: str, kind: str, order: str, writes: Optional[str] = None) -> "Layout":
        self = str.__new__(cls, name)
        self._init(_kind=kind, _order=order, _writes=writes or None)
        return self

    def __getnewargs__(self) -> Tuple[str, str, str, Optional[str]]:
        return str(self), self._kind, self._order, self._writes

    @property
    def name(self) -> str:
        return str(self)

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def order(self) -> str:
        return self._order

    @property
    def writes(self) -> Optional[str]:
        return self._writes

    def __repr__(self) -> str:
        s = "Layout(%r, kind=%r, order=%r" % (str(self), self._kind, self._order)
        if self._writes is not None:
            s += ", writes=%r" % self._writes
        return s + ")"


class Model(_Value):
    """The model whose KV pages are shared: the --model fields of the
    command line. Pages are stored under the model domain, a digest of the
    name, revision, namespace, fingerprint, dtype and shape (never of TP,
    PP or layout). The defaults of name, revision and namespace are the
    command line's, so that ``kvreshard read`` finds pages written here.

    draft_layers: how many of the last of the layers are the draft layers
    of speculative decoding (MTP) that a page holds after the model's own
    (0 to layers; the --model flag's draft-layers). They enter the model
    domain: pages with and without them never share a key.

    Immutable (AttributeError on setting an attribute): make another.
    Models of the same fields are equal."""

    __slots__ = ("layers", "kv_heads", "head_dim", "v_head_dim", "page", "draft_layers", "mla", "dtype",
                 "name", "revision", "namespace", "fingerprint", "_strs", "_c")
    layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: Optional[int]
    page: int
    draft_layers: int
    mla: bool
    dtype: str
    name: str
    revision: str
    namespace: str
    fingerprint: str

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: str, page: int,
                 v_head_dim: Optional[int] = None, mla: bool = False, name: str = "model", revision: str = "0",
                 namespace: str = "kvreshard", fingerprint: str = "", draft_layers: int = 0) -> None:
        ints = dict(layers=int32("model layers", layers), kv_heads=int32("model kv_heads", kv_heads),
                    head_dim=int32("model head_dim", head_dim),
                    v_head_dim=None if v_head_dim is None else int32("model v_head_dim", v_head_dim),
                    page=int32("model page", page), draft_layers=int32("model draft_layers", draft_layers))
        if not isinstance(mla, bool):
            raise TypeError("kvreshard: model mla must be a bool, not %s" % type(mla).__name__)
        if mla and v_head_dim is not None:
            raise InvalidArgument("kvreshard: an mla model has one latent component; drop v_head_dim",
                                  _lib.EINVAL)
        strs = [cstr("model " + f, v) for f, v in (
            ("dtype", dtype), ("name", name), ("revision", revision),
            ("namespace", namespace), ("fingerprint", fingerprint))]
        self._init(mla=mla, dtype=dtype, name=name, revision=revision, namespace=namespace,
                   fingerprint=fingerprint, _strs=strs, **ints)
        s = strs
        self._init(_c=_lib.sized(_lib.CModel, self.layers, self.kv_heads, self.head_dim, self.v_head_dim or 0,
                                 self.page, int(mla), self.draft_layers, s[0], s[1], s[2], s[3], s[4]))

    def _args(self) -> Tuple[Tuple[Any, ...], Tuple[Tuple[str, Any], ...]]:
        return ((self.layers, self.kv_heads, self.head_dim, self.dtype, self.page),
                (("v_head_dim", self.v_head_dim), ("mla", self.mla), ("name", self.name),
                 ("revision", self.revision), ("namespace", self.namespace), ("fingerprint", self.fingerprint),
                 ("draft_layers", self.draft_layers)))

    @property
    def item_size(self) -> int:
        """Bytes of one element (KeyError-free: 0 for an unknown dtype)."""
        return DTYPES.get(self.dtype, 0)

    def domain(self) -> str:
        """The model domain: 64 hex digits (InvalidArgument for a bad model)."""
        out = ctypes.create_string_buffer(80)
        err = _lib.errbuf()
        _lib.check(_lib.lib().kvr_model_domain(ctypes.byref(self._c), out, len(out), err, _lib.ERRLEN), err)
        return out.value.decode("ascii")

    def __repr__(self) -> str:
        f = ["layers=%d" % self.layers, "kv_heads=%d" % self.kv_heads, "head_dim=%d" % self.head_dim]
        if self.v_head_dim is not None:
            f.append("v_head_dim=%d" % self.v_head_dim)
        f += ["dtype=%r" % self.dtype, "page=%d" % self.page]
        if self.mla:
            f.append("mla=True")
        if self.draft_layers:
            f.append("draft_layers=%d" % self.draft_layers)
        f += ["name=%r" % self.name, "revision=%r" % self.revision, "namespace=%r" % self.namespace]
        if self.fingerprint:
            f.append("fingerprint=%r" % self.fingerprint)
        return "Model(%s)" % ", ".join(f)


class Placement(_Value):
    """A TP x PP x CP topology and this process's rank in it: rank is
    (tp_rank, pp_rank) or (tp_rank, pp_rank, cp_rank). pp_layers lists the
    layers of each PP stage, in order, summing to the model's layers; None
    is kvreshard's even split (remainder to the first stages), which
    differs from SGLang's and vLLM's: take the split from the framework.

    Context parallelism: cp ranks hold a page's tokens, dealt in runs of
    cp_interleave tokens round-robin, so that token p of a page belongs to
    CP rank (p // cp_interleave) % cp and local token j of CP rank c is
    token ((j // cp_interleave) * cp + c) * cp_interleave + j % cp_interleave
    (SGLang's DCP: cp_interleave=1; vLLM: --cp-kv-cache-interleave-size;
    page // cp: contiguous slices). The pool of a CP rank holds page // cp
    tokens a page. The library checks the values (InvalidArgument naming
    what is wrong) when a Writer or Reader opens.

    Immutable (AttributeError on setting an attribute): make another.
    Placements of the same fields are equal."""

    __slots__ = ("tp", "pp", "rank", "cp_rank", "cp", "cp_interleave", "pp_layers", "_layers", "_c")
    tp: int
    pp: int
    rank: Tuple[int, ...]
    cp_rank: int
    cp: int
    cp_interleave: int
    pp_layers: Optional[Tuple[int, ...]]

    def __init__(self, tp: int, pp: int, rank: Sequence[int] = (0, 0), pp_layers: Optional[Iterable[int]] = None,
                 cp: int = 1, cp_interleave: int = 1) -> None:
        tp = int32("placement tp", tp)
        pp = int32("placement pp", pp)
        try:
            r = tuple(rank)
        except TypeError:
            r = ()
        if len(r) not in (2, 3):
            raise TypeError("kvreshard: placement rank must be a (tp_rank, pp_rank) or (tp_rank, pp_rank, "
                            "cp_rank) tuple, not %r" % (rank,))
        ranks = (int32("placement tp_rank", r[0]), int32("placement pp_rank", r[1]))
        cp_rank = int32("placement cp_rank", r[2]) if len(r) == 3 else 0
        if len(r) == 3:
            ranks += (cp_rank,)
        cp = int32("placement cp", cp, lo=-I32)
        cp_interleave = int32("placement cp_interleave", cp_interleave, lo=-I32)
        split = None
        layers = None
        if pp_layers is not None:
            split = tuple(int32("placement pp_layers entry", x) for x in pp_layers)
            if len(split) != pp:
                raise InvalidArgument("kvreshard: placement pp_layers has %d entries; pp is %d"
                                      % (len(split), pp), _lib.EINVAL)
            layers = (ctypes.c_int32 * len(split))(*split)
        self._init(tp=tp, pp=pp, rank=ranks, cp_rank=cp_rank, cp=cp, cp_interleave=cp_interleave,
                   pp_layers=split, _layers=layers)
        self._init(_c=_lib.sized(_lib.CPlacement, tp, pp, ranks[0], ranks[1], cp, cp_rank, cp_interleave,
                                 ctypes.cast(layers, ctypes.POINTER(ctypes.c_int32))
                                 if layers is not None else None))

    def _args(self) -> Tuple[Tuple[Any, ...], Tuple[Tuple[str, Any], ...]]:
        return ((self.tp, self.pp), (("rank", self.rank), ("pp_layers", self.pp_layers), ("cp", self.cp),
                                     ("cp_interleave", self.cp_interleave)))

    def __repr__(self) -> str:
        s = "Placement(tp=%d, pp=%d, rank=%r" % (self.tp, self.pp, self.rank)
        if self.pp_layers is not None:
            s += ", pp_layers=%r" % (list(self.pp_layers),)
        if self.cp != 1 or self.cp_interleave != 1:
            s += ", cp=%d, cp_interleave=%d" % (self.cp, self.cp_interleave)
        return s + ")"


class Pool(_Frozen):
    """A rank's host pool: a pool layout (layer_first, page_first,
    page_first_direct, page_head, or any pool layout of layouts(), as
    define_layout makes them), its regions in order (K then V when the
    layout has C outermost; else one region holding every component; one
    for MLA), and the pages (slots) it holds. Only the rank's own layers,
    heads and tokens are in it: with context parallelism of cp ranks a slot
    holds page // cp tokens.

    regions is kept as a tuple, which keeps the buffers alive; sizes are
    their bytes. Immutable (AttributeError on setting an attribute): make
    another. A copy is the same pool; a pool is not pickled (it is memory
    of this process)."""

    __slots__ = ("layout", "regions", "slots", "sizes", "_layout", "_keep", "_bases", "_sizes", "_c")
    layout: str
    regions: Tuple[Region, ...]
    slots: int
    sizes: Tuple[int, ...]

    def __init__(self, layout: str, regions: Sequence[Region], slots: int) -> None:
        b = cstr("pool layout", layout)
        if isinstance(regions, (bytes, bytearray, memoryview)) or not hasattr(regions, "__len__"):
            raise TypeError("kvreshard: pool regions must be a list of regions, not %s"
                            % type(regions).__name__)
        if len(regions) == 0:
            raise InvalidArgument("kvreshard: pool has no regions", _lib.EINVAL)
        if isinstance(slots, bool) or not hasattr(slots, "__index__"):
            raise TypeError("kvreshard: pool slots must be an int, not %s" % type(slots).__name__)
        n = slots.__index__()
        if n <= 0 or n >= 1 << 62:
            raise InvalidArgument("kvreshard: pool slots=%d is not positive" % n, _lib.EINVAL)
        rs = [region(i, r) for i, r in enumerate(regions)]
        sizes = tuple(size for _, size, _ in rs)
        bases = (ctypes.c_void_p * len(rs))(*(a for a, _, _ in rs))
        csizes = (ctypes.c_uint64 * len(rs))(*sizes)
        self._init(layout=layout, _layout=b, slots=n, regions=tuple(regions), _keep=[k for _, _, k in rs],
                   sizes=sizes, _bases=bases, _sizes=csizes,
                   _c=_lib.sized(_lib.CPool, len(rs), b, bases, csizes, n))

    def __reduce__(self) -> NoReturn:
        raise TypeError("kvreshard.Pool cannot be pickled: it is memory of this process; make the pool in "
                        "the process that holds the memory")

    def __repr__(self) -> str:
        return "Pool(%r, %d regions of %s bytes, slots=%d)" % (
            self.layout, len(self.sizes), "/".join(map(str, self.sizes)), self.slots)


def c_struct(value: Union[Model, Placement, Pool]) -> ctypes.Structure:
    """The C struct the library takes for a Model, Placement or Pool
    (kvr_model, kvr_placement, kvr_pool), which lives as long as value:
    what Writer and Reader pass to kvr_writer_open and kvr_reader_open."""
    return value._c
