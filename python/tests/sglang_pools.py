"""Fake SGLang host pools for the tests of kvreshard.sglang: numpy arrays of
SGLang 0.5.23's exact kv_buffer shapes (pool_host/mha.py, pool_host/mla.py)
behind its attribute names, without torch. Imported by the tests and by
the rank processes that drive the backend through SGLang's own files."""

import numpy as np

PAGE = 4
DIM = 8


class FakeDtype:
    """What str() of a torch dtype gives."""

    def __init__(self, name, itemsize):
        self._name, self.itemsize = name, itemsize

    def __str__(self):
        return "torch." + self._name


class FakeDevicePool:
    """The device_pool of SGLang before 0.5.23 (whose dtype tells an fp8
    cache's variant); 0.5.23's host pools have none."""

    def __init__(self, dtype):
        self.dtype = dtype


def comp_shape(layout, layers, slots, page, heads, dim):
    """One component's shape: an MHA kv_buffer is (2,) + this when K and V
    dims are equal, an MLA kv_buffer is this with one head."""
    size = slots * page
    return {"layer_first": (layers, size, heads, dim),
            "page_first": (size, layers, heads, dim),
            "page_first_direct": (slots, layers, page, heads, dim),
            "page_head": (slots, heads, page, layers, dim)}[layout]


class FakeMHAHostPool:
    """MHATokenToKVPoolHost (0.5.23): head_num, head_dim, v_head_dim;
    target_layer_num the stage's layers [start_layer, end_layer), layer_num
    those and the MTP draft layers folded in after them (draft_layers);
    kv_buffer (2, ...) over layer_num layers. With v_head_dim != head_dim it
    is AsymmetricMHATokenToKVPoolHost: kv_buffer is a (K, V) tuple.
    device_dtype adds the device_pool of SGLang before 0.5.23."""

    def __init__(self, layout, page_num, start_layer, end_layer, head_num, head_dim=DIM, page_size=PAGE,
                 dtype="bfloat16", np_dtype=np.uint16, device_dtype=None, draft_layers=0, v_head_dim=None):
        self.layout, self.page_size, self.page_num = layout, page_size, page_num
        self.size = page_num * page_size
        self.start_layer, self.end_layer = start_layer, end_layer
        self.target_layer_num = end_layer - start_layer
        self.layer_num = self.target_layer_num + draft_layers
        self.head_num, self.head_dim = head_num, head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.head_group_num = 1
        self.dtype = FakeDtype(dtype, np.dtype(np_dtype).itemsize)
        if device_dtype is not None:
            self.device_pool = FakeDevicePool(FakeDtype(device_dtype, 1))
        shapes = [comp_shape(layout, self.layer_num, page_num, page_size, head_num, d)
                  for d in (self.head_dim, self.v_head_dim)]
        if self.head_dim == self.v_head_dim:
            self.kv_buffer = np.zeros((2,) + shapes[0], np_dtype)
        else:
            self.kv_buffer = (np.zeros(shapes[0], np_dtype), np.zeros(shapes[1], np_dtype))

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def comps(self):
        return [self.kv_buffer[0], self.kv_buffer[1]]


class FakeMLAHostPool:
    """MLATokenToKVPoolHost (0.5.23): kv_lora_rank, qk_rope_head_dim,
    kv_cache_dim; target_layer_num and layer_num as MHA's; dcp_size and
    dcp_rank as HostKVCache has them (page_size is this rank's, not the
    widened one); kv_buffer over layer_num layers with one head."""

    def __init__(self, layout, page_num, start_layer, end_layer, kv_lora_rank=8, qk_rope_head_dim=4,
                 page_size=PAGE, dcp_size=1, dcp_rank=0, draft_layers=0):
        self.layout, self.page_size, self.page_num = layout, page_size, page_num
        self.dcp_size, self.dcp_rank = dcp_size, dcp_rank
        self.size = page_num * page_size
        self.start_layer, self.end_layer = start_layer, end_layer
        self.target_layer_num = end_layer - start_layer
        self.layer_num = self.target_layer_num + draft_layers
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.dtype = FakeDtype("bfloat16", 2)
        self.kv_buffer = np.zeros(comp_shape(layout, self.layer_num, page_num, page_size, 1, self.kv_cache_dim),
                                  np.uint16)

    def comps(self):
        return [self.kv_buffer]


class FakeLogicalHostPool:
    """LogicalHostPool (memory_pool_host.py), DeepSeek-V4's KV anchor: page
    slots only, no bytes (kv_buffer None, layer_num 0)."""

    def __init__(self, layout="page_first", page_num=4, page_size=PAGE):
        self.layout, self.page_size, self.page_num = layout, page_size, page_num
        self.size = self.logical_size = page_num * page_size
        self.start_layer = self.end_layer = self.layer_num = 0
        self.kv_buffer = None
        self.dtype = FakeDtype("uint8", 1)


class FakeMambaPoolHost:
    """MambaPoolHost's identifying attributes (pool_host/mamba.py): one
    state slot a page, no layers or kv_buffer of KV's shape."""

    def __init__(self, slots=4):
        self.page_size, self.size, self.layout = 1, slots, "page_first"
        self.num_mamba_layers = 2
        self.temporal_buffer = np.zeros((2, slots, 8), np.float32)
        self.kv_buffer = [self.temporal_buffer]


def indices(slots, page=PAGE):
    """SGLang's host indices of pages at these slots: page tokens each."""
    return np.concatenate([np.arange(s * page, (s + 1) * page, dtype=np.int64) for s in slots]) \
        if slots else np.zeros(0, np.int64)
