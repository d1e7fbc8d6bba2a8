package main

import (
	"errors"
	"fmt"

	"github.com/kvreshard/kvreshard/runtime/reshard"
)

// The constants of kvreshard.h, defined again in Go so that the Go side
// does not depend on the header for its meaning; TestHeaderConstants checks
// that every one equals the header's.
const (
	abiVersion = 2
	abiMinor   = 1

	kvrOK        = 0
	kvrEInval    = 1
	kvrEStore    = 2
	kvrEManifest = 3
	kvrEClosed   = 4
	kvrEFork     = 5
	kvrEInternal = 6

	kvrWritten  = 0
	kvrComplete = 1
	kvrRefused  = 2
	kvrReplica  = 3
	kvrFailed   = 4

	kvrStopNone     = 0
	kvrStopMiss     = 1
	kvrStopBudget   = 2
	kvrStopCanceled = 3
	kvrStopManifest = 4
	kvrStopFailed   = 5
	kvrStopChecksum = 6

	kvrMaxProcs = 1024
)

// headerConstants names each constant as kvreshard.h does.
var headerConstants = map[string]int{
	"KVR_ABI_VERSION": abiVersion, "KVR_ABI_MINOR": abiMinor,

	"KVR_OK": kvrOK, "KVR_EINVAL": kvrEInval, "KVR_ESTORE": kvrEStore, "KVR_EMANIFEST": kvrEManifest,
	"KVR_ECLOSED": kvrEClosed, "KVR_EFORK": kvrEFork, "KVR_EINTERNAL": kvrEInternal,

	"KVR_WRITTEN": kvrWritten, "KVR_COMPLETE": kvrComplete, "KVR_REFUSED": kvrRefused,
	"KVR_REPLICA": kvrReplica, "KVR_FAILED": kvrFailed,

	"KVR_STOP_NONE": kvrStopNone, "KVR_STOP_MISS": kvrStopMiss, "KVR_STOP_BUDGET": kvrStopBudget,
	"KVR_STOP_CANCELED": kvrStopCanceled, "KVR_STOP_MANIFEST": kvrStopManifest, "KVR_STOP_FAILED": kvrStopFailed,
	"KVR_STOP_CHECKSUM": kvrStopChecksum,

	"KVR_MAX_PROCS": kvrMaxProcs,
}

// apiError is an error with the code the C function returns for it.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) error {
	return &apiError{code, fmt.Sprintf(format, args...)}
}

// invalidf is a bad argument.
func invalidf(format string, args ...any) error { return errorf(kvrEInval, format, args...) }

// codeOf returns the code of err: KVR_OK for nil, the code of an
// *apiError, else KVR_EINTERNAL (an error nobody classified is a bug).
func codeOf(err error) int {
	if err == nil {
		return kvrOK
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code
	}
	return kvrEInternal
}

// statusCode is the KVR_* byte of a page's write status.
func statusCode(s reshard.Status) uint8 {
	switch s {
	case reshard.Written:
		return kvrWritten
	case reshard.Complete:
		return kvrComplete
	case reshard.Refused:
		return kvrRefused
	case reshard.Replica:
		return kvrReplica
	}
	return kvrFailed
}

// stopCode is the KVR_STOP_* of why a read stopped (Result.Stop), as
// reshard.Classify sorts it: KVR_STOP_FAILED is the store's failure, which
// kvr_reader_read returns as KVR_ESTORE; a part that failed its checksums
// is KVR_STOP_CHECKSUM, with KVR_OK.
func stopCode(stop error) int {
	switch reshard.Classify(stop) {
	case reshard.StopNone:
		return kvrStopNone
	case reshard.StopMiss:
		return kvrStopMiss
	case reshard.StopBudget:
		return kvrStopBudget
	case reshard.StopCanceled:
		return kvrStopCanceled
	case reshard.StopRejected:
		return kvrStopManifest
	case reshard.StopChecksum:
		return kvrStopChecksum
	}
	return kvrStopFailed
}
