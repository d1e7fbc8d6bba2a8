package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvreshard/kvreshard/runtime/plan"
)

// FuzzSpecs parses arbitrary --model, --src and --dst flags: they never
// panic; a malformed one is one usage error that names its flag; a
// well-formed one gives topologies whose ranks bind to a valid geometry
// or an error.
func FuzzSpecs(f *testing.F) {
	f.Add("layers=12,kv-heads=4,head-dim=8,v-head-dim=8,dtype=fp32,page=16", "tp=1,pp=3,layout=PLHD,pp-layers=5/4/3", "tp=2,pp=2,rank=1/0,layout=page_first,slots=4,slot=2")
	f.Add("layers=61,kv-heads=1,head-dim=512,mla=1,dtype=bf16,page=64", "tp=4,layout=LPHD,pool=layer_first", "tp=2,rank=1/0,layout=layer_first")
	f.Add("layers=80,kv-heads=8,head-dim=128,dtype=bf16,page=64,name=x,revision=1", "tp=8,layout=PLHD", "tp=4,pp=2,rank=0/0,layout=page_first")
	f.Add("layers=2,kv-heads=2,head-dim=4,dtype=fp8,page=1", "tp=16,layout=HPLD", "tp=3,rank=2/0,layout=page_head,slots=9223372036854775807")
	f.Add("layers=4,kv-heads=4,head-dim=8,dtype=fp32,page=16", "tp=4611686018427387904,layout=PLHD", "tp=1000000000,rank=0/0,layout=PLHD")
	f.Add("layers=+12,kv-heads=04,head-dim=8,dtype=fp32,page=16", "tp=+1,pp=1,layout=PLHD", "tp=1,rank=+0/0,layout=page_first")
	f.Add("layers=4,kv-heads=1,head-dim=32,mla=1,dtype=bf16,page=16", "tp=2,cp=2,cp-interleave=1,layout=PLHD", "tp=1,cp=4,cp-interleave=4,rank=0/0/3,layout=page_first")
	f.Add("layers=4,kv-heads=4,head-dim=8,dtype=fp32,page=16", "tp=2,cp=16,cp-interleave=1,layout=LPHD", "tp=4,cp=3,rank=1/0/2,layout=page_head")
	f.Add("layers=5,kv-heads=2,head-dim=8,dtype=bf16,page=4,draft-layers=1", "tp=2,pp=2,pp-layers=2/3,layout=LPHD", "tp=1,rank=0/0,layout=page_head")
	f.Fuzz(func(t *testing.T, model, src, dst string) {
		ms, tss, err := parseSpecs("", model, topoFlag{"--src", src, false}, topoFlag{"--dst", dst, true})
		if err != nil {
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("not a usage error: %v", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "--model") && !strings.HasPrefix(msg, "--src") && !strings.HasPrefix(msg, "--dst") {
				t.Fatalf("the error names no flag: %q", msg)
			}
			if strings.Contains(msg, "\n") {
				t.Fatalf("the error is more than one line: %q", msg)
			}
			return
		}
		d := &ms.model.Descriptor
		if err := d.Validate(); err != nil {
			t.Fatalf("a parsed model does not validate: %v", err)
		}
		for _, ts := range tss {
			if err := ts.topo.Validate(d); err != nil {
				t.Fatalf("a parsed topology does not validate: %v", err)
			}
		}
		if b, err := tss[1].binding(d); err == nil {
			_, _ = plan.NewGeometry(d, b) // an error is fine here; a panic is not
		}
	})
}
