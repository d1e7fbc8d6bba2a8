package plan

import (
	"fmt"

	"github.com/kvreshard/kvreshard/compiler/ir"
	"github.com/kvreshard/kvreshard/runtime/manifest"
	"github.com/kvreshard/kvreshard/runtime/placement"
)

// ManifestFor returns the manifest of pages that topology t writes in part
// layout l.
func ManifestFor(domain string, d *manifest.Descriptor, t placement.Topology, l *ir.Layout) (*manifest.Manifest, error) {
	if l.Kind != ir.Part {
		return nil, fmt.Errorf("layout %s is a pool layout; pages are stored in part layouts", l.Name)
	}
	if err := checkLayout(d, l); err != nil {
		return nil, err
	}
	parts, err := t.Parts(d)
	if err != nil {
		return nil, err
	}
	return manifest.New(domain, *d, manifest.PartLayout{Name: l.Name, Order: l.Order()}, parts)
}

// BindingFor returns the binding of rank r of topology t: its share of each
// page (layers, heads and, under context parallelism, tokens), laid out in
// l with slots pool pages.
func BindingFor(d *manifest.Descriptor, t placement.Topology, r placement.Rank, l *ir.Layout, slots int) (Binding, error) {
	sh, err := t.Share(d, r)
	if err != nil {
		return Binding{}, err
	}
	return Binding{Layout: l, Layers: sh.Layers, HeadStart: sh.HeadStart, Heads: sh.HeadCount, Slots: slots, Tokens: sh.Tokens}, nil
}
