package manifest

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// field is one expected key of a JSON object and how to decode its value.
type field struct {
	name   string
	decode func(d *decoder, v *value) error
}

// decoder turns a parsed value into a Manifest, checking the schema: exact
// fields, their types, integers that fit.
type decoder struct {
	path []pathElem
}

func (d *decoder) at() string { return formatPath(d.path) }

func (d *decoder) typeErr(v *value, want string) error {
	return fmt.Errorf("manifest field %s is %s; want %s", d.at(), v.kind, want)
}

// object checks that v is an object with exactly fields and decodes each,
// in the order of fields.
func (d *decoder) object(v *value, fields ...field) error {
	return d.objectOptional(v, nil, fields...)
}

// objectOptional is object where the fields named in optional may be
// absent (their destination then keeps its zero value). Whether a present
// optional field may carry its zero value is the canonical encoding's to
// say: Decode compares the input with it.
func (d *decoder) objectOptional(v *value, optional []string, fields ...field) error {
	if v.kind != kindObject {
		if len(d.path) == 0 {
			return fmt.Errorf("manifest is %s; want an object", v.kind)
		}
		return d.typeErr(v, "an object")
	}
	for _, k := range v.keys {
		known := false
		for _, f := range fields {
			known = known || f.name == k
		}
		if !known {
			d.path = append(d.path, pathElem{key: k, isKey: true})
			return fmt.Errorf("manifest has unknown field %s", d.at())
		}
	}
	for _, f := range fields {
		d.path = append(d.path, pathElem{key: f.name, isKey: true})
		fv, ok := v.fields[f.name]
		if !ok && slices.Contains(optional, f.name) {
			d.path = d.path[:len(d.path)-1]
			continue
		}
		if !ok {
			return fmt.Errorf("manifest is missing field %s", d.at())
		}
		if err := f.decode(d, fv); err != nil {
			return err
		}
		d.path = d.path[:len(d.path)-1]
	}
	return nil
}

// array checks that v is an array and decodes each element.
func (d *decoder) array(v *value, elem func(d *decoder, v *value) error) error {
	if v.kind != kindArray {
		return d.typeErr(v, "an array")
	}
	for i, e := range v.elems {
		d.path = append(d.path, pathElem{index: i})
		if err := elem(d, e); err != nil {
			return err
		}
		d.path = d.path[:len(d.path)-1]
	}
	return nil
}

func intField(dst *int) func(d *decoder, v *value) error {
	return func(d *decoder, v *value) error {
		if v.kind != kindNumber {
			return d.typeErr(v, "an integer")
		}
		if strings.ContainsAny(v.str, ".eE") {
			return fmt.Errorf("manifest field %s is %s; want an integer", d.at(), v.str)
		}
		n, err := strconv.ParseInt(v.str, 10, 0)
		if err != nil {
			return fmt.Errorf("manifest field %s is %s, out of range", d.at(), v.str)
		}
		*dst = int(n)
		return nil
	}
}

func intsField(dst *[]int) func(d *decoder, v *value) error {
	return func(d *decoder, v *value) error {
		if v.kind == kindArray {
			*dst = make([]int, len(v.elems))
		}
		i := 0
		return d.array(v, func(d *decoder, e *value) error {
			err := intField(&(*dst)[i])(d, e)
			i++
			return err
		})
	}
}

func stringField(dst *string) func(d *decoder, v *value) error {
	return func(d *decoder, v *value) error {
		if v.kind != kindString {
			return d.typeErr(v, "a string")
		}
		*dst = v.str
		return nil
	}
}

func descriptorFields(x *Descriptor) []field {
	return []field{
		{"draft_layers", intField(&x.DraftLayers)}, // optional: absent is 0
		{"dtype", stringField(&x.Dtype)},
		{"head_dims", intsField(&x.HeadDims)},
		{"item_size", intField(&x.ItemSize)},
		{"kv_heads", intField(&x.KVHeads)},
		{"layers", intsField(&x.Layers)},
		{"page_size", intField(&x.PageSize)},
	}
}

func (d *decoder) manifest(v *value, m *Manifest) error {
	return d.object(v,
		field{"descriptor", func(d *decoder, v *value) error {
			return d.objectOptional(v, []string{"draft_layers"}, descriptorFields(&m.Descriptor)...)
		}},
		field{"layout", func(d *decoder, v *value) error {
			return d.object(v,
				field{"name", stringField(&m.Layout.Name)},
				field{"order", stringField(&m.Layout.Order)},
			)
		}},
		field{"model_domain", stringField(&m.Domain)},
		field{"parts", func(d *decoder, v *value) error {
			if v.kind == kindArray {
				m.Parts = make([]Part, len(v.elems))
			}
			i := 0
			return d.array(v, func(d *decoder, e *value) error {
				p := &m.Parts[i]
				i++
				return d.object(e,
					field{"cp_rank", intField(&p.CPRank)},
					field{"cp_size", intField(&p.CPSize)},
					field{"head_count", intField(&p.HeadCount)},
					field{"head_start", intField(&p.HeadStart)},
					field{"interleave", intField(&p.Interleave)},
					field{"layers", intsField(&p.Layers)},
				)
			})
		}},
	)
}

// Decode decodes and validates the manifest data stored under key, for a
// reader of model domain domain. key may be "" to skip the key check.
//
// Decode is strict: data must be at most MaxSize bytes of valid JSON with no
// duplicate keys, exactly the fields of a manifest with the right types
// (descriptor.draft_layers is optional: absent means 0, and the canonical
// encoding has it only when it is not 0), a valid descriptor, a valid part
// layout whose order is in canonical form and fits the descriptor, parts
// in derived order that cover every (layer, head) of the descriptor
// exactly once, and it must be the canonical encoding of the manifest it
// describes, so that Encode returns data. The manifest must
// belong to domain and, unless key is "", be the one key names.
func Decode(data []byte, key, domain string) (*Manifest, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("manifest is %d bytes; the limit is %d", len(data), MaxSize)
	}
	v, err := parseJSON(data)
	if err != nil {
		return nil, err
	}
	m := &Manifest{}
	if err := new(decoder).manifest(v, m); err != nil {
		return nil, err
	}
	for i := 1; i < len(m.Parts); i++ {
		if ComparePart(m.Parts[i-1], m.Parts[i]) > 0 {
			return nil, fmt.Errorf("manifest part %d is out of order: parts are sorted by layers, then head_start, head_count, cp_size, interleave and cp_rank", i)
		}
	}
	if err := m.validate(true); err != nil {
		return nil, err
	}
	enc := m.appendJSON(nil)
	if !bytes.Equal(enc, data) {
		i := 0
		for i < len(enc) && i < len(data) && enc[i] == data[i] {
			i++
		}
		return nil, fmt.Errorf("manifest encoding is not canonical: it differs from the canonical encoding at byte %d", i)
	}
	m.seal(enc)
	if m.Domain != domain {
		return nil, fmt.Errorf("manifest belongs to model domain %s, not %s", m.Domain, domain)
	}
	if key != "" && key != m.Key() {
		rest, ok := strings.CutPrefix(key, "kv/")
		keyDomain, digest, ok2 := strings.Cut(rest, "/manifests/")
		switch {
		case !ok || !ok2:
			return nil, fmt.Errorf("manifest key %q is not of the form kv/<model_domain>/manifests/<digest>", key)
		case keyDomain != m.Domain:
			return nil, fmt.Errorf("manifest key %q is not under its model domain %s", key, m.Domain)
		default:
			return nil, fmt.Errorf("manifest digest %s does not match its key %q (key digest %s)", m.Digest(), key, digest)
		}
	}
	return m, nil
}
