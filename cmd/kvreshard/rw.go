package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
)

// openStore opens a store URL: a malformed URL is a usage error (exit 2),
// a store that cannot be reached a failure (exit 1).
func (e env) openStore(ctx context.Context, url string) (store.Store, error) {
	if url == "" {
		return nil, usagef("--store is required (%s)", strings.Join(store.Schemes(), ", "))
	}
	st, err := e.open(ctx, url)
	var ue *store.URLError
	if errors.As(err, &ue) {
		return nil, usagef("--store: %v", err)
	}
	return st, err
}

// readOptions returns a reader's options for a store URL: the strategy
// (auto unless forced) and the cost model of the store's transport.
func readOptions(url, strategy string) (reshard.ReaderOptions, error) {
	st, err := plan.ParseStrategy(strategy)
	if err != nil {
		return reshard.ReaderOptions{}, usagef("--strategy: %v", err)
	}
	t := plan.StoreTransport(url)
	return reshard.ReaderOptions{Plan: plan.Options{Strategy: st, Transport: &t}}, nil
}

func writeCmd(e env, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("write", stderr)
	storeURL := fs.String("store", "", "store `URL`: file:///dir, mem://, redis://host:port")
	model := fs.String("model", "", "the model: layers=12,kv-heads=4,head-dim=8,dtype=fp32,page=16")
	src := fs.String("src", "", "the writer topology: tp=1,pp=3,layout=PLHD[,pp-layers=5/4/3][,cp=2,cp-interleave=1]")
	pages := intFlag(fs, "pages", 0, "number of `pages` to write")
	rankFlag := fs.String("rank", "", "write only this rank's part (`T/P` or T/P/C with cp); default: every rank")
	prefix := fs.String("prefix", "kvreshard", "page key prefix")
	kvl := fs.String("kvl", "", "comma-separated .kvl `files` with more layouts")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ms, tss, err := parseSpecs(*kvl, *model, topoFlag{"--src", *src, false})
	if err != nil {
		return err
	}
	d, ts := &ms.model.Descriptor, tss[0]
	if *pages < 1 {
		return usagef("--pages is required and must be at least 1")
	}
	if err := e.checkPages("--pages", *pages, d.PageBytes()); err != nil {
		return err
	}
	// List every rank only when every rank writes: --rank builds one.
	var ranks []placement.Rank
	if *rankFlag != "" {
		label := "--rank " + *rankFlag
		if strings.IndexFunc(*rankFlag, unicode.IsControl) >= 0 {
			label = fmt.Sprintf("--rank %q", *rankFlag)
		}
		r, err := parseRank(label, *rankFlag, ts.topo)
		if err != nil {
			return err
		}
		ranks = []placement.Rank{r}
	} else {
		ranks = ts.topo.Ranks()
	}
	domain := ms.model.Domain()
	m, err := plan.ManifestFor(domain, d, ts.topo, ts.layout)
	if err != nil {
		return usagef("--src: %v", err)
	}
	// The pool must fit the model (a split that divides its dims) before
	// any rank writes; that does not depend on the rank.
	if err := checkPool(d, ts, ranks[0], *pages); err != nil {
		return err
	}
	ctx := context.Background()
	st, err := e.openStore(ctx, *storeURL)
	if err != nil {
		return err
	}
	defer st.Close()
	keys := content.PageKeys(*prefix, domain, *pages)
	for _, r := range ranks {
		start := time.Now()
		count, err := writeRank(ctx, st, m, ts.topo, r, ts.pool, keys)
		if err != nil {
			return fmt.Errorf("rank %s: %w", rankName(ts.topo, r), err)
		}
		fmt.Fprintf(stdout, "rank %s: %d written, %d already complete, %d refused (another layout), %d replica in %s\n",
			rankName(ts.topo, r), count[reshard.Written], count[reshard.Complete], count[reshard.Refused], count[reshard.Replica],
			time.Since(start).Round(time.Microsecond))
	}
	fmt.Fprintf(stdout, "manifest %s (%s): %s\n", m.ID(), ts.layout.Name, m.Key())
	return nil
}

// readJSON is what read --json prints. Verified is always there: true
// only when --verify was given, every page read verified and the read did
// not fail (it exits 0); false without --verify, when a page did not
// verify (Error names it) or when the read failed (Stop says why: the
// store, a manifest, a checksum), whatever the pages before verified. A
// read that stops at a miss or at the prefetch budget, a cache's answer,
// has verified the pages it read (Hit of Requested): as the text output's
// "verified every element of N pages", Verified is true then.
type readJSON struct {
	Requested int     `json:"requested"`
	Hit       int     `json:"hit"`
	Verified  bool    `json:"verified"`
	Bytes     int     `json:"bytes"`
	Ops       int     `json:"ops"`
	Seconds   float64 `json:"seconds"`
	GBps      float64 `json:"gbps"`
	Fallbacks int64   `json:"interpreter_plans"`
	Stop      string  `json:"stop,omitempty"`
	Error     string  `json:"error,omitempty"`
}

func readCmd(e env, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("read", stderr)
	storeURL := fs.String("store", "", "store `URL`: file:///dir, mem://, redis://host:port")
	model := fs.String("model", "", "the model: layers=12,kv-heads=4,head-dim=8,dtype=fp32,page=16")
	dst := fs.String("dst", "", "the reader rank: tp=2,pp=2,rank=1/0,layout=page_first[,cp=2,cp-interleave=1,rank=1/0/1]")
	pages := intFlag(fs, "pages", 0, "number of `pages` to read")
	prefix := fs.String("prefix", "kvreshard", "page key prefix")
	verify := fs.Bool("verify", false, "verify every restored element")
	strategy := fs.String("strategy", "auto", "how to move the bytes: direct, scatter, staged or auto (the store's cost model chooses)")
	costs := fs.String("costs", "", "cost models `file` from bench --calibrate --out (default: the configured ones)")
	asJSON := fs.Bool("json", false, `print the result as JSON ("verified": --verify verified every page read, and the read did not fail)`)
	kvl := fs.String("kvl", "", "comma-separated .kvl `files` with more layouts")
	workers := intFlag(fs, "copy-workers", 0, "`goroutines` that run the copies of staged pages (0: GOMAXPROCS)")
	checkParts := fs.Bool("check-parts", false, "check every byte read against its part's checksums before it reaches the pool (reads the 1 KiB checksum blocks around the bytes needed and each part's checksums; without it nothing is checked)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *workers < 0 {
		return usagef("--copy-workers: %d; want 0 (GOMAXPROCS) or more", *workers)
	}
	ms, tss, err := parseSpecs(*kvl, *model, topoFlag{"--dst", *dst, true})
	if err != nil {
		return err
	}
	d, ts := &ms.model.Descriptor, tss[0]
	if *pages < 1 {
		return usagef("--pages is required and must be at least 1")
	}
	if ts.placed {
		return usagef("--dst: slots and slot are chosen by read: page i goes to slot i of a pool of --pages slots")
	}
	// The pool holds page i in slot i: a part layout gets the pool of
	// its pages one slot after another.
	b, err := plan.BindingFor(d, ts.topo, ts.rank, readerPool(ts.layout), *pages)
	if err != nil {
		return usagef("--dst: %v", err)
	}
	g, err := plan.NewGeometry(d, b)
	if err != nil {
		return usagef("--dst: %v", err)
	}
	if err := e.checkPages("--pages", *pages, g.PageBytes); err != nil {
		return err
	}
	// Every flag is checked before the store is opened.
	ropts, err := readOptions(*storeURL, *strategy)
	if err != nil {
		return err
	}
	if err := applyCosts(&ropts.Plan, *costs); err != nil {
		return err
	}
	ctx := context.Background()
	st, err := e.openStore(ctx, *storeURL)
	if err != nil {
		var ue *usageError
		if *asJSON && !errors.As(err, &ue) {
			// A store that cannot be reached: still one JSON object.
			if jerr := json.NewEncoder(stdout).Encode(readJSON{Requested: *pages, Error: err.Error()}); jerr != nil {
				return jerr
			}
		}
		return err
	}
	defer st.Close()
	domain := ms.model.Domain()
	ropts.CopyWorkers = *workers
	ropts.CheckParts = *checkParts
	rd, err := reshard.NewReader(st, domain, d, b, ropts)
	if err != nil {
		return usagef("--dst: %v", err)
	}
	keys := content.PageKeys(*prefix, domain, *pages)
	slots := make([]int, len(keys))
	for i := range slots {
		slots[i] = i
	}
	regions := rd.Geometry().NewRegions()
	start := time.Now()
	res, err := rd.Read(ctx, keys, slots, regions)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	out := readJSON{Requested: len(keys), Hit: res.Hit, Bytes: res.Bytes, Ops: res.Ops,
		Seconds: elapsed.Seconds(), GBps: gbps(res.Bytes, elapsed), Fallbacks: rd.Stats().Fallbacks}
	if res.Stop != nil {
		out.Stop = res.Stop.Error()
	}
	bad := false // a page read did not verify
	if *verify {
		for i := 0; i < res.Hit; i++ {
			if err := content.Verify(rd.Geometry(), regions, i, content.Seed(keys[i])); err != nil {
				bad = true
				out.Error = fmt.Sprintf("page %d (%s): %v", i, keys[i], err)
				break
			}
		}
	}
	failed := res.Stop != nil && !missed(res.Stop)
	out.Verified = *verify && !bad && !failed
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(out); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "read %d of %s: %d bytes in %d ops, %s (%.2f GB/s)\n", out.Hit, plural(out.Requested, "page"), out.Bytes, out.Ops,
			elapsed.Round(time.Microsecond), out.GBps)
		if out.Stop != "" {
			fmt.Fprintf(stdout, "stopped: %s\n", out.Stop)
		}
		if out.Verified && out.Hit > 0 {
			fmt.Fprintf(stdout, "verified every element of %s\n", plural(out.Hit, "page"))
		}
	}
	if bad {
		if !*asJSON {
			fmt.Fprintf(stderr, "kvreshard read: %s\n", out.Error)
		}
		return errFailed
	}
	if failed {
		fmt.Fprintf(stderr, "kvreshard read: read %d of %s: %v\n", out.Hit, plural(out.Requested, "page"), res.Stop)
		return errFailed
	}
	return nil
}

// missed reports whether a read stopped on what a cache answers, not on a
// failure: a page missing or incomplete, or whose part vanished (evicted,
// or rewritten in another layout) since the query, or the prefetch
// budget. Anything else (the store failed, a manifest was rejected, a part
// failed its checksum) makes read exit 1.
func missed(stop error) bool {
	switch reshard.Classify(stop) {
	case reshard.StopMiss, reshard.StopBudget:
		return true
	}
	return false
}
