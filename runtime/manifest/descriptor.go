package manifest

import (
	"fmt"
	"strconv"
)

// MaxPageBytes bounds the bytes of one whole page (every layer, head and
// component of the descriptor), so that no byte count derived from a
// descriptor can overflow.
const MaxPageBytes = 1 << 40

// Descriptor says what the bytes of a page mean. It is part of the model
// domain and of every manifest.
type Descriptor struct {
	// Layers are the global layer ids of the page, strictly ascending and
	// non-negative (usually 0..n-1).
	Layers []int `json:"layers"`
	// KVHeads is the total number of KV heads.
	KVHeads int `json:"kv_heads"`
	// HeadDims is the head dim, in elements, of each component: [K, V]
	// (they may differ) or [latent] for MLA, which has one component.
	HeadDims []int `json:"head_dims"`
	// Dtype is fp32, bf16, fp16 or fp8 (e4m3 and e5m2 are both fp8: the
	// difference is in the model fingerprint, not in the bytes' geometry).
	Dtype string `json:"dtype"`
	// ItemSize is the bytes of one element; it must match Dtype.
	ItemSize int `json:"item_size"`
	// PageSize is the tokens per page.
	PageSize int `json:"page_size"`
	// DraftLayers is how many of the last Layers are the draft layers of
	// speculative decoding (MTP) that the page holds after the model's
	// own: 0 <= DraftLayers <= len(Layers). It enters the model domain, so
	// that pages with draft layers and pages without never share a key.
	// The canonical JSON carries it only when it is not 0, so that the
	// domains and manifest IDs of models without draft layers are those of
	// a descriptor without the field.
	DraftLayers int `json:"draft_layers,omitempty"`
}

// ItemSizeOf returns the bytes of one element of dtype.
func ItemSizeOf(dtype string) (int, error) {
	switch dtype {
	case "fp32":
		return 4, nil
	case "bf16", "fp16":
		return 2, nil
	case "fp8":
		return 1, nil
	}
	return 0, fmt.Errorf("dtype %q is unknown; dtypes are fp32, bf16, fp16 and fp8", dtype)
}

// componentName names component c of a descriptor with n components.
func componentName(c, n int) string {
	if n == 1 {
		return "latent"
	}
	if c == 0 {
		return "k"
	}
	return "v"
}

// Validate returns the first thing wrong with d, or nil.
func (d *Descriptor) Validate() error {
	if len(d.Layers) == 0 {
		return fmt.Errorf("descriptor has no layers")
	}
	for i, l := range d.Layers {
		if l < 0 {
			return fmt.Errorf("descriptor layer %d is negative", l)
		}
		if i > 0 && l <= d.Layers[i-1] {
			return fmt.Errorf("descriptor layers are not strictly ascending: %d after %d", l, d.Layers[i-1])
		}
	}
	if d.KVHeads <= 0 {
		return fmt.Errorf("descriptor kv_heads is %d; it must be positive", d.KVHeads)
	}
	if n := len(d.HeadDims); n != 1 && n != 2 {
		return fmt.Errorf("descriptor has %d head dims; want 2 (k and v) or 1 (an mla latent)", n)
	}
	for c, dim := range d.HeadDims {
		if dim <= 0 {
			return fmt.Errorf("descriptor %s head dim is %d; it must be positive", componentName(c, len(d.HeadDims)), dim)
		}
	}
	size, err := ItemSizeOf(d.Dtype)
	if err != nil {
		return fmt.Errorf("descriptor %w", err)
	}
	if d.ItemSize != size {
		return fmt.Errorf("descriptor item_size is %d but dtype %s has item size %d", d.ItemSize, d.Dtype, size)
	}
	if d.PageSize <= 0 {
		return fmt.Errorf("descriptor page_size is %d; it must be positive", d.PageSize)
	}
	if d.DraftLayers < 0 || d.DraftLayers > len(d.Layers) {
		return fmt.Errorf("descriptor draft_layers is %d; it must be from 0 to its %d layers", d.DraftLayers, len(d.Layers))
	}
	if _, ok := d.bytes(len(d.Layers), d.KVHeads); !ok {
		return fmt.Errorf("descriptor page is more than %d bytes", MaxPageBytes)
	}
	return nil
}

// bytes returns the bytes of layers x heads of every component, and false
// when they exceed MaxPageBytes. All factors must be positive.
func (d *Descriptor) bytes(layers, heads int) (int, bool) {
	total := 0
	for _, dim := range d.HeadDims {
		n := 1
		for _, f := range [...]int{d.PageSize, layers, heads, dim, d.ItemSize} {
			if f <= 0 || n > MaxPageBytes/f {
				return 0, false
			}
			n *= f
		}
		total += n
		if total > MaxPageBytes {
			return 0, false
		}
	}
	return total, true
}

// PageBytes returns the bytes of one whole page: every component, layer and
// head. d must be valid.
func (d *Descriptor) PageBytes() int {
	n, _ := d.bytes(len(d.Layers), d.KVHeads)
	return n
}

// appendJSON appends the canonical JSON of d: keys sorted, no spaces,
// draft_layers only when it is not 0.
func (d *Descriptor) appendJSON(b []byte) []byte {
	b = append(b, '{')
	if d.DraftLayers != 0 {
		b = append(b, `"draft_layers":`...)
		b = strconv.AppendInt(b, int64(d.DraftLayers), 10)
		b = append(b, ',')
	}
	b = append(b, `"dtype":`...)
	b = appendString(b, d.Dtype)
	b = append(b, `,"head_dims":`...)
	b = appendInts(b, d.HeadDims)
	b = append(b, `,"item_size":`...)
	b = strconv.AppendInt(b, int64(d.ItemSize), 10)
	b = append(b, `,"kv_heads":`...)
	b = strconv.AppendInt(b, int64(d.KVHeads), 10)
	b = append(b, `,"layers":`...)
	b = appendInts(b, d.Layers)
	b = append(b, `,"page_size":`...)
	b = strconv.AppendInt(b, int64(d.PageSize), 10)
	return append(b, '}')
}

func (d *Descriptor) clone() Descriptor {
	c := *d
	c.Layers = append([]int(nil), d.Layers...)
	c.HeadDims = append([]int(nil), d.HeadDims...)
	return c
}
