package plan_test

import (
	"strings"
	"testing"

	"github.com/kvreshard/kvreshard/runtime/plan"
)

// FuzzParseTransports: a costs file, whatever its bytes, gives either cost
// models that validate or one error on one line; it never panics.
func FuzzParseTransports(f *testing.F) {
	f.Add([]byte(`{"measured":"x","transports":{"file":{"op_ns":900,"segment_ns":800,"bandwidth":7e9,"copy_bandwidth":28e9,"copy_run_ns":4,"segments":4,"segment_limit":1024}}}`))
	f.Add([]byte(`{"transports":{"redis":{"op_ns":"x"}}}`))
	f.Add([]byte(`{"transports":{"nope":{}}}`))
	f.Add([]byte(`{"transports":{"file":{"op_ns":1e999}}}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"transports":{"file":{"segments":-1,"segments":2}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, err := plan.ParseTransports(data)
		if err != nil {
			if msg := err.Error(); msg == "" || strings.Contains(msg, "\n") {
				t.Fatalf("error %q is not one line", msg)
			}
			return
		}
		for name, tr := range ts {
			if err := tr.Validate(); err != nil {
				t.Fatalf("transport %s accepted but invalid: %v", name, err)
			}
		}
	})
}
