package tests

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Context parallelism across processes (issue 15): a TP2 x CP2 writer
// (interleave 1: CP rank c holds the tokens p with p % 2 == c), each rank
// its own process, writes and exits; then a TP1 x CP1 reader and every
// rank of a TP1 x CP4 reader with interleave 4 (CP rank c holds tokens
// 4c..4c+3), each its own process, restore and verify every element,
// through the file store and Redis.
func TestContextParallel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, model, layout string
		page                int // bytes of a page
		written             map[string]int
	}{
		// MLA: the latent is replicated on both TP ranks, so TP rank 0
		// writes each CP rank's part and TP rank 1 finds it replicated.
		{"mla", "layers=4,kv-heads=1,head-dim=32,dtype=bf16,page=16,mla=1,name=e2ecp", "PLHD", 4 * 32 * 2 * 16,
			map[string]int{"0/0/0": 3, "1/0/0": 0, "0/0/1": 3, "1/0/1": 0}},
		// MHA: each of the four ranks holds two heads of half the tokens.
		{"mha", "layers=4,kv-heads=4,head-dim=16,v-head-dim=8,dtype=bf16,page=16,name=e2ecpmha", "LPHD", 4 * 4 * 16 * 24 * 2,
			map[string]int{"0/0/0": 3, "1/0/0": 3, "0/0/1": 3, "1/0/1": 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, url, prefix string) {
				const pages = 3
				src := "tp=2,cp=2,cp-interleave=1,layout=" + c.layout
				var writers [][]string
				for r := range c.written {
					writers = append(writers, []string{"write", "--store", url, "--prefix", prefix, "--model", c.model, "--src", src,
						"--pages", fmt.Sprint(pages), "--rank", r})
				}
				for _, p := range runAll(t, writers...) {
					got, _ := parseWrite(t, p)
					require.Len(t, got, 1, p.String())
					for r, n := range got {
						require.Equal(t, counts{written: c.written[r], replica: pages - c.written[r]}, n, p.String())
					}
				}
				readers := [][]string{{"read", "--store", url, "--prefix", prefix, "--model", c.model,
					"--dst", "tp=1,rank=0/0,layout=page_head", "--pages", fmt.Sprint(pages), "--verify", "--json"}}
				for cp := range 4 {
					readers = append(readers, []string{"read", "--store", url, "--prefix", prefix, "--model", c.model,
						"--dst", fmt.Sprintf("tp=1,cp=4,cp-interleave=4,rank=0/0/%d,layout=page_first", cp), "--pages", fmt.Sprint(pages), "--verify", "--json"})
				}
				for i, p := range runAll(t, readers...) {
					require.Equal(t, 0, p.code, p.String())
					require.Empty(t, p.stderr.String(), p.String())
					got := parseRead(t, p)
					share := c.page
					if i > 0 {
						share = c.page / 4
					}
					require.Equal(t, readJSON{Requested: pages, Hit: pages, Verified: true, Bytes: pages * share, Ops: got.Ops}, got, p.String())
					require.Positive(t, got.Ops)
				}
				// A writer of the reader's topology finds the pages complete.
				p := run(t, "write", "--store", url, "--prefix", prefix, "--model", c.model, "--src", "tp=1,cp=4,cp-interleave=4,layout=HPLD", "--pages", fmt.Sprint(pages))
				got, _ := parseWrite(t, p)
				require.Len(t, got, 4, p.String())
				for r, n := range got {
					require.Equal(t, counts{complete: pages}, n, "rank %s: %s", r, p)
				}
			})
		})
	}
}
