package tests

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/kvreshard/kvreshard"

// TestServingLinksNoFrontEnd: what a serving process links (the example
// of examples/serving, and the C library that Python and C++ serving
// processes load) holds the IR, but not the .kvl front end (dsl, compiler,
// participle), the generator (gen, jennifer), any test package (testing,
// testify, the test kits), the benchmark suite, nor the launchers of
// redis-server.
func TestServingLinksNoFrontEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	banned := []string{
		"github.com/alecthomas/participle/", "github.com/dave/jennifer/", "github.com/stretchr/testify/",
		module + "/dsl", module + "/compiler", module + "/gen", module + "/testkit", module + "/internal/redisserver",
		module + "/internal/redistest", module + "/cmd/kvreshard/internal/bench", "testing",
	}
	for _, pkg := range []string{"./examples/serving", "./cmd/libkvreshard"} {
		t.Run(pkg, func(t *testing.T) {
			deps := listDeps(t, pkg)
			require.Contains(t, deps, module+"/compiler/ir")
			for _, d := range bannedDeps(deps, banned, module+"/compiler/ir") {
				t.Errorf("%s links %s", pkg, d)
			}
		})
	}
}

// TestCommandLinksNoTestPackages: the kvreshard command links the .kvl
// front end (for --kvl) and starts the Redis servers of `kvreshard bench`
// with redisserver, but links no test package: not testing, testify,
// redistest nor the test kits but kerneltest, the element-by-element model
// that is the plan figures' baseline (it links no test package itself).
func TestCommandLinksNoTestPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	deps := listDeps(t, "./cmd/kvreshard")
	require.Contains(t, deps, module+"/internal/redisserver")
	require.Contains(t, deps, module+"/dsl")
	banned := []string{
		"testing", "github.com/stretchr/testify/", module + "/internal/redistest",
		module + "/testkit",
	}
	for _, d := range bannedDeps(deps, banned, module+"/testkit/kerneltest") {
		t.Errorf("./cmd/kvreshard links %s", d)
	}
}

// TestBannedDeps: a banned path bans the package and the packages under
// it, not packages that merely share its prefix, and not the exceptions.
func TestBannedDeps(t *testing.T) {
	deps := []string{
		"testing", "testing/iotest", "github.com/x/testing", "testingx",
		module + "/compiler", module + "/compiler/ir", module + "/compiler/lower", module + "/compilerx",
		"github.com/stretchr/testify/require", "github.com/stretchr/testify",
	}
	require.Equal(t, []string{"testing", "testing/iotest", module + "/compiler", module + "/compiler/lower",
		"github.com/stretchr/testify/require", "github.com/stretchr/testify"},
		bannedDeps(deps, []string{"testing", module + "/compiler", "github.com/stretchr/testify/"}, module+"/compiler/ir"))
	require.Empty(t, bannedDeps(deps, []string{"github.com/other/"}))
}

// listDeps returns the packages that pkg (a directory of the module)
// links, from go list -deps.
func listDeps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", pkg)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.Fields(string(out))
}

// bannedDeps returns the packages of deps that are a banned path or under
// one, except those in allowed, in the order of deps.
func bannedDeps(deps, banned []string, allowed ...string) []string {
	var found []string
	for _, d := range deps {
		for _, b := range banned {
			b = strings.TrimSuffix(b, "/")
			if (d == b || strings.HasPrefix(d, b+"/")) && !slices.Contains(allowed, d) {
				found = append(found, d)
				break
			}
		}
	}
	return found
}
