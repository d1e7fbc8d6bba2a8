package redisstore

import (
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// FuzzParseURL parses arbitrary strings as Redis URLs: never a panic; a
// bad one is a *store.URLError that does not show the password; a good
// one names at least one host:port, and only a cluster more than one.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"redis://127.0.0.1:6379", "redis://u:p@127.0.0.1:6380/3?ttl=10m", "redis+cluster://a:1,b:2",
		"redis://[::1]:6379", "redis://h:0", "redis://h:1/x", "redis://h:1?ttl=1ms&ttl=2ms", "redis://:secret@h:1/-1",
		"redis://h:1?lease=30s", "redis+cluster://a:1,b:2?ttl=1m&lease=10m", "redis://h:1?lease=0", "redis://h:1?lease=1ns",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := ParseURL(raw)
		if err != nil {
			var ue *store.URLError
			if !errors.As(err, &ue) {
				t.Fatalf("%q: not a *store.URLError: %v", raw, err)
			}
			if u, perr := url.Parse(raw); perr == nil && u.User != nil {
				if p, ok := u.User.Password(); ok && len(p) >= 3 && !strings.Contains(p, "x") && strings.Count(raw, p) == 1 &&
					strings.Contains(err.Error(), p) {
					t.Fatalf("%q: the error shows the password: %v", raw, err)
				}
			}
			return
		}
		if len(c.Addrs) == 0 || !c.Cluster && len(c.Addrs) > 1 {
			t.Fatalf("%q: addresses %v (cluster %v)", raw, c.Addrs, c.Cluster)
		}
		for _, a := range c.Addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				t.Fatalf("%q: address %q: %v", raw, a, err)
			}
		}
		if c.DB < 0 || c.TTL < 0 || c.Lease < 0 {
			t.Fatalf("%q: db %d, ttl %v, lease %v", raw, c.DB, c.TTL, c.Lease)
		}
	})
}
