// Command serving shows what a serving process links of kvreshard, with
// two instances of one model that share a store and nothing else:
//
//   - prefill runs TP 2 with SGLang's page_first host pools and PLHD parts.
//     It computes the KV pages of a prompt and stores them, each rank its
//     own part, then exits.
//   - decode runs TP 1 x PP 2 with layer_first pools. Given a longer prompt
//     that starts with the first, each of its ranks finds the stored pages
//     of the shared prefix and reads its layers of them straight into its
//     pool, then checks every element. Prefill would resume after them.
//
// Each instance runs its ranks as goroutines; in a server each rank is a
// process with its own pool, doing what one goroutine does here.
//
//	go run ./examples/serving                                      both, on a new file store
//	go run ./examples/serving -role prefill -store file:///tmp/kv
//	go run ./examples/serving -role decode -store file:///tmp/kv
//
// The pages' contents come from internal/content, which stands in for the
// attention layers and lets decode verify what it read.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"

	"github.com/kvreshard/kvreshard/internal/content"
	_ "github.com/kvreshard/kvreshard/layouts"
	"github.com/kvreshard/kvreshard/runtime/kernel"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/reshard"
	"github.com/kvreshard/kvreshard/runtime/store"
	_ "github.com/kvreshard/kvreshard/runtime/store/filestore"  // file:// URLs
	_ "github.com/kvreshard/kvreshard/runtime/store/memstore"   // mem:// URLs (-role both only)
	_ "github.com/kvreshard/kvreshard/runtime/store/redisstore" // redis:// URLs
)

// model is what both instances serve: 8 layers, 4 KV heads of 64, bf16,
// pages of 16 tokens (128 KiB a page). Its domain is part of every page
// key, so instances of another model or revision never share pages.
var model = manifest.Model{Namespace: "example", ModelID: "tiny-llama", Revision: "1",
	Descriptor: manifest.Descriptor{Layers: []int{0, 1, 2, 3, 4, 5, 6, 7}, KVHeads: 4, HeadDims: []int{64, 64},
		Dtype: "bf16", ItemSize: 2, PageSize: 16}}

func main() {
	role := flag.String("role", "both", "prefill, decode, or both")
	storeURL := flag.String("store", "", "store URL (default: a file store in a new temporary directory)")
	flag.Parse()
	if *role != "prefill" && *role != "decode" && *role != "both" {
		fmt.Fprintf(os.Stderr, "serving: -role %q: want prefill, decode or both\n", *role)
		os.Exit(2)
	}
	if err := run(*role, *storeURL); err != nil {
		fmt.Fprintln(os.Stderr, "serving:", err)
		os.Exit(1)
	}
}

func run(role, url string) error {
	if url == "" {
		dir, err := os.MkdirTemp("", "kvreshard-serving-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		url = "file://" + dir
	}
	ctx := context.Background()
	st, err := store.Open(ctx, url)
	if err != nil {
		return err
	}
	defer st.Close()
	if role != "decode" {
		if err := prefill(ctx, st); err != nil {
			return err
		}
	}
	if role != "prefill" {
		return decode(ctx, st, plan.StoreTransport(url))
	}
	return nil
}

// prompt returns n tokens of a made-up prompt; every call agrees on the
// tokens they share.
func prompt(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i*7919%32000 + 1)
	}
	return t
}

// pageKeys returns the keys of the full pages of tokens. Each page's
// token hash chains the previous page's, so a key names the whole prefix
// up to the end of its page, as prefix caches do.
func pageKeys(tokens []int32) []string {
	d := &model.Descriptor
	domain := model.Domain()
	var keys []string
	var prev [sha256.Size]byte
	for p := 0; (p+1)*d.PageSize <= len(tokens); p++ {
		h := sha256.New()
		h.Write(prev[:])
		for _, t := range tokens[p*d.PageSize : (p+1)*d.PageSize] {
			h.Write(binary.LittleEndian.AppendUint32(nil, uint32(t)))
		}
		h.Sum(prev[:0])
		keys = append(keys, manifest.PageKey("example", hex.EncodeToString(prev[:16]), domain))
	}
	return keys
}

// prefill stores the pages of a 72-token prompt as a TP 2 instance: each
// rank computes its heads of every page into slot i of its pool and writes
// its part. Only the 4 full pages are stored, as prefix caches do.
func prefill(ctx context.Context, st store.Store) error {
	d := &model.Descriptor
	topo := placement.Topology{TP: 2, PP: 1}
	part, err := kernel.LayoutNamed("PLHD")
	if err != nil {
		return err
	}
	pool, err := kernel.LayoutNamed("page_first")
	if err != nil {
		return err
	}
	keys := pageKeys(prompt(72))
	// One manifest describes how every rank of this topology lays out its
	// part; the writers publish it, and the pages name it.
	m, err := plan.ManifestFor(model.Domain(), d, topo, part)
	if err != nil {
		return err
	}
	return eachRank(topo, func(r placement.Rank) (string, error) {
		p, writes, err := topo.Writer(d, r)
		if err != nil {
			return "", err
		}
		b, err := plan.BindingFor(d, topo, r, pool, len(keys))
		if err != nil {
			return "", err
		}
		w, err := reshard.NewWriter(st, m, p, writes, b)
		if err != nil {
			return "", err
		}
		if err := w.Publish(ctx); err != nil {
			return "", err
		}
		regions := w.Geometry().NewRegions() // the rank's host pool
		slots := make([]int, len(keys))
		for i, k := range keys {
			slots[i] = i
			content.Fill(w.Geometry(), regions, i, content.Seed(k)) // the forward pass
		}
		res, err := w.Write(ctx, keys, slots, regions)
		if err != nil {
			return "", err
		}
		written := 0
		for _, pr := range res {
			switch pr.Status {
			case reshard.Written:
				written++
			case reshard.Failed:
				return "", fmt.Errorf("write %s: %w", pr.Key, pr.Err)
			}
		}
		return fmt.Sprintf("prefill rank %d/%d (heads %d-%d): wrote its part of %d of %d pages in %s",
			r.TP, r.PP, b.HeadStart, b.HeadStart+b.Heads-1, written, len(keys), part.Name), nil
	})
}

// decode serves a 104-token prompt that starts with prefill's 72 tokens
// (6 full pages, 4 of them stored) as a TP 1 x PP 2 instance: each rank
// reads its layers of the stored prefix into its pool, as the planner
// chooses on the store's cost model t.
func decode(ctx context.Context, st store.Store, t plan.Transport) error {
	d := &model.Descriptor
	topo := placement.Topology{TP: 1, PP: 2}
	pool, err := kernel.LayoutNamed("layer_first")
	if err != nil {
		return err
	}
	keys := pageKeys(prompt(104))
	return eachRank(topo, func(r placement.Rank) (string, error) {
		b, err := plan.BindingFor(d, topo, r, pool, len(keys))
		if err != nil {
			return "", err
		}
		rd, err := reshard.NewReader(st, model.Domain(), d, b, reshard.ReaderOptions{Plan: plan.Options{Strategy: plan.Auto, Transport: &t}})
		if err != nil {
			return "", err
		}
		regions := rd.Geometry().NewRegions() // the rank's host pool
		slots := make([]int, len(keys))
		for i := range slots {
			slots[i] = len(keys) - 1 - i // whatever slots the pool has free
		}
		res, err := rd.Read(ctx, keys, slots, regions)
		if err != nil {
			return "", err
		}
		// Only the leading res.Hit pages may be used; Stop says why the
		// rest were not read. A miss is the normal end of a prefix.
		if res.Stop != nil && !errors.Is(res.Stop, reshard.ErrMiss) {
			return "", res.Stop
		}
		for i := range res.Hit {
			if err := content.Verify(rd.Geometry(), regions, slots[i], content.Seed(keys[i])); err != nil {
				return "", fmt.Errorf("page %d: %w", i, err)
			}
		}
		return fmt.Sprintf("decode rank %d/%d (layers %d-%d): read %d of %d pages, %d bytes in %d reads, every element verified; prefill resumes at token %d",
			r.TP, r.PP, b.Layers[0], b.Layers[len(b.Layers)-1], res.Hit, len(keys), res.Bytes, res.Ops, res.Hit*d.PageSize), nil
	})
}

// eachRank runs f for every rank of topo at once and prints what each
// did, in rank order.
func eachRank(topo placement.Topology, f func(placement.Rank) (string, error)) error {
	ranks := topo.Ranks()
	lines := make([]string, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { lines[i], errs[i] = f(r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	return nil
}
