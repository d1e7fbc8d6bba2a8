// Package redisstore keeps kvreshard's multipart objects in Redis (or
// Valkey), on one server or on a Redis Cluster. It registers the URL schemes
//
//	redis://[user:password@]host:port[/db][?ttl=10m&lease=30s]
//	redis+cluster://[user:password@]host:port,host:port,...[?ttl=10m&lease=30s]
//
// The options: ttl, when set, makes the keys of a page expire that long
// after its last part write (manifests never expire); lease (default
// store.DefaultLease, 10 minutes) is how long an incomplete page's claim
// must have gone unwritten before a writer of another layout may take the
// page over. A redis URL must name a server that is not a cluster node, a
// redis+cluster URL one or more nodes of a cluster.
//
// # Keys
//
// A page (object) with key K keeps its state in the hash {K}:3:meta and
// part i in the string {K}:3:p:i (3: the format of the keys and of the
// parts' bytes, which carry their checksums), where K is escaped (% { } become %25 %7B %7D) so
// that the braces are its hash tag: a page's keys share one slot, and
// different pages spread over the cluster. The state holds the manifest
// key, the part count, the count of parts written, the server's time of
// the last part write, and a mark of each written part. A manifest (metadata object) with key M is the string meta:M, without
// expiry.
//
// # Atomicity
//
// A Lua script (EVALSHA, EVAL when the server lacks it) writes a part: in one
// step on the server it checks the page's state, claims it (the first writer
// fixes manifest and part count), stores the part, marks it and counts
// it. Another manifest or part count on an incomplete page gives
// store.ErrLayoutConflict, a complete page store.ErrComplete, and neither
// writes anything. The fragments of a part are joined on the client into
// one argument (the copy that also frees the caller's buffers), so the
// script does a single SET; joining in Lua would copy again inside the
// single-threaded server, and a chain of APPENDs would not be atomic.
//
// A page is complete when its state says every part is written and every
// part key exists, so a page that lost a part (TTL, eviction) is a miss,
// never partial data. The first query, read or write that meets a page
// that was complete and has lost a part deletes its meta hash and every
// part key, so that the parts left do not hold memory (see stateScript);
// writers of any layout then write it as a new page. A part lost before
// its page is complete is kept with it: the part's writer writes it again
// when it retries.
//
// A manifest may be evicted too (under an allkeys-* maxmemory policy):
// its pages are then misses for readers that do not hold it already,
// until a writer of the layout stores it again (reshard.Writer does
// before it reports a page written). A page may also lose its meta hash
// and keep parts: nothing then tells how many there are, and they are
// left to expire (with a ttl), to the server to evict (no state check
// touches them again) or to the next claim of the page to overwrite.
//
// # Takeover
//
// An incomplete page whose last part write is older than the lease (by the
// server's clock) is taken over by the next writer of another layout, in
// the same script: the old state and parts are deleted and the write claims
// the page as new. Every part write, a retry too, refreshes the time, so a
// writer that is still writing keeps its page; a complete page is never
// taken over. This frees the pages of a killed writer without a TTL; with
// a TTL the same rule holds, and an abandoned page also expires.
//
// # Unreadable state
//
// Every count and size read from the server is checked before it is used
// (a part count from 1 to store.MaxParts, a manifest key of at most 4096
// bytes). A page whose state cannot be read (garbage in its hash, a key of
// the wrong type) is reported in its own store.Object.Err by Query, and
// ReadRanges stops at it with a *store.RangeError; the other pages are
// answered as usual. A write to it fails with the reason, until a lease has
// passed since the first such failure; then it is taken over by any
// layout. A metadata object longer than store.MaxMetaBytes is refused
// without being sent.
//
// # Reads
//
// ReadRanges sends pipelined GETRANGE commands in round trips of at most
// 16 MiB of replies (2 MiB of replies shorter than 64 KiB), each led by a
// state check of every page it touches. On one server the replies are
// streamed (rueidis's DoMultiStream, on a connection of its own): their
// bytes go from the connection straight into the ranges' Dst segments. On
// a cluster each round trip is a pipeline per node whose replies are
// copied into the segments.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/kvreshard/kvreshard/runtime/store"
)

func init() {
	open := func(ctx context.Context, u *url.URL) (store.Store, error) {
		c, err := parseURL(u)
		if err != nil {
			return nil, err
		}
		return New(ctx, c)
	}
	store.Register("redis", open)
	store.Register("redis+cluster", open)
}

// Store is a store.Store on Redis.
type Store struct {
	c      rueidis.Client
	name   string // the addresses, for errors
	ttl    string // TTL in ms, an argument of writeScript
	lease  string // lease in ms, an argument of writeScript
	stream bool   // ReadRanges streams replies (one server, not a cluster)

	// trip bounds ReadRanges' round trips (defaultTrip); onBatchRead, when
	// set, runs after each. Tests change them.
	trip        tripLimits
	onBatchRead func()
}

var _ store.Store = (*Store)(nil)

// New connects to the server or cluster that c names.
func New(ctx context.Context, c Config) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(c.Addrs) == 0 {
		return nil, errors.New("redis store: no address")
	}
	timeout := c.DialTimeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	name := c.String()
	opt := rueidis.ClientOption{
		InitAddress:  c.Addrs,
		Username:     c.Username,
		Password:     c.Password,
		SelectDB:     c.DB,
		Dialer:       net.Dialer{Timeout: timeout, KeepAlive: time.Second},
		DisableCache: true,
		// Retry a read-only command twice after a network error, then
		// report it: a dead server is an error, not a wait.
		RetryDelay: func(attempts int, _ rueidis.Completed, _ error) time.Duration {
			if attempts > 2 {
				return -1
			}
			return 20 * time.Millisecond
		},
	}
	if !c.Cluster {
		opt.ForceSingleClient = true
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		if c.Cluster && strings.Contains(err.Error(), "cluster support disabled") {
			return nil, fmt.Errorf("redis store %s: not a cluster node; use redis://", name)
		}
		return nil, fmt.Errorf("redis store %s: cannot connect: %w", name, err)
	}
	if c.Cluster && client.Mode() != rueidis.ClientModeCluster {
		client.Close()
		return nil, fmt.Errorf("redis store %s: not a cluster node; use redis://", name)
	}
	if !c.Cluster {
		// A single client does not look at the server's role: ask.
		info, err := client.Do(ctx, client.B().Info().Section("cluster").Build()).ToString()
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("redis store %s: cannot connect: %w", name, err)
		}
		if strings.Contains(info, "cluster_enabled:1") {
			client.Close()
			return nil, fmt.Errorf("redis store %s: a cluster node; use redis+cluster://", name)
		}
		// ReadRanges streams its state checks with EVALSHA: load the
		// script now rather than lose its first round trip to NOSCRIPT.
		// Best effort: a read that meets NOSCRIPT sends its state
		// checks again with EVAL, which also loads the script.
		_ = client.Do(ctx, client.B().ScriptLoad().Script(state.src).Build()).Error()
	}
	s := &Store{c: client, name: name, ttl: "0", stream: !c.Cluster, trip: defaultTrip}
	if c.TTL > 0 {
		s.ttl = strconv.FormatInt(c.TTL.Milliseconds(), 10)
	}
	lease := c.Lease
	if lease <= 0 {
		lease = store.DefaultLease
	}
	// Whole milliseconds, rounded up.
	ms := lease / time.Millisecond
	if lease%time.Millisecond != 0 {
		ms++
	}
	s.lease = strconv.FormatInt(int64(ms), 10)
	return s, nil
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.c.Close()
	return nil
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// pageKeys returns the meta key and the prefix of the part keys of a page.
func pageKeys(key string) (meta, partPrefix string) {
	tag := pageTag(key)
	return tag + ":3:meta", tag + ":3:p:"
}

// pageTag returns the hash tag that begins every key of a page.
func pageTag(key string) string { return "{" + tagEscaper.Replace(key) + "}" }

// stampKey returns the key of a page's stamp: when a write first found its
// state unreadable (see writeScript).
func stampKey(key string) string { return pageTag(key) + ":3:bad" }

func metaKey(key string) string { return "meta:" + key }

// fail turns an error of the client into the error to return: ctx.Err()
// when the context is done, else the error naming the server.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return fmt.Errorf("redis store %s: %s: %w", s.name, op, err)
}

// Batch limits: commands and bytes sent or received per round trip.
const (
	maxBatchCmds  = 1024
	maxBatchBytes = 8 << 20
)

// WriteParts implements store.Store. A pipeline of writes that meets a
// failed connection (the server restarted, or a proxy dropped an idle
// connection) is sent again, as reads are: writeScript keeps the part a
// first attempt wrote, so sending it again changes nothing, except that
// a page the first attempt completed reports store.ErrComplete.
func (s *Store) WriteParts(ctx context.Context, ws []store.PartWrite) []error {
	errs := make([]error, len(ws))
	var (
		calls []call
		idx   []int
		bytes int
	)
	flush := func() {
		if len(calls) == 0 {
			return
		}
		for j, r := range pipeline(ctx, s.c, calls) {
			i := idx[j]
			op := fmt.Sprintf("write %s part %d", ws[i].Key, ws[i].Part)
			m, err := r.ToMessage()
			if err != nil {
				errs[i] = s.fail(ctx, op, err)
				continue
			}
			if m.IsString() {
				// The page's state cannot be read.
				v, _ := m.ToString()
				if reason, ok := strings.CutPrefix(v, "!"); ok {
					errs[i] = fmt.Errorf("redis store %s: %s: %w", s.name, op, unreadableState(reason))
				} else {
					errs[i] = fmt.Errorf("redis store %s: %s: unexpected script result %.40q", s.name, op, v)
				}
				continue
			}
			switch v, err := m.AsInt64(); {
			case err != nil:
				errs[i] = s.fail(ctx, op, err)
			case v == writeOK:
			case v == writeComplete:
				errs[i] = store.ErrComplete
			case v == writeConflict:
				errs[i] = store.ErrLayoutConflict
			default:
				errs[i] = fmt.Errorf("redis store %s: %s: unexpected script result %d", s.name, op, v)
			}
		}
		calls, idx, bytes = calls[:0], idx[:0], 0
	}
	for i := range ws {
		w := &ws[i]
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		if err := w.Validate(); err != nil {
			errs[i] = err
			continue
		}
		if len(w.Manifest) > maxManifestKey {
			errs[i] = fmt.Errorf("write %s part %d: manifest key of %d bytes is longer than %d", w.Key, w.Part, len(w.Manifest), maxManifestKey)
			continue
		}
		var data strings.Builder
		data.Grow(w.Size())
		for _, f := range w.Data {
			data.Write(f)
		}
		meta, prefix := pageKeys(w.Key)
		part := strconv.Itoa(w.Part)
		calls = append(calls, call{s: writer, retry: true, keys: []string{meta, prefix + part, stampKey(w.Key)},
			args: []string{w.Manifest, strconv.Itoa(w.Parts), part, data.String(), s.ttl, prefix, s.lease}})
		idx = append(idx, i)
		if bytes += w.Size(); bytes >= maxBatchBytes || len(calls) >= maxBatchCmds {
			flush()
		}
	}
	flush()
	return errs
}

func stateCall(key string) call {
	meta, prefix := pageKeys(key)
	return call{s: state, retry: true, keys: []string{meta}, args: []string{prefix}}
}

// decodeState decodes a reply of stateScript: nil for an object that is not
// complete, an object with Err set when the page's state cannot be read.
// The error is that of the reply (the connection, or the server).
func decodeState(v string, err error) (*store.Object, error) {
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if rest, ok := strings.CutPrefix(v, "!"); ok {
		return &store.Object{Err: unreadableState(rest)}, nil
	}
	bad := &store.Object{Err: fmt.Errorf("unexpected state reply %.40q", v)}
	sizes, manifest, ok := strings.Cut(v, "\n")
	// Bound the part count before allocating for it.
	n := strings.Count(sizes, " ") + 1
	if !ok || sizes == "" || n > store.MaxParts || manifest == "" || len(manifest) > maxManifestKey {
		return bad, nil
	}
	o := &store.Object{Complete: true, Manifest: manifest, PartSizes: make([]int, 0, n)}
	for f := range strings.SplitSeq(sizes, " ") {
		size, err := strconv.ParseInt(f, 10, 64)
		if err != nil || size < 0 || size > maxPartSize {
			return bad, nil
		}
		o.PartSizes = append(o.PartSizes, int(size))
	}
	return o, nil
}

// maxPartSize bounds a part's size as a state reply gives it: a Redis
// string is at most 512 MiB unless the server's proto-max-bulk-len allows
// more; past 1 TiB the reply is not believed.
const maxPartSize = 1 << 40

// unreadableState returns the error for the reason inspect (see scripts.go)
// gives for a state it cannot read: lines naming what is wrong, then the
// values that show it.
func unreadableState(reason string) error {
	what, rest, _ := strings.Cut(reason, "\n")
	var msg string
	switch what {
	case "type":
		msg = fmt.Sprintf("the meta key is a %.20s, not a hash", rest)
	case "manifest":
		msg = "no manifest key"
	case "manifest-size":
		msg = fmt.Sprintf("a manifest key of %.20s bytes, longer than %d", rest, maxManifestKey)
	case "parts":
		msg = fmt.Sprintf("part count %.40q is not a number from 1 to %d", rest, store.MaxParts)
		if !strings.Contains(reason, "\n") {
			msg = "no part count"
		}
	case "done":
		n, v, _ := strings.Cut(rest, "\n")
		msg = fmt.Sprintf("count of written parts %.40q is not a number from 0 to %.20s", v, n)
	case "size":
		msg = fmt.Sprintf("the meta hash holds %.20s fields, more than %d", rest, store.MaxParts+4)
	case "fields":
		f := strings.SplitN(rest, "\n", 3)
		if len(f) != 3 {
			return fmt.Errorf("unreadable state: %.40q", reason)
		}
		msg = fmt.Sprintf("the meta hash holds %.20s fields, not the %.20s of %.20s written parts", f[0], f[1], f[2])
	case "mark":
		msg = fmt.Sprintf("part %.20s is counted as written but has no mark", rest)
	case "mark-value":
		i, v, _ := strings.Cut(rest, "\n")
		msg = fmt.Sprintf("the mark of part %.20s is %.40q, not 1", i, v)
	case "part-type":
		i, v, _ := strings.Cut(rest, "\n")
		msg = fmt.Sprintf("part %.20s is a %.20s, not a string", i, v)
	default:
		msg = fmt.Sprintf("%.40q", reason)
	}
	return errors.New("unreadable state: " + msg)
}

// Query implements store.Store.
func (s *Store) Query(ctx context.Context, keys []string) ([]store.Object, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	objs := make([]store.Object, len(keys))
	for start := 0; start < len(keys); start += maxBatchCmds {
		batch := keys[start:min(start+maxBatchCmds, len(keys))]
		calls := make([]call, len(batch))
		for i, k := range batch {
			calls[i] = stateCall(k)
		}
		for i, r := range pipeline(ctx, s.c, calls) {
			o, err := decodeState(r.ToString())
			switch {
			case err != nil:
				return nil, s.fail(ctx, "query "+batch[i], err)
			case o == nil:
			case o.Err != nil:
				objs[start+i].Err = fmt.Errorf("redis store %s: query %s: %w", s.name, batch[i], o.Err)
			default:
				objs[start+i] = *o
			}
		}
	}
	return objs, nil
}

// PutMeta implements store.Store. putMetaScript stores the value or
// compares it with the one stored, in one atomic step on the server.
func (s *Store) PutMeta(ctx context.Context, key string, val []byte) error {
	if err := store.CheckMetaSize(key, int64(len(val))); err != nil {
		return err
	}
	c := call{s: putMeta, retry: true, keys: []string{metaKey(key)}, args: []string{string(val)}}
	v, err := pipeline(ctx, s.c, []call{c})[0].AsInt64()
	switch {
	case err != nil:
		return s.fail(ctx, "put meta "+key, err)
	case v != 0:
		return store.ErrMetaConflict
	}
	return nil
}

// GetMeta implements store.Store. A value longer than store.MaxMetaBytes
// is refused without being sent (getMetaScript).
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	c := call{s: getMeta, retry: true, keys: []string{metaKey(key)}, args: []string{strconv.Itoa(store.MaxMetaBytes)}}
	m, err := pipeline(ctx, s.c, []call{c})[0].ToMessage()
	switch {
	case rueidis.IsRedisNil(err):
		return nil, store.ErrNotFound
	case err != nil:
		return nil, s.fail(ctx, "get meta "+key, err)
	case m.IsInt64():
		n, _ := m.AsInt64()
		if err := store.CheckMetaSize(key, n); err != nil {
			return nil, fmt.Errorf("redis store %s: %w", s.name, err)
		}
		return nil, fmt.Errorf("redis store %s: get meta %s: unexpected script result %d", s.name, key, n)
	}
	v, err := m.AsBytes()
	if err != nil {
		return nil, s.fail(ctx, "get meta "+key, err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}
