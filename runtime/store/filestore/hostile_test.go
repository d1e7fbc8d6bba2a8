package filestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// twoParts is the layout the tests below write: parts of 10 and 20 bytes.
func twoParts(key, manifest string, part int) store.PartWrite {
	data := [][]byte{[]byte(strings.Repeat(string(rune('a'+part)), 10*(part+1)))}
	return store.PartWrite{Key: key, Part: part, Parts: 2, Manifest: manifest, Data: data}
}

func twoPartsObject(manifest string) store.Object {
	return store.Object{Complete: true, Manifest: manifest, PartSizes: []int{10, 20}}
}

func writeBoth(t *testing.T, s *Store, key, manifest string) {
	t.Helper()
	require.Equal(t, []error{nil, nil}, s.WriteParts(context.Background(), []store.PartWrite{twoParts(key, manifest, 0), twoParts(key, manifest, 1)}))
}

// claimOf reads and parses key's claim.
func claimOf(t *testing.T, s *Store, key string) *claim {
	t.Helper()
	path := filepath.Join(s.objectDir(key), "claim")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	c, err := parseClaim(path, b)
	require.NoError(t, err)
	return c
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	require.NoError(t, os.RemoveAll(path))
	require.NoError(t, unix.Mkfifo(path, 0o666))
}

// TestCorruptObject damages one object in every way a file can be damaged:
// Query reports it in that object's Err, naming the file, and answers for
// the others; a read of it fails with the same words; nothing hangs on a
// FIFO and nothing allocates what a count says.
func TestCorruptObject(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		corrupt func(t *testing.T, dir string, c *claim) // dir: the object's directory
		want    string                                   // {dir} and {gen} are replaced
	}{
		{"garbage claim", func(t *testing.T, dir string, _ *claim) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("garbage"), 0o666))
		}, "corrupt file {dir}/claim: no newline"},
		{"huge part count", func(t *testing.T, dir string, c *claim) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("999999999999 "+c.gen+"\nm"), 0o666))
		}, "corrupt file {dir}/claim: part count 999999999999 is out of range [1,65536]"},
		{"part count past int64", func(t *testing.T, dir string, c *claim) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("99999999999999999999 "+c.gen+"\nm"), 0o666))
		}, `corrupt file {dir}/claim: part count "99999999999999999999" is not a number`},
		{"zero parts", func(t *testing.T, dir string, c *claim) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("0 "+c.gen+"\nm"), 0o666))
		}, "corrupt file {dir}/claim: part count 0 is out of range [1,65536]"},
		{"bad generation", func(t *testing.T, dir string, _ *claim) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("2 ../../x\nm"), 0o666))
		}, `corrupt file {dir}/claim: generation "../../x" is not 16 hex digits`},
		{"claim without a generation", func(t *testing.T, dir string, _ *claim) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("2\nm"), 0o666))
		}, `corrupt file {dir}/claim: first line "2" is not a part count and a generation`},
		{"empty manifest", func(t *testing.T, dir string, c *claim) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("2 "+c.gen+"\n"), 0o666))
		}, "corrupt file {dir}/claim: empty manifest key"},
		{"huge claim", func(t *testing.T, dir string, _ *claim) {
			require.NoError(t, os.Truncate(filepath.Join(dir, "claim"), 1<<40))
		}, "{dir}/claim is 1099511627776 bytes; the limit is 4160"},
		{"claim is a directory", func(t *testing.T, dir string, _ *claim) {
			require.NoError(t, os.Remove(filepath.Join(dir, "claim")))
			require.NoError(t, os.Mkdir(filepath.Join(dir, "claim"), 0o777))
		}, "{dir}/claim is a directory, not a regular file"},
		{"claim is a FIFO", func(t *testing.T, dir string, _ *claim) {
			mkfifo(t, filepath.Join(dir, "claim"))
		}, "{dir}/claim is a FIFO, not a regular file"},
		{"claim is a symbolic link", func(t *testing.T, dir string, _ *claim) {
			path := filepath.Join(dir, "claim")
			require.NoError(t, os.Rename(path, path+".real"))
			require.NoError(t, os.Symlink(path+".real", path))
		}, "{dir}/claim is a symbolic link, not a regular file"},
		{"object directory is a file", func(t *testing.T, dir string, _ *claim) {
			require.NoError(t, os.RemoveAll(dir))
			require.NoError(t, os.WriteFile(dir, nil, 0o666))
		}, "open {dir}/claim: not a directory"},
		{"part is a FIFO", func(t *testing.T, dir string, c *claim) {
			mkfifo(t, partPath(dir, c.gen, 1))
		}, "{dir}/part-{gen}-1 is a FIFO, not a regular file"},
		{"part is a directory", func(t *testing.T, dir string, c *claim) {
			require.NoError(t, os.Remove(partPath(dir, c.gen, 0)))
			require.NoError(t, os.Mkdir(partPath(dir, c.gen, 0), 0o777))
		}, "{dir}/part-{gen}-0 is a directory, not a regular file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(t.TempDir(), Options{})
			require.NoError(t, err)
			defer s.Close()
			for _, k := range []string{"good1", "bad", "good2"} {
				writeBoth(t, s, k, "m")
			}
			dir := s.objectDir("bad")
			cl := claimOf(t, s, "bad")
			c.corrupt(t, dir, cl)
			want := strings.NewReplacer("{dir}", dir, "{gen}", cl.gen).Replace(c.want)

			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			objs, err := s.Query(ctx, []string{"good1", "bad", "good2"})
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			require.NoError(t, err)
			require.Len(t, objs, 3)
			require.Equal(t, twoPartsObject("m"), objs[0])
			require.Equal(t, twoPartsObject("m"), objs[2])
			require.EqualError(t, objs[1].Err, "query bad: "+want)
			require.Equal(t, store.Object{Err: objs[1].Err}, objs[1])
			require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "Query allocated what a file says")

			n, err := s.ReadRanges(ctx, []store.Range{
				{Key: "good1", Part: 1, Dst: [][]byte{make([]byte, 20)}},
				{Key: "bad", Part: 0, Dst: [][]byte{make([]byte, 10)}},
			})
			require.Equal(t, 1, n)
			require.EqualError(t, err, "read bad part 0 [0,10): "+want)

			// Writes to the object fail or are refused; they never hang.
			errs := s.WriteParts(ctx, []store.PartWrite{twoParts("bad", "other", 0), twoParts("new", "m", 0)})
			require.Error(t, errs[0])
			require.NoError(t, errs[1])
		})
	}
}

// TestCorruptWrites: writes to an object whose claim cannot be read give
// the reason, naming the file.
func TestCorruptWrites(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer s.Close()
	dir := s.objectDir("k")
	require.NoError(t, os.MkdirAll(dir, 0o777))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "claim"), []byte("x"), 0o666))
	require.Equal(t, []string{"write k part 0: corrupt file " + dir + "/claim: no newline"}, errStrings(s.WriteParts(ctx, []store.PartWrite{twoParts("k", "m", 0)})))
	mkfifo(t, filepath.Join(dir, "claim"))
	require.Equal(t, []string{"write k part 0: " + dir + "/claim is a FIFO, not a regular file"}, errStrings(s.WriteParts(ctx, []store.PartWrite{twoParts("k", "m", 0)})))
	require.NoError(t, os.Remove(filepath.Join(dir, "claim")))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "claim"), 0o777))
	require.Equal(t, []string{"write k part 0: " + dir + "/claim is a directory, not a regular file"}, errStrings(s.WriteParts(ctx, []store.PartWrite{twoParts("k", "m", 0)})))
	require.NoError(t, os.Remove(filepath.Join(dir, "claim")))
	// The lock file is opened by a writer taking the object over.
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "m", 0)}))
	age(t, s, "k", store.DefaultLease+time.Second)
	mkfifo(t, filepath.Join(dir, "lock"))
	require.Equal(t, []string{"write k part 0: " + dir + "/lock is a FIFO, not a regular file"}, errStrings(s.WriteParts(ctx, []store.PartWrite{twoParts("k", "other", 0)})))

	long := store.PartWrite{Key: "k2", Part: 0, Parts: 1, Manifest: strings.Repeat("m", maxManifestKey+1), Data: [][]byte{{1}}}
	require.Equal(t, []string{"write k2 part 0: manifest key is 4097 bytes; the limit is 4096"}, errStrings(s.WriteParts(ctx, []store.PartWrite{long})))
}

func errStrings(errs []error) []string {
	var s []string
	for _, err := range errs {
		if err == nil {
			s = append(s, "<nil>")
		} else {
			s = append(s, err.Error())
		}
	}
	return s
}

// TestMetaBounded: a metadata file past the limit is refused without being
// read whole, and a FIFO in its place does not block.
func TestMetaBounded(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer s.Close()
	path := s.metaPath("kv/m")
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o777))
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(200<<20)) // sparse: 200 MB that take no disk
	require.NoError(t, f.Close())

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = s.GetMeta(ctx, "kv/m")
	runtime.ReadMemStats(&after)
	require.EqualError(t, err, "get metadata kv/m: "+path+" is 209715200 bytes; the limit is 1048576")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20))
	require.EqualError(t, s.PutMeta(ctx, "kv/m", []byte("x")), "put metadata kv/m: "+path+" is 209715200 bytes; the limit is 1048576")

	mkfifo(t, path)
	_, err = s.GetMeta(ctx, "kv/m")
	require.EqualError(t, err, "get metadata kv/m: "+path+" is a FIFO, not a regular file")
	require.EqualError(t, s.PutMeta(ctx, "kv/m", []byte("x")), "put metadata kv/m: "+path+" is a FIFO, not a regular file")

	// At the limit is fine.
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, make([]byte, store.MaxMetaBytes), 0o666))
	b, err := s.GetMeta(ctx, "kv/m")
	require.NoError(t, err)
	require.Len(t, b, store.MaxMetaBytes)
}

// clock is a clock that tests move.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }

func newClock() *clock { return &clock{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

// leaseStore opens a store in a temporary directory with a lease of a
// minute on a clock the test moves and a lock wait of 100ms, closed when the
// test ends.
func leaseStore(t *testing.T) (*Store, *clock) {
	t.Helper()
	clk := newClock()
	s, err := Open(t.TempDir(), Options{Lease: time.Minute, LockWait: 100 * time.Millisecond, now: clk.now})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, clk
}

func query(t *testing.T, s *Store, keys ...string) []store.Object {
	t.Helper()
	objs, err := s.Query(context.Background(), keys)
	require.NoError(t, err)
	return objs
}

// TestLeaseClock drives the lease with a clock the test moves: a takeover
// happens only past the lease, replaces the claim with one of a new
// generation, and removes the old generation's parts.
func TestLeaseClock(t *testing.T) {
	ctx := context.Background()
	s, clk := leaseStore(t)
	dir := s.objectDir("k")
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	old := claimOf(t, s, "k")
	fi, err := os.Stat(filepath.Join(dir, "claim"))
	require.NoError(t, err)
	require.True(t, clk.t.Equal(fi.ModTime()), "the claim's time %v is not the store's clock", fi.ModTime())

	clk.add(time.Minute)
	require.Equal(t, []error{store.ErrLayoutConflict}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "b", 1)}), "at the lease, not past it")
	clk.add(time.Nanosecond)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "b", 1)}))
	c := claimOf(t, s, "k")
	require.Equal(t, claim{2, c.gen, "b"}, *c)
	require.NotEqual(t, old.gen, c.gen)
	require.NoFileExists(t, partPath(dir, old.gen, 0))
	require.FileExists(t, partPath(dir, c.gen, 1))

	// A part of the old claim that appears now (a writer of it stopped
	// since before the takeover, that removes it itself when it finds its
	// claim replaced, or was killed before it could) adds nothing to the new
	// object, and the next write removes it.
	require.NoError(t, os.WriteFile(partPath(dir, old.gen, 0), make([]byte, 18), 0o666))
	require.Equal(t, []store.Object{{}}, query(t, s, "k"))
	require.Equal(t, []error{store.ErrLayoutConflict}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 1)}))
	require.NoFileExists(t, partPath(dir, old.gen, 0))
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "b", 0)}))
	require.Equal(t, []store.Object{twoPartsObject("b")}, query(t, s, "k"))

	// A complete object is never taken over.
	clk.add(1000 * time.Hour)
	require.Equal(t, []error{store.ErrComplete}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	s.forget("k")
	require.Equal(t, []error{store.ErrComplete}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	require.Equal(t, []store.Object{twoPartsObject("b")}, query(t, s, "k"))
}

// TestLeaseCorruptClaim: a garbage claim is taken over once the lease has
// passed, by a writer of any layout.
func TestLeaseCorruptClaim(t *testing.T) {
	ctx := context.Background()
	s, clk := leaseStore(t)
	dir := s.objectDir("k")
	require.NoError(t, os.MkdirAll(dir, 0o777))
	path := filepath.Join(dir, "claim")
	require.NoError(t, os.WriteFile(path, []byte("999999999999 0000000000000000\nm"), 0o666))
	require.NoError(t, os.Chtimes(path, clk.t, clk.t))
	require.NoError(t, os.WriteFile(partPath(dir, "0000000000000000", 0), make([]byte, 18), 0o666))
	want := "write k part 0: corrupt file " + path + ": part count 999999999999 is out of range [1,65536]"
	require.Equal(t, []string{want}, errStrings(s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)})))
	clk.add(time.Minute + 1)
	require.Equal(t, []error{nil, nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0), twoParts("k", "a", 1)}))
	require.Equal(t, []store.Object{twoPartsObject("a")}, query(t, s, "k"))
	require.NoFileExists(t, partPath(dir, "0000000000000000", 0))
}

// holdClaim opens key's claim file and locks it with flock operation how,
// as another writer would (flock locks belong to open files, not to
// processes), until the test ends or the returned func is called.
func holdClaim(t *testing.T, s *Store, key string, how int) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(s.objectDir(key), "claim"), os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Flock(int(f.Fd()), how|unix.LOCK_NB))
	var once sync.Once
	release := func() { once.Do(func() { f.Close() }) }
	t.Cleanup(release)
	return release
}

// TestLeaseLockHeld: a writer that holds the claim's lock shared, as one in
// the middle of a part does, shares it with the writers of its layout, and
// holds up a writer of another layout past the lease only for the lock
// wait: it is not writing (a writer that writes refreshes its claim), and
// the object is taken over without the lock. The holder's claim is not
// the new one's: its lock holds up nobody.
func TestLeaseLockHeld(t *testing.T) {
	ctx := context.Background()
	s, clk := leaseStore(t)
	dir := s.objectDir("k")
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	old := claimOf(t, s, "k")
	release := holdClaim(t, s, "k", unix.LOCK_SH)
	// A writer of the same layout shares the lock (a retry of a written
	// part writes nothing and succeeds).
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	clk.add(time.Minute)
	require.Equal(t, []error{store.ErrLayoutConflict}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "b", 0)}), "at the lease")
	clk.add(time.Nanosecond)
	require.Equal(t, []error{nil, nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "b", 0), twoParts("k", "b", 1)}))
	require.Equal(t, []store.Object{twoPartsObject("b")}, query(t, s, "k"))
	require.NoFileExists(t, partPath(dir, old.gen, 0))
	release()
}

// TestLeaseLockHeldExclusive: while another holds the claim's lock
// exclusively (a writer stopped in the moment it does), a writer of the
// claim's layout waits the lock wait and fails that part, naming the lock;
// the other writes of the batch go on.
func TestLeaseLockHeldExclusive(t *testing.T) {
	ctx := context.Background()
	s, _ := leaseStore(t)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	release := holdClaim(t, s, "k", unix.LOCK_EX)
	path := filepath.Join(s.objectDir("k"), "claim")
	errs := s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 1), twoParts("k2", "a", 0), twoParts("k2", "a", 1)})
	require.Equal(t, []string{"write k part 1: lock " + path + " is held by another writer; the batch's lock wait (100ms) is spent", "<nil>", "<nil>"}, errStrings(errs))
	require.Equal(t, []store.Object{{}, twoPartsObject("a")}, query(t, s, "k", "k2"))
	release()
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 1)}))
	require.Equal(t, []store.Object{twoPartsObject("a")}, query(t, s, "k"))
}

// TestClaimRefreshedWhileWriting: a writer refreshes its claim when it
// begins a part and while it writes it, so that a slow writer, however
// long its part takes, is never taken over while it writes.
func TestClaimRefreshedWhileWriting(t *testing.T) {
	ctx := context.Background()
	s, clk := leaseStore(t)
	other, err := Open(s.Dir(), Options{Lease: time.Minute, LockWait: time.Hour, now: clk.now})
	require.NoError(t, err)
	defer other.Close()
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	start := clk.t.Add(50 * time.Second)
	clk.t = start
	claimTime := func() time.Time {
		fi, err := os.Stat(filepath.Join(s.objectDir("k"), "claim"))
		require.NoError(t, err)
		return fi.ModTime()
	}
	var times []time.Duration
	s.onFragment = func(part, fragment int) {
		times = append(times, claimTime().Sub(start))
		// Each fragment takes 20s; the lease is a minute.
		require.Equal(t, []error{store.ErrLayoutConflict}, other.WriteParts(ctx, []store.PartWrite{twoParts("k", "b", 0)}), "fragment %d", fragment)
		clk.add(20 * time.Second)
	}
	w := twoParts("k", "a", 1)
	w.Data = [][]byte{w.Data[0][:4], w.Data[0][4:8], w.Data[0][8:12], w.Data[0][12:16], w.Data[0][16:]}
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{w}))
	s.onFragment = nil
	// Begun at start, refreshed after every fragment but the first (15s,
	// a quarter of the lease, had not passed), and when linked.
	require.Equal(t, []time.Duration{0, 20 * time.Second, 40 * time.Second, 60 * time.Second}, times)
	require.True(t, claimTime().Equal(start.Add(80*time.Second)))
	require.Equal(t, []store.Object{twoPartsObject("a")}, query(t, s, "k"))
}

// TestStaleTemps: a write to an object that no other writer is writing
// removes its temporary files older than the lease, and only those.
func TestStaleTemps(t *testing.T) {
	ctx := context.Background()
	s, clk := leaseStore(t)
	dir := s.objectDir("k")
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	old, edge, fresh := filepath.Join(dir, ".tmp-0123456789abcdef"), filepath.Join(dir, ".tmp-edge"), filepath.Join(dir, ".tmp-fresh")
	for _, f := range []struct {
		path string
		age  time.Duration
	}{{old, time.Minute + time.Second}, {edge, time.Minute}, {fresh, 0}} {
		require.NoError(t, os.WriteFile(f.path, []byte("killed writer"), 0o666))
		require.NoError(t, os.Chtimes(f.path, clk.t.Add(-f.age), clk.t.Add(-f.age)))
	}
	other := filepath.Join(s.objectDir("other"), ".tmp-0123456789abcdef")
	require.NoError(t, os.MkdirAll(filepath.Dir(other), 0o777))
	require.NoError(t, os.WriteFile(other, nil, 0o666))
	require.NoError(t, os.Chtimes(other, clk.t.Add(-time.Hour), clk.t.Add(-time.Hour)))

	// While another writer holds the claim's lock, its temporaries may be
	// its own: none is removed.
	release := holdClaim(t, s, "k", unix.LOCK_SH)
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 0)}))
	require.FileExists(t, old)
	release()

	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{twoParts("k", "a", 1)}))
	require.NoFileExists(t, old)
	require.FileExists(t, edge)
	require.FileExists(t, fresh)
	require.FileExists(t, other, "another object's temporaries wait for a write to it")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	gen := claimOf(t, s, "k").gen
	require.ElementsMatch(t, []string{".tmp-edge", ".tmp-fresh", "claim", "part-" + gen + "-0", "part-" + gen + "-1"}, names)
}

// TestMaxOpenFilesDefault: the default bound on cached part files follows
// the open-file limit.
func TestMaxOpenFilesDefault(t *testing.T) {
	var rl syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl))
	s, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, max(min(256, int(rl.Cur/4)), 1), s.maxFiles, fmt.Sprintf("soft limit %d", rl.Cur))
	s2, err := Open(t.TempDir(), Options{MaxOpenFiles: 3})
	require.NoError(t, err)
	defer s2.Close()
	require.Equal(t, 3, s2.maxFiles)
}

// TestTakeoverRace races writers of two layouts, each with its own store on
// one directory, with a lease of 1ns: objects are taken over again and
// again, and yet every object that ends complete holds one layout's bytes,
// never a mix, and every other object is completed by a last writer.
func TestTakeoverRace(t *testing.T) {
	dir := t.TempDir()
	layouts := map[string][]int{"kv/d/manifests/a": {300, 500}, "kv/d/manifests/b": {200, 200, 400}}
	ks := raceKeys("page", 40)
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 8 {
		m := "kv/d/manifests/a"
		if g%2 == 1 {
			m = "kv/d/manifests/b"
		}
		s, err := Open(dir, Options{Lease: time.Nanosecond})
		require.NoError(t, err)
		defer s.Close()
		wg.Go(func() { errc <- storetest.RaceWrite(s, m, layouts[m], ks, uint64(g)) })
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	s, err := Open(dir, Options{Lease: time.Hour})
	require.NoError(t, err)
	defer s.Close()
	objs := query(t, s, ks...)
	complete := 0
	for i, o := range objs {
		require.NoError(t, o.Err)
		if o.Complete {
			complete++
			continue
		}
		// Finish it with the layout of its claim.
		c := claimOf(t, s, ks[i])
		require.NoError(t, storetest.RaceWrite(s, c.manifest, layouts[c.manifest], ks[i:i+1], 0))
	}
	t.Logf("%d of %d keys complete after the race", complete, len(ks))
	storetest.CheckRaced(t, s, ks, layouts)
}

// TestRemoveStaleOnlyUnderTheCurrentClaim: a cleaner that holds the lock
// of a claim that was replaced since it opened it removes nothing, since
// the current claim's writers may be writing temporary files it cannot
// see held; under the current claim it removes temporary files older than
// the lease and other generations' parts. (With a lease of 1ns,
// TestTakeoverRace failed about one run in seven before: a link of a part
// whose temporary file a cleaner of an old claim had removed.)
func TestRemoveStaleOnlyUnderTheCurrentClaim(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(t.TempDir(), Options{Lease: time.Nanosecond})
	require.NoError(t, err)
	defer s.Close()
	claimPath := filepath.Join(dir, "claim")
	write := func(name, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	write("claim", string((&claim{parts: 1, gen: "aaaaaaaaaaaaaaaa", manifest: "m"}).bytes()))
	old, err := s.openClaim(claimPath)
	require.NoError(t, err)
	defer old.close()
	// The claim is replaced (a takeover), and a writer of the new one is
	// writing its part.
	write("claim.new", string((&claim{parts: 1, gen: "bbbbbbbbbbbbbbbb", manifest: "m"}).bytes()))
	require.NoError(t, os.Rename(filepath.Join(dir, "claim.new"), claimPath))
	write(".tmp-0123456789abcdef", "being written")
	write("part-aaaaaaaaaaaaaaaa-0", "old generation")
	hour := time.Now().Add(-time.Hour) // older than the lease
	require.NoError(t, os.Chtimes(filepath.Join(dir, ".tmp-0123456789abcdef"), hour, hour))
	s.removeStale(dir, old)
	require.ElementsMatch(t, []string{"claim", ".tmp-0123456789abcdef", "part-aaaaaaaaaaaaaaaa-0"}, readDirNames(dir))
	cur, err := s.openClaim(claimPath)
	require.NoError(t, err)
	defer cur.close()
	s.removeStale(dir, cur)
	require.Equal(t, []string{"claim"}, readDirNames(dir))
}
