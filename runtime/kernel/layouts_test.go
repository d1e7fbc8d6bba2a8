package kernel_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/kernel"
)

// layoutName names a test's layouts apart from an earlier run's (go test
// -count=N): the registry is global.
func layoutName(t *testing.T, base string) string {
	return fmt.Sprintf("%s_%d", base, registerRuns.Add(1))
}

func TestRegisterLayout(t *testing.T) {
	part := layoutName(t, "regpart")
	pool := layoutName(t, "regpool")
	l, err := kernel.RegisterLayout(kernel.LayoutDecl{Kind: "part", Name: part, Order: "C L H D/8 T D%8", Origin: "a.kvl:1:1"})
	require.NoError(t, err)
	require.Equal(t, "part(C L H D/8 T D%8)", l.Identity())
	require.Equal(t, "a.kvl:1:1", l.Pos)

	// The same declaration again is the layout registered first.
	again, err := kernel.RegisterLayout(kernel.LayoutDecl{Kind: "part", Name: part, Order: "C  L H D/8 T D%8", Origin: "b.kvl:2:1"})
	require.NoError(t, err)
	require.Same(t, l, again)

	// Another order under the name is refused, naming both.
	_, err = kernel.RegisterLayout(kernel.LayoutDecl{Kind: "part", Name: part, Order: "C T L H D", Origin: "b.kvl:2:1"})
	require.EqualError(t, err, fmt.Sprintf(`layout %q is already part(C L H D/8 T D%%8) (a.kvl:1:1); b.kvl:2:1 declares it part(C T L H D)`, part))

	p, err := kernel.RegisterLayout(kernel.LayoutDecl{Kind: "pool", Name: pool, Order: "S C L H D/8 T D%8", Writes: part})
	require.NoError(t, err)
	got, err := kernel.LayoutNamed(pool)
	require.NoError(t, err)
	require.Same(t, p, got)
	dp, err := kernel.DefaultPart(p)
	require.NoError(t, err)
	require.Same(t, l, dp)
	require.Same(t, p, kernel.PoolWriting(l))
	require.Contains(t, kernel.LayoutsOf(ir.Pool), pool)
	require.NotContains(t, kernel.LayoutsOf(ir.Part), pool)
	names := kernel.LayoutNames()
	require.Equal(t, []string{part, pool}, names[len(names)-2:], "registration order")
}

// TestRegisterLayoutErrors: an invalid declaration gets the message of the
// order parser (the rules and words of kvlc), and registers nothing.
func TestRegisterLayoutErrors(t *testing.T) {
	name := layoutName(t, "bad")
	for _, c := range []struct {
		d    kernel.LayoutDecl
		want string
	}{
		{kernel.LayoutDecl{Kind: "part", Name: name, Order: "C T T H D"},
			fmt.Sprintf(`layout %q: order "C T T H D": layout %s is missing axis L; column 5: axis T appears twice in layout %s, first at 1:3`, name, name, name)},
		{kernel.LayoutDecl{Kind: "part", Name: name, Order: "C S T L H D"},
			fmt.Sprintf(`layout %q: order "C S T L H D": column 3: part layout %s has a slot axis S; only pool layouts have one`, name, name)},
		{kernel.LayoutDecl{Kind: "pool", Name: name, Order: ""},
			fmt.Sprintf(`layout %q: order "": order is empty`, name)},
		{kernel.LayoutDecl{Kind: "tile", Name: name, Order: "C T L H D"},
			fmt.Sprintf(`layout %q: order "C T L H D": unknown layout kind "tile"; kinds are part and pool`, name)},
		{kernel.LayoutDecl{Kind: "part", Name: "writes", Order: "C T L H D"},
			`layout "writes": order "C T L H D": invalid layout name "writes"; part, pool, order and writes are keywords`},
		{kernel.LayoutDecl{Kind: "part", Name: name, Order: "C T L H D", Writes: "PLHD"},
			fmt.Sprintf(`layout %q: a part layout writes no part layout (writes "PLHD")`, name)},
	} {
		_, err := kernel.RegisterLayout(c.d)
		require.EqualError(t, err, c.want)
	}
	_, err := kernel.LayoutNamed(name)
	require.ErrorContains(t, err, fmt.Sprintf("unknown layout %q; layouts are ", name))
}

func TestDefaultPartErrors(t *testing.T) {
	pool := layoutName(t, "lonely")
	p, err := kernel.RegisterLayout(kernel.LayoutDecl{Kind: "pool", Name: pool, Order: "C S T L H D"})
	require.NoError(t, err)
	_, err = kernel.DefaultPart(p)
	require.ErrorContains(t, err, fmt.Sprintf("pool layout %s names no part layout to write (writes); name one (", pool))

	orphan := layoutName(t, "orphan")
	p, err = kernel.RegisterLayout(kernel.LayoutDecl{Kind: "pool", Name: orphan, Order: "C S T L H D", Writes: "missing_part"})
	require.NoError(t, err)
	_, err = kernel.DefaultPart(p)
	require.EqualError(t, err, fmt.Sprintf("pool layout %s writes missing_part, which is not registered", orphan))
	require.Nil(t, kernel.PoolWriting(&ir.Layout{Name: "missing"}))
}

// TestRegisterLayoutConcurrent: registrations and lookups from many
// goroutines (a plugin registering while requests are planned) agree.
func TestRegisterLayoutConcurrent(t *testing.T) {
	base := layoutName(t, "conc")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				name := fmt.Sprintf("%s_%d", base, i)
				l, err := kernel.RegisterLayout(kernel.LayoutDecl{Kind: "part", Name: name, Order: "C T L H D"})
				if err != nil {
					t.Error(err)
					return
				}
				if got, err := kernel.LayoutNamed(name); err != nil || got != l {
					t.Errorf("LayoutNamed(%s) = %v, %v", name, got, err)
				}
				_ = kernel.Layouts()
			}
		}()
	}
	wg.Wait()
}

// TestListNames: messages list at most 16 layout names, then how many
// more there are, however many layouts a process registered.
func TestListNames(t *testing.T) {
	require.Equal(t, "", kernel.ListNames(nil))
	require.Equal(t, "a, b", kernel.ListNames([]string{"a", "b"}))
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("n%d", i))
	}
	require.Equal(t, "n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15 and 24 more", kernel.ListNames(names))
	require.Equal(t, kernel.ListNames(names[:16]), strings.Join(names[:16], ", "))
}
