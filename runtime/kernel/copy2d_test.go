package kernel

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// naive2D is the model of Copy2D: byte by byte, row by row.
func naive2D(dst []byte, dpitch int, src []byte, spitch, width, height int) {
	for i := 0; i < height; i++ {
		for j := 0; j < width; j++ {
			dst[i*dpitch+j] = src[i*spitch+j]
		}
	}
}

// TestCopy2D checks Copy2D and Stream2D at every width of the vector
// loops' paths (16-byte pairs, 32-byte moves with and without an
// overlapping tail, 128-byte blocks) and both sides of the copy()
// fallbacks, at pitches that make rows touch or not, on both sides of
// Stream2D's pitch bound, at 32-byte aligned destinations (where Stream2D
// streams) and unaligned ones, against the byte model: the rows' bytes, and
// nothing else written.
func TestCopy2D(t *testing.T) {
	var widths []int
	for w := 1; w <= 300; w++ {
		widths = append(widths, w)
	}
	widths = append(widths, 512, 992, 1000, 1024, 4095, 4096, 4097, 9000)
	for _, f := range []struct {
		name string
		move func(dst []byte, dpitch int, src []byte, spitch, width, height int)
	}{{"Copy2D", Copy2D}, {"Stream2D", Stream2D}} {
		for _, w := range widths {
			for _, h := range []int{0, 1, 2, 3, 7, 20} { // 20: Stream2D prefetches rows 8 on
				// {32, 0}: pitches Stream2D streams at (up to 4 rows,
				// aligned); the last: over 4 rows for rows under 352 bytes,
				// which it does not.
				for _, pad := range [][2]int{{0, 0}, {1, 3}, {37, 0}, {0, 64}, {w, 5}, {32, 0}, {1056 - w%32, 32}} {
					for _, dOff := range []int{0, 5} {
						dp, sp := w+pad[0], w+pad[1]
						src := make([]byte, sp*h+w+11)
						for i := range src {
							src[i] = byte(i*131 + i>>8 + 1)
						}
						got := bytes.Repeat([]byte{0xee}, dp*h+w+64)
						// Start at a 32-byte boundary, plus dOff.
						base := (32-int(uintptr(unsafe.Pointer(&got[0]))%32))%32 + dOff
						want := bytes.Clone(got)
						naive2D(want[base:], dp, src[3:], sp, w, h)
						f.move(got[base:], dp, src[3:], sp, w, h)
						Fence()
						if i := firstDiff(got, want); i >= 0 {
							t.Fatalf("%s width %d height %d pitches %d/%d at %d: byte %d is %#x, want %#x", f.name, w, h, dp, sp, base, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestMover: problems of StreamBytes and more stream.
func TestMover(t *testing.T) {
	p := &Problem{ItemSize: 2, PageSize: 64, Dims: []int{128, 128}, Heads: 4, Layers: make([]LayerPair, 8)}
	require.Equal(t, 2*64*256*4*8, p.Bytes())
	require.Equal(t, StreamBytes, p.Bytes())
	require.Equal(t, reflect.ValueOf(Stream2D).Pointer(), reflect.ValueOf(Mover(p)).Pointer())
	p.Layers = p.Layers[:7]
	require.Equal(t, reflect.ValueOf(Copy2D).Pointer(), reflect.ValueOf(Mover(p)).Pointer())
	p.Heads = 0
	require.Equal(t, 0, p.Bytes())
}

func TestCopy2DBounds(t *testing.T) {
	for _, f := range []struct {
		name string
		move func(dst []byte, dpitch int, src []byte, spitch, width, height int)
	}{{"Copy2D", Copy2D}, {"Stream2D", Stream2D}} {
		for _, c := range []struct {
			name                         string
			dn, dpitch, sn, spitch, w, h int
			want                         string
		}{
			{"dst short", 255, 256, 512, 256, 128, 2, "slice bounds out of range [:384] with capacity 255"},
			{"src short", 512, 256, 300, 256, 64, 2, "slice bounds out of range [:320] with capacity 300"},
			{"negative pitch", 512, -256, 512, 256, 64, 2, "kernel." + f.name + ": negative pitch"},
		} {
			t.Run(f.name+" "+c.name, func(t *testing.T) {
				dst := make([]byte, c.dn)
				defer func() {
					r := recover()
					if r == nil {
						t.Fatal("no panic")
					}
					if got := fmt.Sprint(r); !strings.Contains(got, c.want) {
						t.Fatalf("panic %q, want it to say %q", got, c.want)
					}
					if !bytes.Equal(dst, make([]byte, c.dn)) {
						t.Fatal("bytes written before the panic")
					}
				}()
				f.move(dst, c.dpitch, make([]byte, c.sn), c.spitch, c.w, c.h)
			})
		}
	}
}

// BenchmarkCopy2D: 256-byte rows scattered over a 2.5 MiB destination
// (the 70B read's pattern: a head of 128 bf16 values a row, every other
// slot of 256 bytes), streamed or not, against one copy() a row over the
// same rows.
func BenchmarkCopy2D(b *testing.B) {
	const width, rows = 256, 5120
	src := make([]byte, width*rows)
	dst := make([]byte, 2*width*rows)
	b.Run("Copy2D", func(b *testing.B) {
		b.SetBytes(width * rows)
		for range b.N {
			Copy2D(dst, 2*width, src, width, width, rows)
		}
	})
	b.Run("Stream2D", func(b *testing.B) {
		b.SetBytes(width * rows)
		for range b.N {
			Stream2D(dst, 2*width, src, width, width, rows)
			Fence()
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(width * rows)
		for range b.N {
			copy2DGeneric(dst, 2*width, src, width, width, rows)
		}
	})
}
