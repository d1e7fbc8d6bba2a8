package reshard

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvreshard/kvreshard/runtime/partsum"
)

// Result is what one Read did.
type Result struct {
	// Hit is the number of leading pages read in full; only they may be
	// used.
	Hit   int
	Bytes int
	Ops   int
	// Stop says why the read stopped before the last requested page: a
	// miss, a rejected manifest, the budget, cancellation, a part that
	// failed its checksum, or a failed query or read (Classify sorts them).
	// It is nil when every page was read.
	Stop error
}

// Errors that say why a read stopped early.
var (
	// ErrMiss: the page is missing or incomplete, or its part vanished
	// (evicted or rewritten in another layout) between the query and the
	// read; then the store's error is wrapped too.
	ErrMiss = errors.New("page missing or incomplete")
	// ErrBudget: the page is past the reader's prefetch budget.
	ErrBudget = errors.New("prefetch budget reached")
	// ErrManifest: the page's manifest is missing, corrupt or of another
	// model domain, does not match the stored object, or describes a layout
	// this reader cannot plan (no compiled kernel when they are required,
	// over the plan limits, another page geometry).
	ErrManifest = errors.New("manifest rejected")
)

// StopReason is the kind of a Result.Stop, for callers that map it to a
// code (the C binding) or an exit status (kvreshard read).
type StopReason uint8

// The kinds of Result.Stop.
const (
	StopNone     StopReason = iota // nil: every page was read
	StopMiss                       // ErrMiss: a cache miss, not a failure
	StopBudget                     // ErrBudget: the prefetch budget, not a failure
	StopCanceled                   // the context was canceled or its deadline passed
	StopRejected                   // ErrManifest: the page's layout was refused
	StopChecksum                   // partsum.ErrMismatch: a part's bytes are corrupt
	StopFailed                     // a failed query or read, an unreadable object
)

var stopNames = [...]string{"none", "miss", "budget", "canceled", "rejected", "checksum", "failed"}

func (s StopReason) String() string {
	if int(s) < len(stopNames) {
		return stopNames[s]
	}
	return fmt.Sprintf("stop(%d)", s)
}

// Classify returns the kind of a Result.Stop.
func Classify(stop error) StopReason {
	switch {
	case stop == nil:
		return StopNone
	case errors.Is(stop, ErrMiss):
		return StopMiss
	case errors.Is(stop, ErrBudget):
		return StopBudget
	case errors.Is(stop, context.Canceled), errors.Is(stop, context.DeadlineExceeded):
		return StopCanceled
	case errors.Is(stop, partsum.ErrMismatch):
		return StopChecksum
	case errors.Is(stop, ErrManifest):
		return StopRejected
	}
	return StopFailed
}

// rejected marks an error that refuses a page's layout as ErrManifest,
// keeping its text.
type rejected struct{ err error }

func (e rejected) Error() string        { return e.err.Error() }
func (e rejected) Unwrap() error        { return e.err }
func (e rejected) Is(target error) bool { return target == ErrManifest }
