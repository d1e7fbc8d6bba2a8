//go:build amd64 && !purego

package kernel

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// vectorMax is the widest row the vector loop takes: longer rows go to
// copy(), whose memmove switches to non-temporal stores for large sizes.
const vectorMax = 4096

var useAVX2 = cpu.X86.HasAVX2

func copy2D(dst []byte, dpitch int, src []byte, spitch, width, height int) {
	if !useAVX2 || width < 16 || width > vectorMax {
		copy2DGeneric(dst, dpitch, src, spitch, width, height)
		return
	}
	copy2DAVX2(&dst[0], dpitch, &src[0], spitch, width, height)
}

// copy2DAVX2 moves height rows of width bytes, 16 <= width; the caller has
// checked the bounds.
//
//go:noescape
func copy2DAVX2(dst *byte, dpitch int, src *byte, spitch, width, height int)

// streamDensity bounds the destination pitch Stream2D stores past the
// caches at, in row widths: rows far apart defeat the write combining that
// makes non-temporal stores fast (see Stream2D).
const streamDensity = 4

func stream2D(dst []byte, dpitch int, src []byte, spitch, width, height int) {
	if !useAVX2 || width%32 != 0 || dpitch%32 != 0 || dpitch > streamDensity*width || uintptr(unsafe.Pointer(&dst[0]))%32 != 0 {
		copy2D(dst, dpitch, src, spitch, width, height)
		return
	}
	stream2DAVX2(&dst[0], dpitch, &src[0], spitch, width, height)
}

// stream2DAVX2 moves height rows of width bytes, width a positive multiple
// of 32, to a 32-byte aligned destination with a pitch of a multiple of 32,
// with non-temporal stores and no fence; the caller has checked the bounds.
//
//go:noescape
func stream2DAVX2(dst *byte, dpitch int, src *byte, spitch, width, height int)

// Fence orders the non-temporal stores of Stream2D before every later
// store (SFENCE).
func Fence()
