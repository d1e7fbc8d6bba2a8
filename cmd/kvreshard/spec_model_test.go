package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// --model draft-layers=N: the last N layers are MTP draft layers. They
// enter the model domain (0, or none given, is the domain of a model
// without the key), and more of them than layers is a usage error.
func TestModelDraftLayers(t *testing.T) {
	const base = "layers=5,kv-heads=2,head-dim=8,dtype=bf16,page=4"
	plain, err := parseModel(base)
	require.NoError(t, err)
	zero, err := parseModel(base + ",draft-layers=0")
	require.NoError(t, err)
	require.Equal(t, plain.model.Domain(), zero.model.Domain())
	mtp, err := parseModel(base + ",draft-layers=1")
	require.NoError(t, err)
	require.Equal(t, 1, mtp.model.Descriptor.DraftLayers)
	require.Equal(t, []int{0, 1, 2, 3, 4}, mtp.model.Descriptor.Layers)
	require.NotEqual(t, plain.model.Domain(), mtp.model.Domain())
	all, err := parseModel(base + ",draft-layers=5")
	require.NoError(t, err)
	require.NotEqual(t, mtp.model.Domain(), all.model.Domain())

	const src, dst = "tp=1,layout=PLHD", "tp=1,rank=0/0,layout=page_first"
	for _, c := range []struct{ model, msg string }{
		{base + ",draft-layers=6", "--model: draft-layers=6 is not from 0 to the 5 layers"},
		{base + ",draft-layers=-1", "--model: draft-layers=-1 is not a whole number >= 0"},
		{base + ",draft-layers=01", "--model: draft-layers=01 is not a whole number >= 0"},
		{base + ",draft-layers=1,draft-layers=1", `--model: key "draft-layers" given twice`},
	} {
		wantUsage(t, c.msg, "plan", "--model", c.model, "--src", src, "--dst", dst)
	}
}

// Pages written with draft layers are read, verified, by a reader of
// another topology and layout with the same draft layers, and are a miss
// for a reader of the same model without them.
func TestWriteReadDraftLayers(t *testing.T) {
	url := memStore(t)
	const model = "layers=5,kv-heads=2,head-dim=8,dtype=bf16,page=4,draft-layers=1"
	code, _, stderr := runArgs("write", "--store", url, "--model", model, "--src", "tp=2,pp=2,pp-layers=2/3,layout=PLHD", "--pages", "2")
	require.Equal(t, 0, code, stderr)
	read := func(model, dst string) readJSON {
		code, stdout, stderr := runArgs("read", "--store", url, "--model", model, "--dst", dst, "--pages", "2", "--verify", "--json")
		require.Contains(t, []int{0, 1}, code, stderr)
		var got readJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
		return got
	}
	got := read(model, "tp=1,rank=0/0,layout=layer_first")
	require.Equal(t, 2, got.Hit)
	require.True(t, got.Verified)
	require.Equal(t, 2*5*2*4*8*2*2, got.Bytes) // pages x layers x heads x tokens x dim x K,V x bytes
	got = read("layers=5,kv-heads=2,head-dim=8,dtype=bf16,page=4", "tp=1,rank=0/0,layout=layer_first")
	require.Equal(t, 0, got.Hit)
}
