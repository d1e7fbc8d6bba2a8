package redisstore

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// Config says which server to use and how. ParseURL makes one from a URL.
type Config struct {
	// Addrs are host:port addresses: one server, or seed nodes of a
	// cluster.
	Addrs []string
	// Cluster selects Redis Cluster; the server must be a cluster node.
	Cluster bool
	// DB is the database number of a single server.
	DB int
	// Username and Password authenticate, when set.
	Username, Password string
	// TTL, when positive, makes the keys of every page expire that long
	// after the page's last part write. Manifests never expire.
	TTL time.Duration
	// Lease is how long an incomplete page's claim must have gone
	// unwritten before a writer of another layout may take the page over
	// (see the package documentation); zero means store.DefaultLease. It
	// is rounded up to whole milliseconds.
	Lease time.Duration
	// DialTimeout bounds connecting to a server; zero means 2 s.
	DialTimeout time.Duration
}

const defaultDialTimeout = 2 * time.Second

// ParseURL parses redis://[user:password@]host:port[/db][?ttl=10m&lease=30s]
// and redis+cluster://[user:password@]host:port,host:port,...[?ttl=10m&lease=30s].
// A malformed URL gives a *store.URLError.
func ParseURL(rawURL string) (Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Config{}, &store.URLError{URL: rawURL, Reason: "cannot parse: " + err.(*url.Error).Err.Error()}
	}
	return parseURL(u)
}

func parseURL(u *url.URL) (Config, error) {
	raw := u.Redacted()
	if !strings.Contains(raw, "://") { // url.URL prints redis:// as redis:
		raw = strings.Replace(raw, ":", "://", 1)
	}
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, &store.URLError{URL: raw, Reason: fmt.Sprintf(format, args...)}
	}
	var c Config
	switch u.Scheme {
	case "redis":
	case "redis+cluster":
		c.Cluster = true
	default:
		return bad("scheme %q is not redis or redis+cluster", u.Scheme)
	}
	if u.Opaque != "" {
		return bad("missing host:port after %s://", u.Scheme)
	}
	if u.Fragment != "" {
		return bad("unexpected fragment %q", u.Fragment)
	}
	if u.Host == "" {
		return bad("missing host:port")
	}
	for _, a := range strings.Split(u.Host, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return bad("address %q is not host:port", a)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return bad("address %q: port %q is not a number from 1 to 65535", a, port)
		}
		c.Addrs = append(c.Addrs, a)
	}
	if !c.Cluster && len(c.Addrs) > 1 {
		return bad("a redis URL has one address; use redis+cluster:// for a cluster")
	}
	if u.User != nil {
		c.Username = u.User.Username()
		c.Password, _ = u.User.Password()
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		if c.Cluster {
			return bad("a cluster has only database 0; remove the path %q", u.Path)
		}
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 || strconv.Itoa(n) != db {
			return bad("database %q is not a non-negative number", db)
		}
		c.DB = n
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("cannot parse query: %v", err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		vs := q[k]
		if k != "ttl" && k != "lease" {
			return bad("unknown option %q; the options are ttl and lease", k)
		}
		if len(vs) != 1 {
			return bad("option %s given %d times", k, len(vs))
		}
		if k == "lease" {
			d, err := store.ParseLease(vs[0])
			if err != nil {
				return bad("%v", err)
			}
			c.Lease = d
			continue
		}
		d, err := time.ParseDuration(vs[0])
		if err != nil || d < time.Millisecond || d%time.Millisecond != 0 {
			return bad("ttl %q is not a duration of whole milliseconds, at least 1ms, such as 10m", vs[0])
		}
		c.TTL = d
	}
	return c, nil
}

// String returns the server's addresses, as errors name them.
func (c *Config) String() string { return strings.Join(c.Addrs, ",") }
