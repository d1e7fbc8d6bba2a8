// Package content gives every element of every KV page a deterministic value,
// so that a reader can verify the bytes it received without knowing who wrote
// them or in which layout.
//
// A page's values depend on its page key (through Seed) and on each element's
// global coordinates: component (0 = K, 1 = V, or 0 for an MLA latent), global
// layer id, global KV-head id, token within the page, and element within the
// head. Writers fill their pools with Element, readers recompute Element and
// compare. Because the coordinates are global, any reader topology can check
// any writer topology.
//
// Values are 64-bit mixes of the seed and the coordinates (a bijective round
// per coordinate, then the splitmix64 finalizer), truncated to the item size.
// An element read from the wrong place therefore differs from the expected
// value with probability about 1 - 2^-(8*itemsize). No element is ever all zero bytes, so
// a destination that was never written (zeroed memory) never verifies.
package content

import (
	"encoding/binary"
	"math/bits"
)

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
	golden    = 0x9e3779b97f4a7c15
	mul1      = 0x9e3779b97f4a7c15 // odd: multiplying by it is a bijection
	mul2      = 0xc2b2ae3d27d4eb4f
)

// mix is the splitmix64 finalizer: a bijection of 64-bit values with good
// avalanche.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Seed returns the seed of the page stored under pageKey: the 64-bit FNV-1a
// hash of the key, mixed.
func Seed(pageKey string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(pageKey); i++ {
		h ^= uint64(pageKey[i])
		h *= fnvPrime
	}
	return mix(h)
}

// Value returns the 64-bit value of one element before truncation to the
// item size. Each coordinate enters through its own bijective round (xor,
// odd multiply, rotate) and a splitmix64 finalizer mixes the result, so two
// coordinate tuples that differ in one coordinate always give different
// values, and any other pair collides with probability about 2^-64.
func Value(seed uint64, c, layer, head, token, d int) uint64 {
	h := seed
	h = bits.RotateLeft64((h^uint64(c))*mul1, 29)
	h = bits.RotateLeft64((h^uint64(layer))*mul2, 29)
	h = bits.RotateLeft64((h^uint64(head))*mul1, 29)
	h = bits.RotateLeft64((h^uint64(token))*mul2, 29)
	h = (h ^ uint64(d)) * mul1
	return mix(h)
}

// Element fills out, whose length is the item size (1, 2 or 4; any length
// works), with the value of element d of head head, token token, layer layer
// and component c of the page whose seed is seed. Bytes are little endian.
// An all-zero result is replaced by one whose lowest byte is 1.
// Element does not allocate.
func Element(seed uint64, c, layer, head, token, d int, out []byte) {
	v := Value(seed, c, layer, head, token, d)
	switch len(out) {
	case 0:
		return
	case 1:
		b := byte(v)
		if b == 0 {
			b = byte(v>>8) | 1
		}
		out[0] = b
	case 2:
		w := uint16(v)
		if w == 0 {
			w = uint16(v>>16) | 1
		}
		binary.LittleEndian.PutUint16(out, w)
	case 4:
		w := uint32(v)
		if w == 0 {
			w = uint32(v>>32) | 1
		}
		binary.LittleEndian.PutUint32(out, w)
	default:
		zero := true
		for i := range out {
			if i > 0 && i%8 == 0 {
				v = mix(v + golden)
			}
			out[i] = byte(v >> (8 * (i % 8)))
			if out[i] != 0 {
				zero = false
			}
		}
		if zero {
			out[0] = 1
		}
	}
}
