// Package manifest is the semantic identity of cached KV pages and the
// immutable, content-addressed description of how a page is stored.
//
// A Descriptor says what the bytes of a page mean; a Model adds its
// identity, and Model.Domain digests both into the model domain, which
// excludes TP, PP, ranks and physical layout. PageKey names one logical page.
//
// A Manifest describes a source layout: the model domain, the descriptor, the
// part layout (its name and full axis order, so that a reader that did not
// compile it can still interpret it) and the layers, KV-head interval and
// token set (TokenSet: the tokens of one context-parallel rank, or every
// token) of every part. Part byte geometry is derived, never stored: part i
// holds its K region then its V region, each PageSize/cp_size x
// len(layers) x HeadCount x head dim elements laid out by the layout's
// order. The order of the parts is derived too (sorted by layers, then head
// interval, then token set), and the encoding is
// canonical JSON (keys sorted, no spaces), so identical manifests have
// identical bytes and identical ids, and a manifest's id is the SHA-256 of
// its bytes.
//
// Parts of replicated heads (TP larger than the KV-head count) are stored
// once, so every (layer, head, token) of the descriptor is covered by
// exactly one part.
package manifest

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

// MaxLayoutText bounds the bytes of a layout's name and of its order text.
// A valid order names six axes, two of them possibly split, so it is far
// shorter.
const MaxLayoutText = 256

// MaxSize bounds the bytes of an encoded manifest: Decode refuses longer
// data and New refuses a manifest whose encoding is longer, so that no
// writer stores a manifest that readers refuse. Stores reading a manifest
// read at most this many bytes of it.
const MaxSize = 1 << 20

// MaxParts bounds the parts of a manifest: each part encodes to at least
// as many bytes as the shortest part and its comma, so a manifest of more
// parts is past MaxSize. Writers check it before they build the parts.
const MaxParts = MaxSize / (len(`{"cp_rank":0,"cp_size":1,"head_count":1,"head_start":0,"interleave":1,"layers":[0]}`) + 1)

// PartLayout is a part layout: its name and its canonical order text, for
// example "C T L H D" or "C L H D/8 T D%8". It has no slot axis S.
type PartLayout struct {
	Name  string `json:"name"`
	Order string `json:"order"`
}

// Part is one writer's share of a page: global layer ids, a KV-head
// interval and a token set.
type Part struct {
	Layers    []int `json:"layers"`
	HeadStart int   `json:"head_start"`
	HeadCount int   `json:"head_count"`
	TokenSet
}

// TokenSet is the tokens of a page that one context-parallel rank holds:
// the page's tokens are dealt to CPSize ranks in runs of Interleave tokens,
// round-robin, and this is rank CPRank's share. Token p of the page belongs
// to rank (p / Interleave) % CPSize; CPSize x Interleave divides the page,
// so every rank holds page / CPSize tokens, and its local token j is the
// page's token ((j / Interleave) x CPSize + CPRank) x Interleave +
// j % Interleave. Without context parallelism a part holds every token:
// CPSize 1, CPRank 0, Interleave 1. The zero TokenSet means the same (New
// stores it as 1, 0, 1).
type TokenSet struct {
	CPSize     int `json:"cp_size"`
	CPRank     int `json:"cp_rank"`
	Interleave int `json:"interleave"`
}

// Norm returns s with a zero CPSize or Interleave as 1: the token set of
// every token.
func (s TokenSet) Norm() TokenSet {
	if s.CPSize == 0 {
		s.CPSize = 1
	}
	if s.Interleave == 0 {
		s.Interleave = 1
	}
	return s
}

// All reports whether s holds every token of a page.
func (s TokenSet) All() bool { return s.CPSize <= 1 }

// Same reports whether s and o hold the same tokens of a page, in the same
// order: equal once normalized (Norm), or both every token.
func (s TokenSet) Same(o TokenSet) bool {
	s, o = s.Norm(), o.Norm()
	return s == o || s.All() && o.All()
}

// Tokens returns how many tokens of a page of pageSize tokens s holds. s
// must be valid for the page (see Check).
func (s TokenSet) Tokens(pageSize int) int { return pageSize / max(s.CPSize, 1) }

// Global returns the page's token that local token j of s is.
func (s TokenSet) Global(j int) int {
	s = s.Norm()
	i := s.Interleave
	return ((j/i)*s.CPSize+s.CPRank)*i + j%i
}

// Local returns the local index of the page's token p in s, and whether s
// holds it.
func (s TokenSet) Local(p int) (int, bool) {
	s = s.Norm()
	run := p / s.Interleave
	if run%s.CPSize != s.CPRank {
		return 0, false
	}
	return run/s.CPSize*s.Interleave + p%s.Interleave, true
}

// Check returns why s is not a token set of a page of pageSize tokens, or
// nil; what names it in the error ("manifest part 3", say).
func (s TokenSet) Check(what string, pageSize int) error {
	switch {
	case s.CPSize <= 0:
		return fmt.Errorf("%s cp_size is %d; it must be positive", what, s.CPSize)
	case s.CPSize > pageSize:
		return fmt.Errorf("%s cp_size %d is more than the page's %d tokens", what, s.CPSize, pageSize)
	case s.CPRank < 0 || s.CPRank >= s.CPSize:
		return fmt.Errorf("%s cp_rank %d is outside cp_size %d", what, s.CPRank, s.CPSize)
	case s.Interleave <= 0:
		return fmt.Errorf("%s interleave is %d; it must be positive", what, s.Interleave)
	case pageSize%s.Interleave != 0:
		return fmt.Errorf("%s interleave %d does not divide the page's %d tokens", what, s.Interleave, pageSize)
	case s.CPSize > pageSize/s.Interleave || pageSize%(s.CPSize*s.Interleave) != 0:
		// The first test keeps the product from overflowing.
		return fmt.Errorf("%s cp_size %d x interleave %d does not divide the page's %d tokens", what, s.CPSize, s.Interleave, pageSize)
	}
	return nil
}

// CompareTokens orders token sets by CP size, then interleave, then CP
// rank.
func CompareTokens(a, b TokenSet) int {
	if c := cmp.Compare(a.CPSize, b.CPSize); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Interleave, b.Interleave); c != 0 {
		return c
	}
	return cmp.Compare(a.CPRank, b.CPRank)
}

// ComparePart orders parts the way manifests store them: by layers
// (lexicographically), then head start, then head count, then token set
// (CompareTokens).
func ComparePart(a, b Part) int {
	if c := slices.Compare(a.Layers, b.Layers); c != 0 {
		return c
	}
	if c := cmp.Compare(a.HeadStart, b.HeadStart); c != 0 {
		return c
	}
	if c := cmp.Compare(a.HeadCount, b.HeadCount); c != 0 {
		return c
	}
	return CompareTokens(a.TokenSet, b.TokenSet)
}

// SortParts sorts parts into their derived order (see ComparePart).
func SortParts(parts []Part) { slices.SortStableFunc(parts, ComparePart) }

// Manifest is the immutable description of a source layout, shared by every
// page written in it. Build one with New or Decode and do not modify it:
// its encoding and digest are computed once.
type Manifest struct {
	Domain     string     `json:"model_domain"`
	Descriptor Descriptor `json:"descriptor"`
	Layout     PartLayout `json:"layout"`
	Parts      []Part     `json:"parts"`

	enc    []byte
	digest string
	id     string // ID, computed once: readers ask for it per page
	key    string // Key, likewise
}

// New returns the manifest of parts stored in layout l, for pages of the
// model domain whose descriptor is d. It copies its arguments, sorts the
// parts into their derived order (so part indices in errors and in the
// result are in that order), rewrites the layout's order in canonical form,
// and validates everything Decode does, its MaxSize limit included.
func New(domain string, d Descriptor, l PartLayout, parts []Part) (*Manifest, error) {
	if len(parts) > MaxParts {
		return nil, fmt.Errorf("manifest has %d parts; readers accept at most %d", len(parts), MaxParts)
	}
	m := &Manifest{Domain: domain, Descriptor: d.clone(), Layout: l}
	m.Parts = make([]Part, len(parts))
	for i, p := range parts {
		p.Layers = append([]int(nil), p.Layers...)
		p.TokenSet = p.TokenSet.Norm()
		m.Parts[i] = p
	}
	SortParts(m.Parts)
	if err := m.validate(false); err != nil {
		return nil, err
	}
	enc := m.appendJSON(nil)
	if len(enc) > MaxSize {
		parts := "parts"
		if len(m.Parts) == 1 {
			parts = "part"
		}
		return nil, fmt.Errorf("manifest of %d %s is %d bytes encoded; readers accept at most %d", len(m.Parts), parts, len(enc), MaxSize)
	}
	m.seal(enc)
	return m, nil
}

// seal records the canonical encoding and its digest.
func (m *Manifest) seal(enc []byte) {
	m.enc = enc
	sum := sha256.Sum256(enc)
	m.digest = hex.EncodeToString(sum[:])
	m.id = "sha256:" + m.digest
	m.key = "kv/" + m.Domain + "/manifests/" + m.digest
}

// validate checks m. With strictOrder the layout order must already be
// canonical; otherwise it is rewritten to canonical form.
func (m *Manifest) validate(strictOrder bool) error {
	if !isDomain(m.Domain) {
		return fmt.Errorf("manifest model domain %.80q is not a lowercase hex sha-256 digest", m.Domain)
	}
	d := &m.Descriptor
	if err := d.Validate(); err != nil {
		return fmt.Errorf("manifest %w", err)
	}
	if err := m.validateLayout(strictOrder); err != nil {
		return err
	}
	if len(m.Parts) == 0 {
		return fmt.Errorf("manifest has no parts")
	}
	for i, p := range m.Parts {
		if len(p.Layers) == 0 {
			return fmt.Errorf("manifest part %d has no layers", i)
		}
		for j, l := range p.Layers {
			if j > 0 && l <= p.Layers[j-1] {
				return fmt.Errorf("manifest part %d layers are not strictly ascending: %d after %d", i, l, p.Layers[j-1])
			}
			if _, ok := slices.BinarySearch(d.Layers, l); !ok {
				return fmt.Errorf("manifest part %d layer %d is not in the descriptor", i, l)
			}
		}
		if p.HeadCount <= 0 {
			return fmt.Errorf("manifest part %d head_count is %d; it must be positive", i, p.HeadCount)
		}
		if p.HeadStart < 0 {
			return fmt.Errorf("manifest part %d head_start is %d; it must not be negative", i, p.HeadStart)
		}
		if p.HeadStart > d.KVHeads-p.HeadCount {
			return fmt.Errorf("manifest part %d head_start %d + head_count %d is more than kv_heads %d",
				i, p.HeadStart, p.HeadCount, d.KVHeads)
		}
		if err := p.TokenSet.Check(fmt.Sprintf("manifest part %d", i), d.PageSize); err != nil {
			return err
		}
		if p.CPSize == 1 && p.Interleave != 1 {
			// One token set, one encoding: every token is cp_size 1,
			// interleave 1.
			return fmt.Errorf("manifest part %d has cp_size 1 and interleave %d; a part of every token has interleave 1", i, p.Interleave)
		}
		if q := m.Parts[0].TokenSet; p.CPSize != q.CPSize || p.Interleave != q.Interleave {
			return fmt.Errorf("manifest part %d has cp_size %d and interleave %d but part 0 has %d and %d; a manifest's parts share them",
				i, p.CPSize, p.Interleave, q.CPSize, q.Interleave)
		}
	}
	if err := m.checkTokenSplit(); err != nil {
		return err
	}
	return m.checkCoverage()
}

// validateLayout checks the layout's order with the dsl and against the
// descriptor's shapes.
func (m *Manifest) validateLayout(strictOrder bool) error {
	d := &m.Descriptor
	if len(m.Layout.Name) > MaxLayoutText {
		return fmt.Errorf("manifest layout name is %d bytes; the limit is %d", len(m.Layout.Name), MaxLayoutText)
	}
	if len(m.Layout.Order) > MaxLayoutText {
		return fmt.Errorf("manifest layout %q order is %d bytes; the limit is %d", m.Layout.Name, len(m.Layout.Order), MaxLayoutText)
	}
	l, err := ir.ParseOrder("part", m.Layout.Name, m.Layout.Order)
	if err != nil {
		return fmt.Errorf("manifest %w", err)
	}
	if canon := l.OrderString(); canon != m.Layout.Order {
		if strictOrder {
			return fmt.Errorf("manifest layout %q order %q is not canonical; want %q", m.Layout.Name, m.Layout.Order, canon)
		}
		m.Layout.Order = canon
	}
	if len(d.HeadDims) == 2 && d.HeadDims[0] != d.HeadDims[1] {
		if first := l.Order[0]; first.Axis != "C" || first.Op != "" {
			return fmt.Errorf("manifest layout %q has k and v head dims %d and %d, so C must be its outermost axis",
				m.Layout.Name, d.HeadDims[0], d.HeadDims[1])
		}
	}
	for _, mode := range l.Order {
		if mode.Op != "/" {
			continue
		}
		switch mode.Axis {
		case "T":
			if d.PageSize%mode.Factor != 0 {
				return fmt.Errorf("manifest layout %q splits T by %d, which does not divide page_size %d",
					m.Layout.Name, mode.Factor, d.PageSize)
			}
		case "D":
			for c, dim := range d.HeadDims {
				if dim%mode.Factor != 0 {
					return fmt.Errorf("manifest layout %q splits D by %d, which does not divide the %s head dim %d",
						m.Layout.Name, mode.Factor, componentName(c, len(d.HeadDims)), dim)
				}
			}
		}
	}
	return nil
}

// checkTokenSplit checks that a layout that splits T splits the tokens
// each part holds: page_size / cp_size.
func (m *Manifest) checkTokenSplit() error {
	cp := m.Parts[0].CPSize
	if cp == 1 {
		return nil // validateLayout checked the page
	}
	l, err := ir.ParseOrder("part", m.Layout.Name, m.Layout.Order)
	if err != nil {
		return fmt.Errorf("manifest %w", err)
	}
	n := m.Descriptor.PageSize / cp
	for _, mode := range l.Order {
		if mode.Op == "/" && mode.Axis == "T" && n%mode.Factor != 0 {
			return fmt.Errorf("manifest layout %q splits T by %d, which does not divide the %d tokens a part of cp_size %d holds",
				m.Layout.Name, mode.Factor, n, cp)
		}
	}
	return nil
}

// interval is the head interval of one part at one layer.
type interval struct{ start, end, part int }

// checkCoverage checks that every (layer, head, token) of the descriptor
// is in exactly one part, and names the first one that is not, in (layer,
// CP rank, head) order. Parts share their CP size and interleave (validate
// checks it), so a token is covered once when each (layer, CP rank) has its
// heads covered once. Its cost is in the size of the parts, not in layers
// x heads x CP ranks.
func (m *Manifest) checkCoverage() error {
	d := &m.Descriptor
	cp := m.Parts[0].CPSize
	type key struct{ layer, rank int }
	byLayer := map[key][]interval{}
	for i, p := range m.Parts {
		for _, l := range p.Layers {
			k, _ := slices.BinarySearch(d.Layers, l)
			byLayer[key{k, p.CPRank}] = append(byLayer[key{k, p.CPRank}], interval{p.HeadStart, p.HeadStart + p.HeadCount, i})
		}
	}
	// Visit (layer, rank) in order: the first one absent is reached after
	// at most as many steps as there are present ones.
	for k := range d.Layers {
		for r := 0; r < cp; r++ {
			ivs := byLayer[key{k, r}]
			if err := m.checkHeads(k, r, cp, ivs); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkHeads checks that the head intervals ivs of layer index k and CP
// rank r cover every head once.
func (m *Manifest) checkHeads(k, r, cp int, ivs []interval) error {
	d := &m.Descriptor
	where := ""
	if cp > 1 {
		where = fmt.Sprintf(" cp_rank %d", r)
	}
	slices.SortFunc(ivs, func(a, b interval) int {
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return cmp.Compare(a.part, b.part)
	})
	pos, last := 0, -1
	for _, iv := range ivs {
		if iv.start > pos {
			break
		}
		if iv.start < pos {
			return fmt.Errorf("manifest covers layer %d head %d%s twice: parts %d and %d", d.Layers[k], iv.start, where, last, iv.part)
		}
		pos, last = iv.end, iv.part
	}
	if pos < d.KVHeads {
		return fmt.Errorf("manifest does not cover layer %d head %d%s", d.Layers[k], pos, where)
	}
	return nil
}

// appendJSON appends the canonical JSON of m: keys sorted, no spaces.
func (m *Manifest) appendJSON(b []byte) []byte {
	b = append(b, `{"descriptor":`...)
	b = m.Descriptor.appendJSON(b)
	b = append(b, `,"layout":{"name":`...)
	b = appendString(b, m.Layout.Name)
	b = append(b, `,"order":`...)
	b = appendString(b, m.Layout.Order)
	b = append(b, `},"model_domain":`...)
	b = appendString(b, m.Domain)
	b = append(b, `,"parts":[`...)
	for i, p := range m.Parts {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"cp_rank":`...)
		b = strconv.AppendInt(b, int64(p.CPRank), 10)
		b = append(b, `,"cp_size":`...)
		b = strconv.AppendInt(b, int64(p.CPSize), 10)
		b = append(b, `,"head_count":`...)
		b = strconv.AppendInt(b, int64(p.HeadCount), 10)
		b = append(b, `,"head_start":`...)
		b = strconv.AppendInt(b, int64(p.HeadStart), 10)
		b = append(b, `,"interleave":`...)
		b = strconv.AppendInt(b, int64(p.Interleave), 10)
		b = append(b, `,"layers":`...)
		b = appendInts(b, p.Layers)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// Encode returns the canonical JSON of m (keys sorted, no spaces): the bytes
// stored under Key. The result is a copy.
func (m *Manifest) Encode() []byte {
	if m.enc == nil {
		return m.appendJSON(nil)
	}
	return slices.Clone(m.enc)
}

// Digest returns the hex SHA-256 of Encode().
func (m *Manifest) Digest() string {
	if m.digest == "" {
		sum := sha256.Sum256(m.appendJSON(nil))
		return hex.EncodeToString(sum[:])
	}
	return m.digest
}

// ID returns "sha256:" + Digest(): the id that templates are cached
// by.
func (m *Manifest) ID() string {
	if m.id != "" {
		return m.id
	}
	return "sha256:" + m.Digest()
}

// Key returns the store key of the manifest:
// "kv/" + model domain + "/manifests/" + digest.
func (m *Manifest) Key() string {
	if m.key != "" {
		return m.key
	}
	return "kv/" + m.Domain + "/manifests/" + m.Digest()
}

// PartBytes returns the bytes of part i: for each component, the tokens
// it holds (PageSize / CPSize) x len(layers) x HeadCount x head dim x
// ItemSize, the K region then the V region.
func (m *Manifest) PartBytes(i int) int {
	p := &m.Parts[i]
	n, _ := m.Descriptor.bytes(len(p.Layers), p.HeadCount)
	return n / p.CPSize
}

// PartOf returns the index of the part that holds (layer, head) of token
// 0, or -1 (see PartOfToken).
func (m *Manifest) PartOf(layer, head int) int { return m.PartOfToken(layer, head, 0) }

// PartOfToken returns the index of the part that holds (layer, head) of
// the page's token token, or -1.
func (m *Manifest) PartOfToken(layer, head, token int) int {
	for i := range m.Parts {
		p := &m.Parts[i]
		if head < p.HeadStart || head >= p.HeadStart+p.HeadCount {
			continue
		}
		if _, ok := p.Local(token); !ok {
			continue
		}
		if _, ok := slices.BinarySearch(p.Layers, layer); ok {
			return i
		}
	}
	return -1
}
