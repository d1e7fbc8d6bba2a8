package content

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

type coord struct{ c, layer, head, token, d int }

func sweep(f func(coord)) {
	for c := 0; c < 2; c++ {
		for layer := 0; layer < 12; layer++ {
			for head := 0; head < 8; head++ {
				for token := 0; token < 16; token++ {
					for d := 0; d < 32; d++ {
						f(coord{c, layer, head, token, d})
					}
				}
			}
		}
	}
}

func TestValueDistinctInSweep(t *testing.T) {
	seed := Seed("sglang_0123abcd_" + "ff")
	seen := make(map[uint64]coord)
	sweep(func(k coord) {
		v := Value(seed, k.c, k.layer, k.head, k.token, k.d)
		prev, dup := seen[v]
		require.False(t, dup, "%v and %v have the same value", prev, k)
		seen[v] = k
	})
	require.Len(t, seen, 2*12*8*16*32)
}

// TestElementNeighboursDiffer checks what verification relies on: an element
// read from a neighbouring position (one coordinate off by one) or from
// another page has another value.
func TestElementNeighboursDiffer(t *testing.T) {
	seed := Seed("p_1_d")
	other := Seed("p_2_d")
	for _, size := range []int{1, 2, 4} {
		a := make([]byte, size)
		b := make([]byte, size)
		total, same := 0, 0
		sweep(func(k coord) {
			Element(seed, k.c, k.layer, k.head, k.token, k.d, a)
			for _, n := range []coord{
				{k.c + 1, k.layer, k.head, k.token, k.d},
				{k.c, k.layer + 1, k.head, k.token, k.d},
				{k.c, k.layer, k.head + 1, k.token, k.d},
				{k.c, k.layer, k.head, k.token + 1, k.d},
				{k.c, k.layer, k.head, k.token, k.d + 1},
			} {
				Element(seed, n.c, n.layer, n.head, n.token, n.d, b)
				total++
				if string(a) == string(b) {
					same++
				}
			}
			Element(other, k.c, k.layer, k.head, k.token, k.d, b)
			total++
			if string(a) == string(b) {
				same++
			}
		})
		// The expected rate of equal values is 2^-(8*size).
		switch size {
		case 1:
			require.Less(t, float64(same)/float64(total), 1.5/256, "size %d", size)
		case 2:
			require.Less(t, same, 1+total/65536*2, "size %d", size)
		case 4:
			require.Zero(t, same, "size %d", size)
		}
	}
}

func TestElementNeverZero(t *testing.T) {
	for _, size := range []int{1, 2, 4, 8, 12} {
		out := make([]byte, size)
		sweep(func(k coord) {
			Element(7, k.c, k.layer, k.head, k.token, k.d, out)
			require.NotEqual(t, make([]byte, size), out)
		})
	}
}

func TestElementIsLittleEndianValue(t *testing.T) {
	v := Value(42, 1, 2, 3, 4, 5)
	out := make([]byte, 4)
	Element(42, 1, 2, 3, 4, 5, out)
	require.Equal(t, uint32(v), binary.LittleEndian.Uint32(out))
	out = make([]byte, 2)
	Element(42, 1, 2, 3, 4, 5, out)
	require.Equal(t, uint16(v), binary.LittleEndian.Uint16(out))
	out = make([]byte, 1)
	Element(42, 1, 2, 3, 4, 5, out)
	require.Equal(t, byte(v), out[0])
}

// TestGolden pins seeds and values: `kvreshard read --verify` checks pages
// another process (another build) wrote, so a change of them must be
// deliberate.
func TestGolden(t *testing.T) {
	for key, want := range map[string]uint64{"a_b_c": 0xd30b068a4514a964, "": 0xf52a15e9a9b5e89b,
		"kvreshard_0000000000000000_ff": 0x7e9b66ee4e6a80f6} {
		require.Equal(t, want, Seed(key), "Seed(%q)", key)
	}
	s := Seed("a_b_c")
	require.Equal(t, uint64(0xc9cc2a3692c84b6c), Value(s, 0, 0, 0, 0, 0))
	require.Equal(t, uint64(0x6e9f112f6cb68194), Value(s, 1, 79, 7, 63, 127))
	b := make([]byte, 2)
	Element(s, 1, 2, 3, 4, 5, b)
	require.Equal(t, []byte{0x9b, 0xaf}, b)
	require.NotEqual(t, Seed("a_b_c"), Seed("a_b_d"))
}

func TestNoAllocation(t *testing.T) {
	out := make([]byte, 4)
	key := "prefix_0123_abcd"
	allocs := testing.AllocsPerRun(1000, func() {
		s := Seed(key)
		for d := range 64 {
			Element(s, 1, 3, 2, 7, d, out)
		}
		Element(s, 0, 0, 0, 0, 0, out[:1])
		Element(s, 0, 0, 0, 0, 0, out[:2])
	})
	require.Zero(t, allocs)
}

func BenchmarkElement(b *testing.B) {
	out := make([]byte, 2)
	s := Seed("k")
	for i := 0; b.Loop(); i++ {
		Element(s, 1, 5, 3, i&63, i&127, out)
	}
}
