package filestore

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// FuzzParseQuery parses arbitrary raw queries of file URLs: never a panic;
// a bad one sets no option and makes the URL a *store.URLError; a good one
// gives lease and lock-wait, each at most once, as positive durations, and
// nothing else.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{
		"", "lease=30s", "lock-wait=200ms", "lease=1m&lock-wait=5s", "lock-wait=1s&lock-wait=1s",
		"lock-wait=1s&lock-wait=2s", "lock-wait=0s", "lock-wait=-1s", "lock-wait=5", "lock-wait=",
		"lock-wait", "lock-wait=x%zz", "lock_wait=1s", "lease=1h;lock-wait=1s", "lock-wait=1s&sync=1",
		"lock-wait=9223372036854775807ns", "lock-wait=1e3s", "=1s", "&&lease=1s&",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		opts, err := parseQuery(raw)
		if err != nil {
			if opts.Lease != 0 || opts.LockWait != 0 {
				t.Fatalf("%q: %v, and yet lease %v, lock wait %v", raw, err, opts.Lease, opts.LockWait)
			}
			_, err := openURL(context.Background(), &url.URL{Scheme: "file", Path: "/nonexistent/kvreshard", RawQuery: raw})
			var ue *store.URLError
			if !errors.As(err, &ue) {
				t.Fatalf("%q: not a *store.URLError: %v", raw, err)
			}
			return
		}
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatalf("%q parses, yet url.ParseQuery fails: %v", raw, err)
		}
		for k, v := range q {
			if k != "lease" && k != "lock-wait" || len(v) != 1 {
				t.Fatalf("%q parses with %q given %d times", raw, k, len(v))
			}
		}
		for _, c := range []struct {
			name string
			got  time.Duration
		}{{"lease", opts.Lease}, {"lock-wait", opts.LockWait}} {
			if !q.Has(c.name) {
				if c.got != 0 {
					t.Fatalf("%q: %s %v, not given", raw, c.name, c.got)
				}
				continue
			}
			if d, err := time.ParseDuration(q.Get(c.name)); err != nil || d <= 0 || d != c.got {
				t.Fatalf("%q: %s %v from %q", raw, c.name, c.got, q.Get(c.name))
			}
		}
	})
}
