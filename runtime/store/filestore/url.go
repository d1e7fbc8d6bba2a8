// The file: URL scheme and its query parameters.

package filestore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvreshard/kvreshard/runtime/store"
)

func init() { store.Register("file", openURL) }

func openURL(_ context.Context, u *url.URL) (store.Store, error) {
	bad := func(reason string) (store.Store, error) {
		s := u.String()
		if u.Opaque == "" && !strings.HasPrefix(s, "file://") {
			s = "file://" + strings.TrimPrefix(s, "file:") // file:// prints as file:
		}
		return nil, &store.URLError{URL: s, Reason: reason}
	}
	switch {
	case u.User != nil:
		return bad("a file URL takes no user")
	case u.Host != "" && u.Host != "localhost":
		return bad(fmt.Sprintf("host %q is not empty or localhost; write file:///abs/dir, with three slashes", u.Host))
	case u.ForceQuery && u.RawQuery == "":
		return bad("empty query string; a file URL takes only ?lease= and ?lock-wait=")
	case u.Fragment != "":
		return bad("a file URL takes no fragment")
	case u.Path == "":
		return bad("empty path; write file:///abs/dir")
	case !filepath.IsAbs(u.Path):
		return bad(fmt.Sprintf("path %q is not absolute; write file:///abs/dir", u.Path))
	}
	opts, err := parseQuery(u.RawQuery)
	if err != nil {
		return bad(err.Error())
	}
	return Open(u.Path, opts)
}

// parseQuery parses the raw query of a file URL: lease and lock-wait, each
// at most once, positive Go durations. Its error is the reason of a
// *store.URLError.
func parseQuery(rawQuery string) (Options, error) {
	var opts Options
	if rawQuery == "" {
		return opts, nil
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return Options{}, errors.New("cannot parse the query: " + err.Error())
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q[k]
		switch {
		case k != "lease" && k != "lock-wait":
			return Options{}, fmt.Errorf("unknown parameter %q; a file URL takes only lease and lock-wait", k)
		case len(v) != 1:
			return Options{}, fmt.Errorf("%s is given more than once", k)
		case k == "lease":
			opts.Lease, err = store.ParseLease(v[0])
		default:
			opts.LockWait, err = time.ParseDuration(v[0])
			switch {
			case err != nil || opts.LockWait <= 0:
				err = fmt.Errorf("lock-wait %q is not a positive duration such as 500ms or 5s", v[0])
			case opts.LockWait > MaxLockWait:
				err = fmt.Errorf("lock-wait %q is more than %v", v[0], MaxLockWait)
			}
		}
		if err != nil {
			return Options{}, err
		}
	}
	return opts, nil
}
