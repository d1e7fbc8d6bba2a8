package enginestore

import (
	"time"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// What the tests of package enginestore_test reach behind the API.

const BounceBytes = bounceBytes

var (
	ClaimKey       = claimKey
	DoneKey        = doneKey
	PartKey        = partKey
	ManifestDigest = manifestDigest
)

// EngineOf returns the engine of a store.
func EngineOf(s store.Store) Engine { return s.(*Store).e }

// AgeClaim makes the claim of key look d older, as if its writer's clock
// had put it d earlier (the engine rewritten with set).
func AgeClaim(s store.Store, key string, d time.Duration, get func(string) []byte, set func(string, []byte)) error {
	v := get(claimKey(key))
	if v == nil {
		return nil
	}
	c, err := parseClaim(v)
	if err != nil {
		return err
	}
	c.at = c.at.Add(-d)
	set(claimKey(key), c.bytes())
	return nil
}

// Forget drops what the store remembers of key's commit.
func Forget(s store.Store, key string) { s.(*Store).done.Remove(key) }

// SetClock sets a store's clock and lease.
func SetClock(s store.Store, now func() time.Time, lease time.Duration) {
	s.(*Store).now, s.(*Store).lease = now, lease
}

// ParseClaim is parseClaim, its error only.
func ParseClaim(b []byte) error {
	_, err := parseClaim(b)
	return err
}

// ClaimOf returns the part count and manifest of a claim.
func ClaimOf(b []byte) (int, string, error) {
	c, err := parseClaim(b)
	if err != nil {
		return 0, "", err
	}
	return c.parts, c.manifest, nil
}
