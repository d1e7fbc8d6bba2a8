package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/redisstore"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// writerEnv, set to "url key", makes the test binary a writer process (see
// TestMain) instead of running tests.
const writerEnv = "REDISSTORE_TEST_WRITER"

func TestMain(m *testing.M) {
	if v := os.Getenv(writerEnv); v != "" {
		os.Exit(runWriter(v))
	}
	os.Exit(m.Run())
}

// layoutA is the killed writer's layout: two parts of 1000 bytes.
func layoutA(key string, part int) store.PartWrite {
	d := [][]byte{storetest.Pattern(fmt.Sprintf("A/%s/%d", key, part), 1000)}
	return store.PartWrite{Key: key, Part: part, Parts: 2, Manifest: "kv/d/manifests/a", Data: d}
}

// layoutB is the other writer's: three parts of 700 bytes.
func layoutB(key string, part int) store.PartWrite {
	d := [][]byte{storetest.Pattern(fmt.Sprintf("B/%s/%d", key, part), 700)}
	return store.PartWrite{Key: key, Part: part, Parts: 3, Manifest: "kv/d/manifests/b", Data: d}
}

// runWriter writes part 0 of key in layout A, says "written" and waits
// for its stdin to close (or to be killed).
func runWriter(v string) int {
	url, key, _ := strings.Cut(v, " ")
	s, err := store.Open(context.Background(), url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.WriteParts(context.Background(), []store.PartWrite{layoutA(key, 0)})[0]; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("written")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestLeaseKilledWriter: a writer process writes 1 of the 2 parts of a
// page and is killed (SIGKILL). A writer of another layout is refused
// with a lease of an hour, and takes the page over with a lease of 50 ms
// once 100 ms have passed: A's part is gone, and the page reads complete
// with B's bytes. Before the lease, B was refused forever (without a
// TTL).
func TestLeaseKilledWriter(t *testing.T) {
	srv := redistest.StartServer(t)
	testLeaseKilledWriter(t, srv.URL(), single(srv, 0))
}

func TestLeaseKilledWriterCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	testLeaseKilledWriter(t, c.URL(), cluster(c))
}

func testLeaseKilledWriter(t *testing.T, url string, do raw) {
	ctx := context.Background()
	const key = "lease_page"
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), writerEnv+"="+url+" "+key)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "writer: %s", stderr.String())
	require.Equal(t, "written\n", line)
	require.NoError(t, cmd.Process.Kill())
	require.EqualError(t, cmd.Wait(), "signal: killed")

	meta, prefix, _ := redisstore.PageKeys(key)
	require.Equal(t, int64(1), do(t, meta, "EXISTS", prefix+"0"))

	// The claim is fresh for a lease of an hour.
	long := open(t, withOption(url, "lease=1h"))
	defer long.Close()
	require.Equal(t, []error{store.ErrLayoutConflict}, long.WriteParts(ctx, []store.PartWrite{layoutB(key, 1)}))
	require.Equal(t, []store.Object{{}}, queryAll(t, long, key))

	// Not for one of 50 ms, 100 ms later (by any clock, whatever the load).
	time.Sleep(100 * time.Millisecond)
	short := open(t, withOption(url, "lease=50ms"))
	defer short.Close()
	require.Equal(t, []error{nil}, short.WriteParts(ctx, []store.PartWrite{layoutB(key, 1)}))
	require.Equal(t, int64(0), do(t, meta, "EXISTS", prefix+"0"), "A's part is dropped")
	require.Equal(t, []store.Object{{}}, queryAll(t, short, key))
	require.Equal(t, []error{nil, nil}, short.WriteParts(ctx, []store.PartWrite{layoutB(key, 0), layoutB(key, 2)}))

	want := store.Object{Complete: true, Manifest: "kv/d/manifests/b", PartSizes: []int{700, 700, 700}}
	var rs []store.Range
	for p := range 3 {
		rs = append(rs, store.Range{Key: key, Part: p, Dst: [][]byte{make([]byte, 700)}, Manifest: "kv/d/manifests/b"})
	}
	require.Equal(t, []store.Object{want}, queryAll(t, long, key))
	n, err := long.ReadRanges(ctx, rs)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for p, r := range rs {
		require.Equal(t, layoutB(key, p).Data[0], r.Dst[0], "part %d", p)
	}
	// A complete page is never taken over.
	require.Equal(t, []error{store.ErrComplete}, short.WriteParts(ctx, []store.PartWrite{layoutA(key, 1)}))
}
