package plan

import (
	"fmt"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// Template returns the plan of manifest m for this planner's binding, from
// the template cache when it has one for m's ID. Offsets are relative
// to the page's slot: Instantiate places a template at a slot.
func (p *Planner) Template(m *manifest.Manifest) (*Plan, error) {
	id := m.ID()
	if pl, ok := p.templates.Get(id); ok {
		return pl, nil
	}
	pl, err := p.Build(m)
	if err != nil {
		return nil, err
	}
	p.templates.Put(id, pl)
	return pl, nil
}

// CheckSlots returns an error unless every slot is inside the pool and no
// two pages of a request share a slot.
func (p *Planner) CheckSlots(slots []int) error {
	n := p.geo.Slots
	if len(slots) > n {
		return fmt.Errorf("%d pages do not fit in a pool of %d slots", len(slots), n)
	}
	if len(slots) <= 64 {
		for i, s := range slots {
			if s < 0 || s >= n {
				return fmt.Errorf("slot %d of page %d is outside the pool's %d slots", s, i, n)
			}
			for j := 0; j < i; j++ {
				if slots[j] == s {
					return fmt.Errorf("pages %d and %d both go to slot %d", j, i, s)
				}
			}
		}
		return nil
	}
	first := make(map[int]int, len(slots))
	for i, s := range slots {
		if s < 0 || s >= n {
			return fmt.Errorf("slot %d of page %d is outside the pool's %d slots", s, i, n)
		}
		if j, dup := first[s]; dup {
			return fmt.Errorf("pages %d and %d both go to slot %d", j, i, s)
		}
		first[s] = i
	}
	return nil
}

// Instantiate appends the ops of template pl placed at slot: one add per op.
// The slot must have been checked with CheckSlots.
func (p *Planner) Instantiate(pl *Plan, slot int, out []Op) []Op {
	var delta [8]int
	d := delta[:0]
	for _, s := range p.geo.SlotStride {
		d = append(d, slot*s)
	}
	n := len(out)
	out = append(out, pl.Ops...)
	for i := n; i < len(out); i++ {
		out[i].Dst += d[out[i].Region]
	}
	return out
}
