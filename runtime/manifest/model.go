package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Model is the semantic identity of a model: everything that changes the
// content of its KV cache.
type Model struct {
	Namespace string `json:"namespace"`
	ModelID   string `json:"model_id"`
	Revision  string `json:"revision"`
	// Fingerprint covers the semantic configuration that changes KV content
	// and is not in the descriptor (RoPE settings, fp8 variant, ...).
	Fingerprint string     `json:"fingerprint"`
	Descriptor  Descriptor `json:"descriptor"`
}

// Validate returns the first thing wrong with m: its descriptor, or a
// string that is not valid UTF-8 (JSON cannot carry it, so two such models
// could share a domain).
func (m *Model) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"namespace", m.Namespace}, {"model id", m.ModelID}, {"revision", m.Revision}, {"fingerprint", m.Fingerprint},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("model %s %q is not valid UTF-8", f.name, f.v)
		}
	}
	return m.Descriptor.Validate()
}

// Domain returns the model domain: the hex SHA-256 of the canonical JSON
// (keys sorted, no spaces) of the namespace, model id, revision, fingerprint
// and descriptor. Nothing about TP, PP, ranks or physical layout enters it,
// so every topology of the same model has the same domain. Only a model
// that Validate accepts has a domain of its own: invalid UTF-8 in its
// strings is encoded as U+FFFD, so such strings can collide.
func (m *Model) Domain() string {
	b := []byte(`{"descriptor":`)
	b = m.Descriptor.appendJSON(b)
	b = append(b, `,"fingerprint":`...)
	b = appendString(b, m.Fingerprint)
	b = append(b, `,"model_id":`...)
	b = appendString(b, m.ModelID)
	b = append(b, `,"namespace":`...)
	b = appendString(b, m.Namespace)
	b = append(b, `,"revision":`...)
	b = appendString(b, m.Revision)
	b = append(b, '}')
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// PageKey returns the key of one logical page: prefix + "_" + tokenHash +
// "_" + domain. The same tokens and the same model semantics give the same
// key under any topology and layout.
//
// PageKey does not validate, so that it costs one allocation. The prefix (a
// backend or model prefix) may contain "_"; tokenHash (a hex token-prefix
// hash) and domain (from Model.Domain) must not, so that SplitPageKey,
// which splits from the right, recovers all three.
func PageKey(prefix, tokenHash, domain string) string {
	return prefix + "_" + tokenHash + "_" + domain
}

// SplitPageKey splits a key made by PageKey into its prefix, token hash and
// model domain. ok is false when key has fewer than two "_".
func SplitPageKey(key string) (prefix, tokenHash, domain string, ok bool) {
	i := strings.LastIndexByte(key, '_')
	if i < 0 {
		return "", "", "", false
	}
	j := strings.LastIndexByte(key[:i], '_')
	if j < 0 {
		return "", "", "", false
	}
	return key[:j], key[j+1 : i], key[i+1:], true
}

// isDomain reports whether s looks like a model domain: 64 lowercase hex
// digits.
func isDomain(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
