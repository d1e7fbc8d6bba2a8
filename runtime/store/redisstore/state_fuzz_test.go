package redisstore

import (
	"testing"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// FuzzDecodeState: a state reply, whatever the server sent, decodes to a
// complete object with one size and one checksum per part, to an object
// whose Err says why it cannot be read, or to nothing; never a panic, and
// never an allocation sized by an unchecked count.
func FuzzDecodeState(f *testing.F) {
	f.Add("10 20\nkv/d/manifests/a")
	f.Add("!bad type")
	f.Add("10\n")
	f.Add("-1\nm")
	f.Add("1099511627777\nm")
	f.Add("")
	f.Fuzz(func(t *testing.T, v string) {
		o, err := decodeState(v, nil)
		if err != nil {
			t.Fatalf("reply %q: error %v for a reply without one", v, err)
		}
		if o == nil {
			t.Fatalf("reply %q decodes to nothing", v)
		}
		if o.Err != nil {
			if o.Complete {
				t.Fatalf("reply %q: complete with an error", v)
			}
			return
		}
		if !o.Complete || o.Manifest == "" || len(o.PartSizes) == 0 || len(o.PartSizes) > store.MaxParts {
			t.Fatalf("reply %q decodes to %+v", v, o)
		}
		for _, n := range o.PartSizes {
			if n < 0 {
				t.Fatalf("reply %q: negative part size", v)
			}
		}
	})
}
