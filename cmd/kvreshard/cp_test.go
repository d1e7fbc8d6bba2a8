package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

const mlaModel = "layers=2,kv-heads=1,head-dim=8,dtype=fp16,page=16,mla=1"

// plan --json of a TP2 x CP2 (interleave 1) MLA writer read by CP rank 1
// of TP1 x CP4 (interleave 4), which holds tokens 4-7: tokens 4 and 6 are
// local tokens 2 and 3 of part 0 (CP rank 0), 5 and 7 of part 1; a token
// of PLHD is 2 layers x 8 elements x 2 bytes = 32 bytes on both sides.
func TestCPPlanJSON(t *testing.T) {
	code, stdout, stderr := runArgs("plan", "--json", "--model", mlaModel, "--src", "tp=2,cp=2,layout=PLHD",
		"--dst", "tp=1,cp=4,cp-interleave=4,rank=0/0/1,layout=page_first")
	require.Equal(t, 0, code, stderr)
	var out planJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &out))
	require.Equal(t, []partJSON{
		{Index: 0, Layers: []int{0, 1}, HeadCount: 1, CPSize: 2, CPRank: 0, Interleave: 1, Bytes: 256},
		{Index: 1, Layers: []int{0, 1}, HeadCount: 1, CPSize: 2, CPRank: 1, Interleave: 1, Bytes: 256},
	}, out.Parts)
	require.Equal(t, []regionJSON{{Name: "latent", Bytes: 128}}, out.Regions)
	require.Equal(t, 128, out.Bytes)
	require.ElementsMatch(t, []opJSON{
		{Part: 0, Src: 64, Region: "latent", Dst: 0, Len: 32},
		{Part: 1, Src: 64, Region: "latent", Dst: 32, Len: 32},
		{Part: 0, Src: 96, Region: "latent", Dst: 64, Len: 32},
		{Part: 1, Src: 96, Region: "latent", Dst: 96, Len: 32},
	}, out.Ops)

	// Without CP the parts say so: cp_size 1, cp_rank 0, interleave 1.
	code, stdout, stderr = runArgs("plan", "--json", "--model", mlaModel, "--src", "tp=2,layout=PLHD", "--dst", "tp=1,rank=0/0,layout=page_first")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `"parts":[{"index":0,"layers":[0,1],"head_start":0,"head_count":1,"cp_size":1,"cp_rank":0,"interleave":1,"bytes":512}]`)

	// The text plan names the token sets.
	code, stdout, stderr = runArgs("plan", "--model", mlaModel, "--src", "tp=2,cp=2,layout=PLHD",
		"--dst", "tp=1,cp=4,cp-interleave=4,rank=0/0/1,layout=page_first")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "reader   tp=1 pp=1 cp=4 cp-interleave=4 rank 0/0/1, pool page_first (slot 0 of 1): layers 0-1, heads [0,1), tokens of cp rank 1 of 4\n")
	require.Contains(t, stdout, "part 1   layers 0-1, heads [0,1), tokens of cp rank 1 of 2, 256 bytes\n")
}

// write and read --verify across context parallelism, MLA and MHA, every
// rank of each reader, in one process on a memory store.
func TestCPWriteRead(t *testing.T) {
	for _, model := range []string{mlaModel, "layers=4,kv-heads=2,head-dim=8,v-head-dim=4,dtype=bf16,page=16"} {
		url := memStore(t)
		code, stdout, stderr := runArgs("write", "--store", url, "--model", model, "--src", "tp=2,cp=2,layout=PLHD", "--pages", "3")
		require.Equal(t, 0, code, stderr)
		require.Regexp(t, regexp.MustCompile(`(?m)^rank 0/0/1: 3 written, `), stdout)
		if model == mlaModel {
			// The latent is replicated on both TP ranks: TP rank 0 writes it.
			require.Regexp(t, regexp.MustCompile(`(?m)^rank 1/0/1: 0 written, 0 already complete, 0 refused \(another layout\), 3 replica in \S+$`), stdout)
		}
		readers := []struct{ dst string }{
			{"tp=1,rank=0/0,layout=page_first"},
			{"tp=2,pp=2,rank=1/1,layout=page_head"},
		}
		for c := 0; c < 4; c++ {
			readers = append(readers, struct{ dst string }{fmt.Sprintf("tp=1,cp=4,cp-interleave=4,rank=0/0/%d,layout=layer_first", c)})
		}
		readers = append(readers, struct{ dst string }{"tp=1,cp=2,rank=0/0/1,layout=PLHD"})
		for _, r := range readers {
			code, stdout, stderr := runArgs("read", "--store", url, "--model", model, "--dst", r.dst, "--pages", "3", "--verify")
			require.Equal(t, 0, code, "%s: %s", r.dst, stderr)
			require.Contains(t, stdout, "verified every element of 3 pages", r.dst)
			// Token lists on the interpreter are not fallbacks: every
			// layout pair here is compiled.
			code, stdout, stderr = runArgs("read", "--store", url, "--model", model, "--dst", r.dst, "--pages", "3", "--verify", "--json")
			require.Equal(t, 0, code, "%s: %s", r.dst, stderr)
			var out readJSON
			require.NoError(t, json.Unmarshal([]byte(stdout), &out))
			require.Equal(t, readJSON{Requested: 3, Hit: 3, Verified: true, Bytes: out.Bytes, Ops: out.Ops, Seconds: out.Seconds, GBps: out.GBps}, out, r.dst)
		}
	}
	// One rank at a time, T/P/C: the page is complete after the last.
	url := memStore(t)
	for _, rank := range []string{"0/0/0", "1/0/1", "0/0/1"} {
		code, _, stderr := runArgs("write", "--store", url, "--model", mlaModel, "--src", "tp=2,cp=2,cp-interleave=2,layout=LPHD", "--pages", "2", "--rank", rank)
		require.Equal(t, 0, code, stderr)
	}
	code, stdout, stderr := runArgs("read", "--store", url, "--model", mlaModel, "--dst", "tp=1,rank=0/0,layout=page_first", "--pages", "2", "--verify")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "read 2 of 2 pages")
}

// Bad context-parallel input: one clear message each, exit status 2.
func TestCPBadInput(t *testing.T) {
	const model = "layers=2,kv-heads=2,head-dim=8,dtype=fp16,page=16"
	dst := "tp=1,rank=0/0,layout=page_first"
	for _, c := range []struct{ src, dst, msg string }{
		{"tp=1,cp=2,cp-interleave=3,layout=PLHD", dst, "--src: cp interleave 3 does not divide the page's 16 tokens"},
		{"tp=1,cp=32,layout=PLHD", dst, "--src: cp 32 is more than the page's 16 tokens"},
		{"tp=1,cp=4,cp-interleave=8,layout=PLHD", dst, "--src: cp 4 x cp interleave 8 is 32 tokens, which does not divide the page's 16 tokens"},
		{"tp=1,cp=0,layout=PLHD", dst, "--src: cp=0 is not a whole number >= 1"},
		{"tp=1,cp-interleave=x,layout=PLHD", dst, "--src: cp-interleave=x is not a whole number >= 1"},
		{"tp=1,layout=PLHD", "tp=1,cp=2,rank=0/0/2,layout=page_first", "--dst: rank=0/0/2 is outside tp=1 x pp=1 x cp=2"},
		{"tp=1,layout=PLHD", "tp=1,rank=0/0/1,layout=page_first", "--dst: rank=0/0/1 is outside tp=1 x pp=1 x cp=1"},
		{"tp=1,layout=PLHD", "tp=1,cp=2,rank=0/0/0/0,layout=page_first", "--dst: rank=0/0/0/0 is not TP/PP ranks like 1/0, or TP/PP/CP ranks like 1/0/1"},
		{"tp=1,layout=PLHD", "tp=1,cp=17,rank=0/0/0,layout=page_first", "--dst: cp 17 is more than the page's 16 tokens"},
	} {
		wantUsage(t, c.msg, "plan", "--model", model, "--src", c.src, "--dst", c.dst)
	}
	wantUsage(t, "--rank 0/0/2 is outside tp=1 x pp=1 x cp=2", "write", "--store", "mem://", "--model", model, "--src", "tp=1,cp=2,layout=PLHD", "--pages", "1", "--rank", "0/0/2")
	wantUsage(t, "--src: cp interleave 3 does not divide the page's 16 tokens", "write", "--store", "mem://", "--model", model, "--src", "tp=1,cp=2,cp-interleave=3,layout=PLHD", "--pages", "1")
	wantUsage(t, "--dst: rank=0/0/3 is outside tp=1 x pp=1 x cp=2", "read", "--store", "mem://", "--model", model, "--dst", "tp=1,cp=2,rank=0/0/3,layout=page_first", "--pages", "1")
}
