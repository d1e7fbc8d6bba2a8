package content

import (
	"fmt"

	"github.com/kvreshard/kvreshard/runtime/manifest"
)

// PageKeys returns the keys of n synthetic pages of a model domain: the
// prefix, a stand-in for the token-prefix hash of page i (i times a large
// odd constant, in hex, so keys spread like real hashes), and the domain.
// kvreshard's demo, write, read and bench name their pages this way, so
// that any process can find the pages another wrote.
func PageKeys(prefix, domain string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = manifest.PageKey(prefix, fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15), domain)
	}
	return keys
}
