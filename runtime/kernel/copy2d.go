package kernel

// Copy2D copies height rows of width bytes: row i from src[i*spitch:] to
// dst[i*dpitch:], as cudaMemcpy2D does between two pitched buffers. It is
// the innermost loop of a copy kernel whose runs cannot continue each
// other, one call for all of them: on amd64 with AVX2 the rows are moved by
// a loop of 32-byte loads and stores, with no call and no size dispatch
// per row, which is what makes a kernel of 256-byte runs as fast as copy()
// of as many contiguous bytes (see BenchmarkCopy in layouts/).
//
// src and dst must not overlap. A row past the end of either buffer, or a
// negative pitch, panics before anything is copied.
func Copy2D(dst []byte, dpitch int, src []byte, spitch, width, height int) {
	if rows2D("Copy2D", dst, dpitch, src, spitch, width, height) {
		copy2D(dst, dpitch, src, spitch, width, height)
	}
}

// Stream2D is Copy2D for a large transfer into memory the caller will not
// read soon, such as pages written into a host pool: where the rows are
// dense in the destination (its pitch at most 4 rows), 32-byte aligned and
// a multiple of 32 bytes long, it stores them past the caches with
// non-temporal stores, as copy() does for copies of 1 MiB and more, which
// saves reading every destination line before writing it. Elsewhere it is
// Copy2D: rows of 256 bytes 512 KiB apart ran at half the speed streamed.
//
// Its stores are weakly ordered: call Fence after the last Stream2D and
// before anything else may read dst. A copy kernel fences once before it
// returns (a fence per call cost a fifth of the kernel's throughput).
func Stream2D(dst []byte, dpitch int, src []byte, spitch, width, height int) {
	if rows2D("Stream2D", dst, dpitch, src, spitch, width, height) {
		stream2D(dst, dpitch, src, spitch, width, height)
	}
}

// rows2D reports whether there are rows to move, and panics, naming fn,
// when a pitch is negative or the last row lies past either buffer's end
// (the other rows come before it).
func rows2D(fn string, dst []byte, dpitch int, src []byte, spitch, width, height int) bool {
	if height <= 0 || width <= 0 {
		return false
	}
	if dpitch < 0 || spitch < 0 {
		panic("kernel." + fn + ": negative pitch")
	}
	_ = dst[(height-1)*dpitch : (height-1)*dpitch+width]
	_ = src[(height-1)*spitch : (height-1)*spitch+width]
	return true
}

// StreamBytes is the size of a copy kernel's problem from which it moves
// its rows with Stream2D rather than Copy2D: the size from which copy()
// itself streams.
const StreamBytes = 1 << 20

// Mover returns the row mover of a copy kernel for problem p: Stream2D when
// p moves StreamBytes or more, Copy2D otherwise.
func Mover(p *Problem) func(dst []byte, dpitch int, src []byte, spitch, width, height int) {
	if p.Bytes() >= StreamBytes {
		return Stream2D
	}
	return Copy2D
}

// copy2DGeneric is Copy2D with one copy() a row: the fallback, and the
// path for rows too short or too long for the vector loop.
func copy2DGeneric(dst []byte, dpitch int, src []byte, spitch, width, height int) {
	for i := 0; i < height; i++ {
		copy(dst[i*dpitch:i*dpitch+width], src[i*spitch:i*spitch+width])
	}
}
