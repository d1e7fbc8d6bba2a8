package filestore

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseClaim: a claim file's bytes, whatever they are, parse to a
// claim that writes back as the same bytes, or to one *corruptError; the
// part count is bounded before anything is sized by it.
func FuzzParseClaim(f *testing.F) {
	f.Add([]byte("2 0123456789abcdef\nkv/d/manifests/a"))
	f.Add([]byte("999999999999 0123456789abcdef\nm"))
	f.Add([]byte("1 0123456789ABCDEF\nm"))
	f.Add([]byte("-1 0123456789abcdef\nm"))
	f.Add([]byte("+2 0123456789abcdef\nm"))
	f.Add([]byte("02 0123456789abcdef\nm"))
	f.Add([]byte("2\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseClaim("claim", b)
		if err != nil {
			var ce *corruptError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *corruptError", err)
			}
			return
		}
		if !bytes.Equal(c.bytes(), b) {
			t.Fatalf("claim %q writes back as %q", b, c.bytes())
		}
	})
}
