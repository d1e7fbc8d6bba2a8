package main

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/testkit/kerneltest"
)

// randomKVL returns a .kvl file of random layouts: parts and pools with
// the axes in any order, T and D split by factors drawn per layout from
// 2, 3, 4, 6 and 8, so that its pairs join equal, nested and non-nesting
// splits.
func randomKVL(r *rand.Rand, parts, pools int) string {
	fs := []int{2, 3, 4, 6, 8}
	var b strings.Builder
	seen := map[string]bool{}
	for i := 0; i < parts+pools; {
		kind := ir.Part
		if i >= parts {
			kind = ir.Pool
		}
		order := kerneltest.RandomOrder(r, kind, map[string]int{"T": fs[r.IntN(len(fs))], "D": fs[r.IntN(len(fs))]})
		if seen[order] {
			continue
		}
		seen[order] = true
		fmt.Fprintf(&b, "%s l%d { order %s }\n", kind, i, order)
		i++
	}
	return b.String()
}

// adversarial declares layouts whose names collided in the kernels'
// function names (x_to with y and x with to_y), or name things of the
// generated file: its import, its parameters and locals, Go's keywords
// and predeclared identifiers as parts of names.
const adversarial = `part x_to { order C T L H D }
part y { order C L T H D }
part x { order C H T L D }
pool to_y { order C S T L H D }
part _ { order L C T H D }
part kernel { order L H C T D }
part init { order C L H D/4 T D%4 }
pool p { order S L C T H D }
part runs { order H C L T D }
part range_ { order C T/2 L H T%2 D }
part copy_ { order T C L H D }
part func { order D C T L H }
pool len { order C L T S H D }
`

// TestGeneratedCompiles runs kvlc on random layouts and on adversarial
// names in a module outside this one, builds and vets the output with the
// go command, and runs every generated kernel of the random layouts against
// the element-by-element model (kernelcheck.CheckGenerated): the same bytes
// as the interpreter, the same runs, as few as the model allows.
func TestGeneratedCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with the go command")
	}
	mod, goRun := newModule(t)
	r := rand.New(rand.NewPCG(19, 23))
	random := randomKVL(r, 6, 3)
	for pkg, text := range map[string]string{"random": random, "names": adversarial} {
		dir := filepath.Join(mod, pkg)
		in := writeFile(t, filepath.Join(dir, pkg+".kvl"), text)
		writeFile(t, filepath.Join(dir, "doc.go"), "// Package "+pkg+" holds generated kernels.\npackage "+pkg+"\n")
		code, stdout, stderr := kvlc(t, "-pkg", pkg, in)
		require.Equal(t, 0, code, stderr)
		require.Empty(t, stdout+stderr)
	}
	writeFile(t, filepath.Join(mod, "random", "random_test.go"), `package random_test

import (
	"os"
	"testing"

	"github.com/kvreshard/kvreshard/compiler"
	"github.com/kvreshard/kvreshard/testkit/kernelcheck"

	_ "example.com/framework/random"
)

func TestKernels(t *testing.T) {
	src, err := os.ReadFile("random.kvl")
	if err != nil {
		t.Fatal(err)
	}
	f, err := compiler.Compile("random.kvl", src)
	if err != nil {
		t.Fatal(err)
	}
	kernelcheck.CheckGenerated(t, f, 8)
}
`)
	goRun(mod, "vet", "./...")
	out := goRun(mod, "test", "-count=1", "-v", "-run", "TestKernels", "./random")
	// Every pair ran: 6 parts with 9 layouts, 3 pools with 6 parts.
	require.Equal(t, 6*9+3*6, strings.Count(out, "--- PASS: TestKernels/"), out)
}
