//go:build unix

package filestore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// The tests below run this test binary again as writer processes. The
// helper's arguments travel in environment variables.
const (
	envMode  = "KVRESHARD_FILESTORE_HELPER"
	envDir   = "KVRESHARD_FILESTORE_DIR"
	envArgs  = "KVRESHARD_FILESTORE_ARGS"
	envLease = "KVRESHARD_FILESTORE_LEASE" // the writers' lease; empty: the default
)

// TestHelperProcess is a writer process, not a test.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envMode)
	if mode == "" {
		t.Skip("run by the multi-process tests")
	}
	var err error
	args := strings.Split(os.Getenv(envArgs), "|")
	if mode == "lowfiles" {
		lowFiles(args)
		os.Exit(0)
	}
	var opts Options
	if v := os.Getenv(envLease); v != "" {
		if opts.Lease, err = time.ParseDuration(v); err != nil {
			fail(err)
		}
	}
	s, err := Open(os.Getenv(envDir), opts)
	if err != nil {
		fail(err)
	}
	switch mode {
	case "race":
		// args: manifest, sizes, key prefix, key count, seed
		sizes := ints(strings.Split(args[1], ","))
		nkeys := ints(args[3:4])[0]
		seed := ints(args[4:5])[0]
		go_ := filepath.Join(s.Dir(), "go")
		for {
			if _, err := os.Stat(go_); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := storetest.RaceWrite(s, args[0], sizes, raceKeys(args[2], nkeys), uint64(seed)); err != nil {
			fail(err)
		}
	case "killed":
		// args: key. Writes part 1, then starts part 0 and blocks in it.
		l := bigLayout()
		require.Equal(t, []error{nil}, s.WriteParts(context.Background(), []store.PartWrite{l.write(args[0], 1)}))
		s.onFragment = func(part, fragment int) {
			if fragment == 3 {
				fmt.Println("blocked")
				select {} // until killed
			}
		}
		s.WriteParts(context.Background(), []store.PartWrite{l.write(args[0], 0)})
		fail(fmt.Errorf("part 0 was written"))
	case "stopped":
		// args: key. Writes part 1, then begins part 0 and stops itself
		// (SIGSTOP) in the middle of it, holding the claim's lock shared.
		// Resumed (SIGCONT) once the test has created the file continue
		// in the store, it prints what the write of part 0 gave; resumed
		// before, it stops again.
		l := bigLayout()
		if err := s.WriteParts(context.Background(), []store.PartWrite{l.write(args[0], 1)})[0]; err != nil {
			fail(err)
		}
		s.onFragment = func(part, fragment int) {
			if fragment != 3 {
				return
			}
			fmt.Println("stopping")
			for {
				if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
					fail(err)
				}
				if _, err := os.Stat(filepath.Join(s.Dir(), "continue")); err == nil {
					return
				}
			}
		}
		fmt.Println(errStrings(s.WriteParts(context.Background(), []store.PartWrite{l.write(args[0], 0)}))[0])
	case "hold":
		// args: key, the files of its object to lock exclusively (claim,
		// lock). Holds them until killed, as a writer stopped while it
		// cleans up or takes the object over would.
		for _, name := range strings.Split(args[1], ",") {
			path := filepath.Join(s.objectDir(args[0]), name)
			fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o666)
			if err != nil {
				fail(fmt.Errorf("open %s: %w", path, err))
			}
			if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
				fail(fmt.Errorf("lock %s: %w", path, err))
			}
		}
		fmt.Println("locked")
		select {}
	case "partial":
		// args: key. Writes part 0 of 2 of layout A, then waits to be
		// killed.
		if err := s.WriteParts(context.Background(), []store.PartWrite{layoutA.write(args[0], 0)})[0]; err != nil {
			fail(err)
		}
		fmt.Println("wrote")
		select {}
	}
	os.Exit(0)
}

// lowFiles lowers the process's open-file limit to args[0] and reads every
// part of args[2] pages of layoutA, written by the test, with a store
// opened with MaxOpenFiles args[1] (0: the default), twice: one range at a
// time and in one call. It prints the number of ranges it read.
func lowFiles(args []string) {
	n := ints(args)
	limit := syscall.Rlimit{Cur: uint64(n[0])}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		fail(err)
	}
	limit.Cur = uint64(n[0])
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		fail(err)
	}
	s, err := Open(os.Getenv(envDir), Options{MaxOpenFiles: n[1]})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	keys := raceKeys("page", n[2])
	objs, err := s.Query(ctx, keys)
	if err != nil {
		fail(err)
	}
	var rs []store.Range
	for i, k := range keys {
		if !objs[i].Complete || objs[i].Err != nil {
			fail(fmt.Errorf("%s: %+v", k, objs[i]))
		}
		for p, size := range layoutA.sizes {
			rs = append(rs, store.Range{Key: k, Part: p, Dst: [][]byte{make([]byte, size)}})
		}
	}
	read := 0
	for i := range rs {
		if _, err := s.ReadRanges(ctx, rs[i:i+1]); err != nil {
			fail(err)
		}
		read++
	}
	m, err := s.ReadRanges(ctx, rs)
	if err != nil {
		fail(err)
	}
	read += m
	for _, r := range rs {
		if !bytes.Equal(r.Dst[0], layoutA.data(r.Key, r.Part)) {
			fail(fmt.Errorf("wrong bytes in %s part %d", r.Key, r.Part))
		}
	}
	fmt.Printf("read %d ranges with at most %d files cached\n", read, s.maxFiles)
}

// smallLayout is a layout of the multi-process tests.
type smallLayout struct {
	manifest string
	sizes    []int
}

var (
	layoutA = smallLayout{"kv/d/manifests/a", []int{3000, 5000}}
	layoutB = smallLayout{"kv/d/manifests/b", []int{2000, 2000, 4000}}
)

func (l smallLayout) data(key string, part int) []byte {
	return storetest.Pattern(fmt.Sprintf("%s/%s/%d", l.manifest, key, part), l.sizes[part])
}

func (l smallLayout) write(key string, part int) store.PartWrite {
	return store.PartWrite{Key: key, Part: part, Parts: len(l.sizes), Manifest: l.manifest, Data: [][]byte{l.data(key, part)}}
}

func (l smallLayout) writeAll(key string) []store.PartWrite {
	var ws []store.PartWrite
	for p := range l.sizes {
		ws = append(ws, l.write(key, p))
	}
	return ws
}

// requireStored requires key to be complete in layout l, with l's bytes.
func (l smallLayout) requireStored(t *testing.T, s store.Store, key string) {
	t.Helper()
	ctx := context.Background()
	objs, err := s.Query(ctx, []string{key})
	require.NoError(t, err)
	want := store.Object{Complete: true, Manifest: l.manifest, PartSizes: l.sizes}
	require.Equal(t, []store.Object{want}, objs)
	for p, size := range l.sizes {
		got := make([]byte, size)
		n, err := s.ReadRanges(ctx, []store.Range{{Key: key, Part: p, Dst: [][]byte{got}, Manifest: l.manifest}})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, l.data(key, p), got)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func ints(ss []string) []int {
	var n []int
	for _, s := range ss {
		i, err := strconv.Atoi(s)
		if err != nil {
			fail(err)
		}
		n = append(n, i)
	}
	return n
}

func raceKeys(prefix string, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return ks
}

func helper(t *testing.T, dir, mode string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envDir+"="+dir, envArgs+"="+strings.Join(args, "|"))
	cmd.Stderr = os.Stderr
	t.Cleanup(func() {
		if cmd.Process != nil {
			cmd.Process.Kill() // in case the test failed before the child ended
		}
	})
	return cmd
}

// TestProcessesRace has writer processes of two layouts race on the same
// keys: every key ends complete in exactly one layout, never mixed.
func TestProcessesRace(t *testing.T) {
	won := processesRace(t, "")
	t.Logf("keys won per layout: %v", won)
}

// TestProcessesTakeoverRace races writer processes of two layouts with a
// lease of 1ns, so that they take objects over from each other all the time:
// no object ever mixes layouts, and what is left incomplete is completed by
// a last writer.
func TestProcessesTakeoverRace(t *testing.T) {
	won := processesRace(t, "1ns")
	t.Logf("keys left per layout: %v", won)
}

func processesRace(t *testing.T, lease string) map[string]int {
	dir := t.TempDir()
	const nkeys = 120
	layouts := map[string][]int{"kv/d/manifests/a": {3000, 5000}, "kv/d/manifests/b": {2000, 2000, 4000}}
	var cmds []*exec.Cmd
	for i := range 4 {
		m := "kv/d/manifests/a"
		if i%2 == 1 {
			m = "kv/d/manifests/b"
		}
		sizes := fmt.Sprint(layouts[m][0])
		for _, n := range layouts[m][1:] {
			sizes += "," + strconv.Itoa(n)
		}
		cmd := helper(t, dir, "race", m, sizes, "page", strconv.Itoa(nkeys), strconv.Itoa(i))
		cmd.Env = append(cmd.Env, envLease+"="+lease)
		require.NoError(t, cmd.Start())
		cmds = append(cmds, cmd)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go"), nil, 0o666))
	for _, cmd := range cmds {
		require.NoError(t, cmd.Wait())
	}
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	ks := raceKeys("page", nkeys)
	objs, err := s.Query(context.Background(), ks)
	require.NoError(t, err)
	won := map[string]int{}
	for i, o := range objs {
		require.NoError(t, o.Err)
		won[o.Manifest]++
		if !o.Complete {
			require.NotEmpty(t, lease, "%s was left incomplete without takeovers", ks[i])
			c := claimOf(t, s, ks[i])
			require.NoError(t, storetest.RaceWrite(s, c.manifest, layouts[c.manifest], ks[i:i+1], 0))
		}
	}
	storetest.CheckRaced(t, s, ks, layouts)
	return won
}

// bigLayout is the layout of TestKilledWriter: part 0 is 2 MiB in 8
// fragments.
type bigLayoutT struct{ manifest string }

func bigLayout() bigLayoutT { return bigLayoutT{"kv/d/manifests/big"} }

func (l bigLayoutT) data(key string, part int) []byte {
	return storetest.Pattern(fmt.Sprintf("%s/%s/%d", l.manifest, key, part), []int{2 << 20, 1000}[part])
}

func (l bigLayoutT) write(key string, part int) store.PartWrite {
	b := l.data(key, part)
	var frags [][]byte
	for len(b) > 256<<10 {
		frags = append(frags, b[:256<<10])
		b = b[256<<10:]
	}
	frags = append(frags, b)
	return store.PartWrite{Key: key, Part: part, Parts: 2, Manifest: l.manifest, Data: frags}
}

// TestKilledWriter kills a writer process in the middle of a part: the part
// never reads as written, the object is not complete, and another process's
// retry completes it with the right bytes.
func TestKilledWriter(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const key = "kv_killed"
	cmd := helper(t, dir, "killed", key)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "blocked\n", line)

	s, err := Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	tmps, err := filepath.Glob(filepath.Join(s.objectDir(key), ".tmp-*"))
	require.NoError(t, err)
	require.Len(t, tmps, 1, "the child is writing part 0")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.EqualError(t, cmd.Wait(), "signal: killed")

	objs, err := s.Query(ctx, []string{key})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{}}, objs)
	for part, size := range []int{2 << 20, 1000} {
		n, err := s.ReadRanges(ctx, []store.Range{{Key: key, Part: part, Dst: [][]byte{make([]byte, size)}}})
		require.Equal(t, 0, n)
		require.EqualError(t, err, fmt.Sprintf("read kv_killed part %d [0,%d): not found", part, size))
	}
	require.NoFileExists(t, filepath.Join(s.objectDir(key), "part-0"))
	fi, err := os.Stat(tmps[0])
	require.NoError(t, err)
	require.Equal(t, int64(4*256<<10), fi.Size(), "the child wrote 4 fragments")

	// This process retries part 0 and completes the object.
	l := bigLayout()
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{l.write(key, 0)}))
	objs, err = s.Query(ctx, []string{key})
	require.NoError(t, err)
	require.Equal(t, []store.Object{{Complete: true, Manifest: l.manifest, PartSizes: []int{2 << 20, 1000}}}, objs)
	for part, size := range []int{2 << 20, 1000} {
		got := make([]byte, size)
		n, err := s.ReadRanges(ctx, []store.Range{{Key: key, Part: part, Dst: [][]byte{got}}})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, l.data(key, part), got)
	}
}

// startUntil starts a helper and waits for it to print line. It returns
// the rest of the helper's output.
func startUntil(t *testing.T, cmd *exec.Cmd, line string) *bufio.Reader {
	t.Helper()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := bufio.NewReader(out)
	got, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, line+"\n", got)
	return r
}

func openByURL(t *testing.T, url string) *Store {
	t.Helper()
	s, err := store.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s.(*Store)
}

// TestProcessTakeover: a writer of layout A killed after 1 of its 2 parts
// blocks a writer of layout B only until the lease has passed; then B takes
// the object over and it reads complete with B's bytes.
func TestProcessTakeover(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const key = "kv_abandoned"
	cmd := helper(t, dir, "partial", key)
	startUntil(t, cmd, "wrote")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.EqualError(t, cmd.Wait(), "signal: killed")

	long := openByURL(t, "file://"+dir+"?lease=1h")
	errs := long.WriteParts(ctx, layoutB.writeAll(key))
	require.Equal(t, []error{store.ErrLayoutConflict, store.ErrLayoutConflict, store.ErrLayoutConflict}, errs)

	const lease = 50 * time.Millisecond
	short := openByURL(t, "file://"+dir+"?lease="+lease.String())
	fi, err := os.Stat(filepath.Join(short.objectDir(key), "claim"))
	require.NoError(t, err)
	time.Sleep(time.Until(fi.ModTime().Add(2 * lease))) // the lease has passed
	errs = short.WriteParts(ctx, layoutB.writeAll(key))
	require.Equal(t, []error{nil, nil, nil}, errs)
	layoutB.requireStored(t, short, key)
	layoutB.requireStored(t, long, key)
	// A's writer, back, is told the object is complete.
	require.Equal(t, []error{store.ErrComplete}, long.WriteParts(ctx, []store.PartWrite{layoutA.write(key, 1)}))
	entries, err := os.ReadDir(short.objectDir(key))
	require.NoError(t, err)
	require.Len(t, entries, 5, "claim, lock and B's 3 parts: %v", entries)
}

// within runs f, failing the test if it has not returned after d: a bound
// that only catches a hang.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %v", what, d)
	}
}

// objectEntries returns the names of the files in key's object directory.
func objectEntries(t *testing.T, s *Store, key string) []string {
	t.Helper()
	entries, err := os.ReadDir(s.objectDir(key))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestProcessLockHeld: another process takes a page's claim lock and its
// lock file exclusively and never lets go, as a writer stopped while it
// cleans up or takes the page over would. No writer waits for it without
// bound: a writer of the page's layout fails that part after the lock wait,
// or at its context's deadline, or when its context is cancelled, and the
// rest of its batch goes on; a writer of another layout is refused before
// the lease has passed, and after it takes the page over without the held
// locks, and the page completes in its layout.
func TestProcessLockHeld(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const key = "kv_held"
	clk := newClock()
	s, err := Open(dir, Options{Lease: time.Hour, LockWait: 200 * time.Millisecond, now: clk.now})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{layoutA.write(key, 1)}))
	oldGen := claimOf(t, s, key).gen
	claimPath, lockPath := filepath.Join(s.objectDir(key), "claim"), filepath.Join(s.objectDir(key), "lock")
	startUntil(t, helper(t, dir, "hold", key, "claim,lock"), "locked")

	// A writer of the page's layout waits the lock wait and fails that
	// part; the other pages of its batch are written.
	errs := s.WriteParts(ctx, append([]store.PartWrite{layoutA.write(key, 0)}, layoutA.writeAll("kv_free")...))
	require.Equal(t, []string{"write kv_held part 0: lock " + claimPath + " is held by another writer; the batch's lock wait (200ms) is spent", "<nil>", "<nil>"}, errStrings(errs))
	layoutA.requireStored(t, s, "kv_free")
	require.Equal(t, []store.Object{{}}, query(t, s, key))

	// With a lock wait of an hour, a context deadline ends the wait; the
	// rest of the batch gets the context's error.
	patient, err := Open(dir, Options{Lease: time.Hour, LockWait: time.Hour, now: clk.now})
	require.NoError(t, err)
	defer patient.Close()
	batch := []store.PartWrite{layoutA.write(key, 0), layoutA.write("kv_late", 0)}
	for timeout := 100 * time.Millisecond; ; timeout *= 2 {
		dctx, cancel := context.WithTimeout(ctx, timeout)
		within(t, time.Minute, "a write past its deadline", func() { errs = patient.WriteParts(dctx, batch) })
		cancel()
		if errs[0] != context.DeadlineExceeded {
			break
		}
		// The deadline came before the write began (a machine stalled
		// for all of it): try a later one.
		require.Less(t, timeout, time.Minute)
	}
	require.Equal(t, []string{"write kv_held part 0: lock " + claimPath + " is held by another writer; waited until the context's deadline", "context deadline exceeded"}, errStrings(errs))
	require.ErrorIs(t, errs[0], context.DeadlineExceeded)
	require.Equal(t, context.DeadlineExceeded, errs[1])
	// Cancelling the context ends the wait with the context's error.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	within(t, time.Minute, "a cancelled write", func() { errs = patient.WriteParts(cctx, batch) })
	require.Equal(t, []error{context.Canceled, context.Canceled}, errs)
	require.Equal(t, []store.Object{{}}, query(t, s, key, "kv_late")[:1])

	// A writer of another layout is refused until the lease has passed,
	// without waiting for a lock.
	clk.add(time.Hour)
	require.Equal(t, []error{store.ErrLayoutConflict, store.ErrLayoutConflict, store.ErrLayoutConflict}, s.WriteParts(ctx, layoutB.writeAll(key)), "at the lease")
	// Past it, the claim's lock still held after the lock wait holds up
	// nobody; the lock file, taken less than a lease ago, does.
	require.NoError(t, os.Chtimes(lockPath, clk.t, clk.t))
	clk.add(time.Second)
	require.Equal(t, []string{"write kv_held part 0: lock " + lockPath + " is held by another writer; the batch's lock wait (200ms) is spent"}, errStrings(s.WriteParts(ctx, []store.PartWrite{layoutB.write(key, 0)})))
	// Held since longer ago than the lease, it is passed over too: the
	// page is taken over, completes in the new layout, and its new claim's
	// lock is free.
	clk.add(time.Hour)
	require.Equal(t, []error{nil, nil, nil}, s.WriteParts(ctx, layoutB.writeAll(key)))
	layoutB.requireStored(t, s, key)
	fresh := openByURL(t, "file://"+dir)
	layoutB.requireStored(t, fresh, key)
	require.Equal(t, []error{store.ErrComplete}, fresh.WriteParts(ctx, []store.PartWrite{layoutA.write(key, 0)}))
	gen := claimOf(t, s, key).gen
	require.NotEqual(t, oldGen, gen)
	require.Equal(t, []string{"claim", "lock", "part-" + gen + "-0", "part-" + gen + "-1", "part-" + gen + "-2"}, objectEntries(t, s, key))
}

// TestProcessStoppedWriter stops a writer process (SIGSTOP) in the middle
// of a part, holding its claim's lock shared. A writer of its layout shares
// the lock. A writer of another layout is refused until the claim is older
// than the lease, then waits the lock wait and takes the object over without
// the lock, and the object completes in its layout. The stopped writer,
// resumed, finds its claim replaced (whether its temporary file went with
// the takeover or not) and reports its part refused; the object still
// reads as the new layout's, and the new claim's time is not touched.
func TestProcessStoppedWriter(t *testing.T) {
	for _, c := range []struct {
		name     string
		keepTemp bool // the stopped writer's temporary file looks fresh to the new layout's writer
	}{{"temporary file removed", false}, {"temporary file kept", true}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			const key = "kv_stopped"
			cmd := helper(t, dir, "stopped", key)
			cmd.Env = append(cmd.Env, envLease+"=1ms") // it refreshes its claim after every fragment
			out := startUntil(t, cmd, "stopping")
			var ws syscall.WaitStatus
			for {
				_, err := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WUNTRACED, nil)
				if err != syscall.EINTR {
					require.NoError(t, err)
					break
				}
			}
			require.True(t, ws.Stopped(), "the writer is not stopped: %v", ws)

			clk := &clock{time.Now()}
			s, err := Open(dir, Options{Lease: time.Hour, LockWait: 200 * time.Millisecond, now: clk.now})
			require.NoError(t, err)
			defer s.Close()
			oldGen := claimOf(t, s, key).gen
			tmps, err := filepath.Glob(filepath.Join(s.objectDir(key), ".tmp-*"))
			require.NoError(t, err)
			require.Len(t, tmps, 1, "the writer is writing part 0")

			// The same layout shares the lock (a retry of a written part
			// writes nothing and succeeds).
			require.Equal(t, []error{nil}, s.WriteParts(ctx, []store.PartWrite{bigLayout().write(key, 1)}))
			require.Equal(t, []error{store.ErrLayoutConflict, store.ErrLayoutConflict, store.ErrLayoutConflict}, s.WriteParts(ctx, layoutB.writeAll(key)))
			clk.add(2 * time.Hour)
			if c.keepTemp {
				require.NoError(t, os.Chtimes(tmps[0], clk.t, clk.t))
			}
			require.Equal(t, []error{nil, nil, nil}, s.WriteParts(ctx, layoutB.writeAll(key)))
			layoutB.requireStored(t, s, key)
			gen := claimOf(t, s, key).gen
			require.NotEqual(t, oldGen, gen)
			if c.keepTemp {
				require.FileExists(t, tmps[0])
			} else {
				require.NoFileExists(t, tmps[0])
			}

			// Continue it, again until it answers: a SIGCONT that comes
			// between its look for the file and its next stop is lost.
			require.NoError(t, os.WriteFile(filepath.Join(dir, "continue"), nil, 0o666))
			lines := make(chan string, 1)
			go func() {
				line, _ := out.ReadString('\n')
				lines <- line
			}()
			var line string
			within(t, time.Minute, "the resumed writer", func() {
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for line == "" {
					cmd.Process.Signal(syscall.SIGCONT)
					select {
					case line = <-lines:
					case <-tick.C:
					}
				}
			})
			require.Equal(t, store.ErrLayoutConflict.Error()+"\n", line)
			// And until it exits: under load it was seen stopped once in
			// about a hundred runs after its answer, in its exit (a stop of
			// its own loop that took effect late), with nothing left to
			// continue it.
			waited := make(chan error, 1)
			go func() { waited <- cmd.Wait() }()
			var exit error
			within(t, time.Minute, "the writer's exit", func() {
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case exit = <-waited:
						return
					case <-tick.C:
						cmd.Process.Signal(syscall.SIGCONT)
					}
				}
			})
			require.NoError(t, exit)

			fresh := openByURL(t, "file://"+dir)
			layoutB.requireStored(t, fresh, key)
			fi, err := os.Stat(filepath.Join(s.objectDir(key), "claim"))
			require.NoError(t, err)
			require.True(t, clk.t.Equal(fi.ModTime()), "the new claim's time %v is not its writer's %v", fi.ModTime(), clk.t)
			require.Equal(t, []string{"claim", "lock", "part-" + gen + "-0", "part-" + gen + "-1", "part-" + gen + "-2"}, objectEntries(t, s, key))
		})
	}
}

// TestProcessLowFileLimit: a process whose open-file limit is 40 reads 300
// parts, with the default cache bound and with a bound far past its limit.
func TestProcessLowFileLimit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	const pages = 150
	for _, k := range raceKeys("page", pages) {
		for _, err := range s.WriteParts(ctx, layoutA.writeAll(k)) {
			require.NoError(t, err)
		}
	}
	for _, c := range []struct{ maxFiles, cached int }{{0, 10}, {1000, 1000}} {
		cmd := helper(t, dir, "lowfiles", "40", strconv.Itoa(c.maxFiles), strconv.Itoa(pages))
		out, err := cmd.Output()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("read 600 ranges with at most %d files cached\n", c.cached), string(out))
	}
}
