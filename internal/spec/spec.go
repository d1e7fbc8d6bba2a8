// Package spec holds the rules that turn a user's description of a model
// and of its pages into the runtime's values, for every front end that
// takes one: the kvreshard command's --model flag and the C library's
// kvr_model (and through it Python's Model). Each front end keeps only its
// own syntax (flags, C structs) and presence checks; the bounds, the
// defaults a value's 0 stands for, and the page-key encoding live here, so
// that the command and the library accept and refuse the same models.
//
// Errors about one field are a *FieldError, which each front end prints in
// its own names (layers=5000 on the command line, layers 5000 in C).
package spec

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// MaxLayers bounds a model's layers, which are listed one by one: far past
// the deepest models' (about 130).
const MaxLayers = 1 << 12

// Model is a model as a user describes it.
type Model struct {
	Layers   int // 1..MaxLayers; the layers are 0..Layers-1
	KVHeads  int // KV heads of the whole model
	HeadDim  int // elements of a K head (of the latent with MLA)
	VHeadDim int // elements of a V head; 0 means HeadDim; must be 0 with MLA
	Page     int // tokens per page
	MLA      bool
	// DraftLayers: the last DraftLayers of the layers are the draft layers
	// of speculative decoding (MTP), which a page holds after the model's
	// own; 0..Layers.
	DraftLayers int
	Dtype       string // fp32, bf16, fp16 or fp8

	// The model's identity: they enter the model domain. The front end
	// gives its defaults.
	Name, Revision, Namespace, Fingerprint string
}

// FieldError is an invalid value of one field of a description.
type FieldError struct {
	Field  string // the field's name with '_', as "kv_heads"
	Value  string // the value as given, "" when the field is missing
	Reason string // what is wrong, worded to follow the field and its value
}

// Error returns "field value reason", or "field reason" for a missing one.
func (e *FieldError) Error() string {
	if e.Value == "" {
		return e.Field + " " + e.Reason
	}
	return e.Field + " " + e.Value + " " + e.Reason
}

func fieldErr(field string, v int, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Value: strconv.Itoa(v), Reason: fmt.Sprintf(format, args...)}
}

// Build checks m and returns it as the runtime's model. A bad field is a
// *FieldError; an error about the model as a whole (a page of more bytes
// than a manifest allows, an identity field that is too long) is the
// manifest package's.
func (m Model) Build() (manifest.Model, error) {
	var d manifest.Descriptor
	if m.Layers < 1 || m.Layers > MaxLayers {
		return manifest.Model{}, fieldErr("layers", m.Layers, "is not from 1 to %d", MaxLayers)
	}
	for i := range m.Layers {
		d.Layers = append(d.Layers, i)
	}
	if m.KVHeads < 1 {
		return manifest.Model{}, fieldErr("kv_heads", m.KVHeads, "must be positive")
	}
	d.KVHeads = m.KVHeads
	if m.HeadDim < 1 {
		return manifest.Model{}, fieldErr("head_dim", m.HeadDim, "must be positive")
	}
	d.HeadDims = []int{m.HeadDim}
	switch {
	case m.MLA && m.VHeadDim != 0:
		return manifest.Model{}, fieldErr("v_head_dim", m.VHeadDim, "is not allowed: an mla model has one latent component")
	case m.VHeadDim < 0:
		return manifest.Model{}, fieldErr("v_head_dim", m.VHeadDim, "is negative; 0 means head_dim")
	case m.MLA:
	case m.VHeadDim == 0:
		d.HeadDims = append(d.HeadDims, m.HeadDim)
	default:
		d.HeadDims = append(d.HeadDims, m.VHeadDim)
	}
	if m.Dtype == "" {
		return manifest.Model{}, &FieldError{Field: "dtype", Reason: "is required (fp32, bf16, fp16 or fp8)"}
	}
	size, err := manifest.ItemSizeOf(m.Dtype)
	if err != nil {
		return manifest.Model{}, &FieldError{Field: "dtype", Value: strconv.Quote(m.Dtype), Reason: "is unknown; dtypes are fp32, bf16, fp16 and fp8"}
	}
	d.Dtype, d.ItemSize = m.Dtype, size
	if m.Page < 1 {
		return manifest.Model{}, fieldErr("page", m.Page, "must be positive")
	}
	d.PageSize = m.Page
	if m.DraftLayers < 0 || m.DraftLayers > m.Layers {
		return manifest.Model{}, fieldErr("draft_layers", m.DraftLayers, "is not from 0 to the %d layers", m.Layers)
	}
	d.DraftLayers = m.DraftLayers
	out := manifest.Model{Namespace: m.Namespace, ModelID: m.Name, Revision: m.Revision, Fingerprint: m.Fingerprint, Descriptor: d}
	if err := out.Validate(); err != nil {
		return manifest.Model{}, err
	}
	return out, nil
}

// KeyPrefix is the prefix of the page keys the C library stores and the
// kvreshard command reads by default, so that each finds the other's pages.
const KeyPrefix = "kvreshard"

// PageKeys returns the store keys of pages keys of the model domain,
// manifest.PageKey(prefix, key, domain). A key is a non-empty byte string
// (a page's hash) without '_', which separates a page key's fields, and
// without a NUL byte, where a C string would end; any other byte may be in
// it: every store takes any bytes, and messages quote keys. Errors name
// the key by its index.
func PageKeys(prefix, domain string, keys [][]byte) ([]string, error) {
	out := make([]string, len(keys))
	for i, k := range keys {
		switch {
		case len(k) == 0:
			return nil, fmt.Errorf("key %d is empty", i)
		case bytes.IndexByte(k, 0) >= 0:
			return nil, fmt.Errorf("key %d contains a NUL byte", i)
		case bytes.IndexByte(k, '_') >= 0:
			return nil, fmt.Errorf("key %d %q contains '_'; a key is the page's hash, without '_'", i, k)
		}
		out[i] = manifest.PageKey(prefix, string(k), domain)
	}
	return out, nil
}
