package filestore

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futimens sets the access and modification times of the open file fd to
// t: utimensat with no path, which acts on fd itself (what glibc's futimens
// does), to the nanosecond.
func futimens(fd int, t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	times := [2]unix.Timespec{ts, ts}
	if _, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&times)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}
