package dsl

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
)

func TestRoundTripBuiltins(t *testing.T) {
	f, err := Parse("builtin.kvl", []byte(builtins))
	require.NoError(t, err)
	text := f.String()
	require.Equal(t, `part PLHD "token-major; SGLang page_first" { order C T L H D }
part LPHD "layer-major" { order C L T H D }
part HPLD "head-major; SGLang page_head" { order C H T L D }
pool page_first { order C S T L H D }
pool page_first_direct { order C S L T H D }
pool layer_first { order C L S T H D }
pool page_head { order C S H T L D }
part vllm_xblock "vLLM x-blocked" { order C L H D/8 T D%8 }
part vllm_flash { order L C T H D }
part flashinfer_hnd { order L C H T D }
`, text)
	g, err := Parse("printed.kvl", []byte(text))
	require.NoError(t, err)
	require.Equal(t, noPos(f), noPos(g))
	require.Equal(t, text, g.String())
}

func TestRoundTripDocEscapes(t *testing.T) {
	for _, doc := range []string{`say "hi"`, `back\slash`, "tab\there", "new\nline", "nul\x00", "caf\u00e9 \u4e16", "\u2028", "\U0001F600", "bad \xff byte", "\x7f"} {
		f := &File{Decls: []*Decl{{Kind: "part", Name: "X", Doc: doc, Order: wholeModes("C", "T", "L", "H", "D")}}}
		require.Empty(t, Check(f))
		g, err := Parse("", []byte(f.String()))
		require.NoError(t, err, "%q", f.String())
		require.Equal(t, doc, g.Decls[0].Doc)
	}
}

func wholeModes(axes ...string) []*Mode {
	ms := make([]*Mode, len(axes))
	for i, a := range axes {
		ms[i] = &Mode{Axis: a}
	}
	return ms
}

// randomLayout returns a valid layout: every axis once (S only in a pool),
// T and D each split at random, outer half before inner half.
func randomLayout(r *rand.Rand, name string) *Decl {
	l := &Decl{Kind: "part", Name: name}
	axes := []string{"C", "T", "L", "H", "D"}
	if r.Intn(2) == 0 {
		l.Kind = "pool"
		axes = append(axes, "S")
	}
	var modes []*Mode
	for _, a := range axes {
		if ir.Splittable(a) && r.Intn(3) == 0 {
			factor := 2 + r.Intn(63)
			if r.Intn(8) == 0 {
				factor = MaxFactor - r.Intn(3)
			}
			modes = append(modes, &Mode{Axis: a, Op: "/", Factor: factor}, &Mode{Axis: a, Op: "%", Factor: factor})
			continue
		}
		modes = append(modes, &Mode{Axis: a})
	}
	r.Shuffle(len(modes), func(i, j int) { modes[i], modes[j] = modes[j], modes[i] })
	// Put each outer half before its inner half: both carry the same axis
	// and factor, so swapping their operators is enough.
	seen := map[string]*Mode{}
	for _, m := range modes {
		if m.Op == "%" && seen[m.Axis] == nil {
			m.Op = "/"
			seen[m.Axis] = m
		} else if m.Op == "/" && seen[m.Axis] == nil {
			seen[m.Axis] = m
		} else if m.Op == "/" {
			m.Op = "%"
		}
	}
	l.Order = modes
	if r.Intn(3) > 0 {
		l.Doc = randomDoc(r)
	}
	if l.Kind == "pool" && r.Intn(2) == 0 {
		l.Writes = &Ref{Name: fmt.Sprintf("w%d_part", r.Intn(100))}
	}
	return l
}

var docRunes = []rune("abcXYZ 019;:-_\"\\'\t\n\r\x00\x7f/{}%é世\u2028\U0001F600")

func randomDoc(r *rand.Rand) string {
	var b strings.Builder
	for n := r.Intn(20); n > 0; n-- {
		if r.Intn(40) == 0 {
			b.WriteByte(0x80 + byte(r.Intn(0x80))) // a stray byte: not UTF-8
			continue
		}
		b.WriteRune(docRunes[r.Intn(len(docRunes))])
	}
	return b.String()
}

func randomFile(r *rand.Rand) *File {
	f := &File{}
	for i := r.Intn(6); i > 0; i-- {
		f.Decls = append(f.Decls, randomLayout(r, fmt.Sprintf("%c%d_x", 'a'+rune(r.Intn(26)), len(f.Decls))))
	}
	return f
}

// layoutSource writes l with random spacing and comments between tokens:
// not the canonical form, but the same layout.
func layoutSource(r *rand.Rand, l *Decl) string {
	seps := []string{" ", "  ", "\t", "\n", "\r\n", " // a comment { order }\n", "\n// part X { order C }\n"}
	sep := func() string { return seps[r.Intn(len(seps))] }
	tight := func() string {
		if r.Intn(2) == 0 {
			return ""
		}
		return sep()
	}
	var b strings.Builder
	b.WriteString(l.Kind + sep() + l.Name + sep())
	if l.Doc != "" {
		b.WriteString(fmt.Sprintf("%q", l.Doc) + tight())
	}
	b.WriteString("{" + tight() + "order")
	for _, m := range l.Order {
		b.WriteString(sep() + m.Axis)
		if m.Op != "" {
			b.WriteString(tight() + m.Op + tight() + strings.Repeat("0", r.Intn(2)) + fmt.Sprint(m.Factor))
		}
	}
	if l.Writes != nil {
		b.WriteString(sep() + "writes" + sep() + l.Writes.Name)
	}
	b.WriteString(tight() + "}")
	return b.String()
}

// TestRoundTripRandom is a property test: for random valid files, the
// canonical form parses back to an equal AST, printing is idempotent, random
// formatting does not change the AST, and ParseOrder reads OrderString back.
func TestRoundTripRandom(t *testing.T) {
	for seed := int64(1); seed <= 500; seed++ {
		r := rand.New(rand.NewSource(seed))
		f := randomFile(r)
		require.Empty(t, Check(f), "seed %d", seed)

		text := f.String()
		g, err := Parse("random.kvl", []byte(text))
		require.NoError(t, err, "seed %d:\n%s", seed, text)
		require.Equal(t, noPos(f), noPos(g), "seed %d", seed)
		require.Equal(t, text, g.String(), "seed %d", seed)

		var src strings.Builder
		for _, l := range f.Decls {
			src.WriteString(layoutSource(r, l))
			src.WriteString([]string{"\n", " ", "\n\n// next\n"}[r.Intn(3)])
		}
		h, err := Parse("formatted.kvl", []byte(src.String()))
		require.NoError(t, err, "seed %d:\n%s", seed, src.String())
		require.Equal(t, noPos(f), noPos(h), "seed %d:\n%s", seed, src.String())

		for _, l := range f.Decls {
			o, err := ParseOrder(l.Kind, l.Name, l.OrderString())
			require.NoError(t, err, "seed %d", seed)
			want := layoutNoPos(l)
			want.Doc, want.Writes = "", nil
			require.Equal(t, want, layoutNoPos(o), "seed %d", seed)
		}
	}
}

// TestRandomBreakage breaks one rule of a random valid layout and checks
// that Check notices, with one error, in the printed form too.
func TestRandomBreakage(t *testing.T) {
	for seed := int64(1); seed <= 300; seed++ {
		r := rand.New(rand.NewSource(seed))
		l := randomLayout(r, "X")
		i := r.Intn(len(l.Order))
		m := l.Order[i]
		var want string
		switch r.Intn(3) {
		case 0: // drop a whole axis
			if m.Op != "" {
				continue
			}
			l.Order = append(l.Order[:i:i], l.Order[i+1:]...)
			want = fmt.Sprintf("1:1: layout X is missing axis %s", m.Axis)
			if m.Axis == "S" {
				want = "1:1: pool layout X has no slot axis S"
			}
		case 1: // repeat an axis at the end
			if m.Op != "" {
				continue
			}
			l.Order = append(l.Order, &Mode{Axis: m.Axis})
			want = "axis " + m.Axis + " appears twice in layout X"
		case 2: // misspell an axis
			if m.Op != "" {
				continue
			}
			m.Axis = strings.ToLower(m.Axis)
			want = fmt.Sprintf("unknown axis %q; axes are C, S, T, L, H, D", m.Axis)
		}
		src := (&File{Decls: []*Decl{l}}).String()
		_, err := Parse("", []byte(src))
		require.Error(t, err, "seed %d: %s", seed, src)
		list := err.(ErrorList)
		if strings.HasPrefix(want, "unknown") {
			// Misspelling an axis also makes it missing.
			require.Len(t, list, 2, "seed %d: %s", seed, src)
		} else {
			require.Len(t, list, 1, "seed %d: %s", seed, src)
		}
		require.Contains(t, err.Error(), want, "seed %d: %s", seed, src)
	}
}
