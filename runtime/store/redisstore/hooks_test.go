package redisstore_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvreshard/kvreshard/internal/redistest"
	"github.com/kvreshard/kvreshard/runtime/store"
	"github.com/kvreshard/kvreshard/runtime/store/redisstore"
	"github.com/kvreshard/kvreshard/testkit/storetest"
)

// raw runs commands on the server behind a store, bypassing it: the
// server that holds a key (one server, or a cluster's owner of the key's
// slot), in the store's database.
type raw func(t *testing.T, key string, args ...string) any

// single returns the raw commands of database db of srv. A database other
// than 0 is reached through a script that selects it (a SELECT in a
// script holds for the script only).
func single(srv *redistest.Server, db int) raw {
	return func(t *testing.T, _ string, args ...string) any {
		t.Helper()
		if db != 0 {
			args = append([]string{"EVAL", "redis.call('SELECT', ARGV[1]) return redis.call(unpack(ARGV, 2))", "0", strconv.Itoa(db)}, args...)
		}
		v, err := srv.Do(args...)
		require.NoError(t, err, "%q", args)
		return v
	}
}

// cluster returns the raw commands of a cluster.
func cluster(c *redistest.Cluster) raw {
	return func(t *testing.T, key string, args ...string) any {
		t.Helper()
		owner, _, err := c.Owner(key)
		require.NoError(t, err)
		v, err := owner.Do(args...)
		require.NoError(t, err, "%q", args)
		return v
	}
}

// withOption adds a query option to a store URL.
func withOption(u, opt string) string {
	if strings.Contains(u, "?") {
		return u + "&" + opt
	}
	return u + "?" + opt
}

// backend returns the conformance suite's view of the stores at url.
func backend(url string, do raw) storetest.Backend {
	return storetest.Backend{
		Open: func(t *testing.T) store.Store { return open(t, url) },
		OpenLease: func(t *testing.T, lease time.Duration) store.Store {
			return open(t, withOption(url, "lease="+lease.String()))
		},
		// The claim's time is the meta hash's field t (server ms).
		Age: func(t *testing.T, _ store.Store, key string, d time.Duration) {
			meta, _, _ := redisstore.PageKeys(key)
			do(t, meta, "HINCRBY", meta, "t", strconv.FormatInt(-d.Milliseconds(), 10))
		},
		// A meta key of the wrong type.
		Corrupt: func(t *testing.T, _ store.Store, key string) {
			meta, _, _ := redisstore.PageKeys(key)
			do(t, meta, "DEL", meta)
			do(t, meta, "RPUSH", meta, "not a hash")
		},
	}
}
