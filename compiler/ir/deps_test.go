package ir_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServingLinksNoFrontEnd: what a serving process links (the example
// of examples/serving, and the C library that Python and C++ serving
// processes load) holds the IR, but not the .kvl front end (dsl, compiler,
// participle), the generator (gen, jennifer), nor any test package
// (testing, testify, kernelcheck).
func TestServingLinksNoFrontEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	for _, pkg := range []string{"./examples/serving", "./cmd/libkvreshard"} {
		t.Run(pkg, func(t *testing.T) { linksNoFrontEnd(t, pkg) })
	}
}

func linksNoFrontEnd(t *testing.T, pkg string) {
	cmd := exec.Command("go", "list", "-deps", pkg)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/kvreshard/kvreshard/compiler/ir")
	banned := []string{
		"github.com/alecthomas/participle/", "github.com/dave/jennifer/", "github.com/stretchr/testify/",
		"github.com/kvreshard/kvreshard/dsl", "github.com/kvreshard/kvreshard/compiler",
		"github.com/kvreshard/kvreshard/gen", "github.com/kvreshard/kvreshard/runtime/kernel/kernelcheck",
		"testing",
	}
	for _, d := range deps {
		for _, b := range banned {
			if d == b || strings.HasPrefix(d, strings.TrimSuffix(b, "/")+"/") && d != "github.com/kvreshard/kvreshard/compiler/ir" {
				t.Errorf("%s links %s", pkg, d)
			}
		}
	}
}
