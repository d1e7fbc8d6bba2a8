// Package redisstore keeps kvreshard's multipart objects in Redis (or
// Valkey), on one server or on a Redis Cluster. It registers the URL schemes
//
//	redis://[user:password@]host:port[/db][?ttl=10m]
//	redis+cluster://[user:password@]host:port,host:port,...[?ttl=10m]
//
// The only option is ttl: when set, the keys of a page expire that long after
// its last part write (manifests never expire). A redis URL must name a
// server that is not a cluster node, a redis+cluster URL one or more nodes of
// a cluster.
//
// # Keys
//
// A page (object) with key K keeps its metadata in the hash {K}:meta and part
// i in the string {K}:p:i, where K is escaped (% { } become %25 %7B %7D) so
// that the braces are its hash tag: a page's keys share one slot, and
// different pages spread over the cluster. A manifest (metadata object) with
// key M is the string meta:M, without expiry.
//
// # Atomicity
//
// A Lua script (EVALSHA, EVAL when the server lacks it) writes a part: in one
// step on the server it checks the page's state, claims it (the first writer
// fixes manifest and part count), stores the part and counts it. Another
// manifest or part count on an incomplete page gives store.ErrLayoutConflict,
// a complete page store.ErrComplete, and neither writes anything. The
// fragments of a part are joined on the client into one argument (the copy
// that also frees the caller's buffers), so the script does a single SET;
// joining in Lua would copy again inside the single-threaded server, and a
// chain of APPENDs would not be atomic.
//
// A page is complete when its meta says every part is written and every part
// key exists, so a page that lost a part (TTL, eviction) is a miss, never
// partial data. Writers of its own layout may write the lost parts again;
// other layouts are refused until its meta expires.
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
	stream bool   // ReadRanges streams replies (one server, not a cluster)
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
	s := &Store{c: client, name: name, ttl: "0", stream: !c.Cluster}
	if c.TTL > 0 {
		s.ttl = strconv.FormatInt(c.TTL.Milliseconds(), 10)
	}
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
	tag := "{" + tagEscaper.Replace(key) + "}"
	return tag + ":meta", tag + ":p:"
}

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
			v, err := r.AsInt64()
			switch {
			case err != nil:
				errs[i] = s.fail(ctx, fmt.Sprintf("write %s part %d", ws[i].Key, ws[i].Part), err)
			case v == writeOK:
			case v == writeComplete:
				errs[i] = store.ErrComplete
			case v == writeConflict:
				errs[i] = store.ErrLayoutConflict
			default:
				errs[i] = fmt.Errorf("redis store %s: write %s part %d: unexpected script result %d", s.name, ws[i].Key, ws[i].Part, v)
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
		var data strings.Builder
		data.Grow(w.Size())
		for _, f := range w.Data {
			data.Write(f)
		}
		meta, prefix := pageKeys(w.Key)
		part := strconv.Itoa(w.Part)
		calls = append(calls, call{s: writer, retry: true, keys: []string{meta, prefix + part},
			args: []string{w.Manifest, strconv.Itoa(w.Parts), part, data.String(), s.ttl, prefix}})
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
// complete.
func decodeState(v string, err error) (*store.Object, error) {
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sizes, manifest, ok := strings.Cut(v, "\n")
	if !ok || sizes == "" {
		return nil, fmt.Errorf("unexpected state reply %.40q", v)
	}
	o := &store.Object{Complete: true, Manifest: manifest, PartSizes: make([]int, 0, strings.Count(sizes, " ")+1)}
	for f := range strings.SplitSeq(sizes, " ") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("unexpected state reply %.40q", v)
		}
		o.PartSizes = append(o.PartSizes, n)
	}
	return o, nil
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
			if err != nil {
				return nil, s.fail(ctx, "query "+batch[i], err)
			}
			if o != nil {
				objs[start+i] = *o
			}
		}
	}
	return objs, nil
}

// PutMeta implements store.Store. SET NX GET stores the value or returns the
// one stored, in one atomic command.
func (s *Store) PutMeta(ctx context.Context, key string, val []byte) error {
	cmd := s.c.B().Set().Key(metaKey(key)).Value(string(val)).Nx().Get().Build()
	old, err := s.c.Do(ctx, cmd).ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return nil
	case err != nil:
		return s.fail(ctx, "put meta "+key, err)
	case old != string(val):
		return store.ErrMetaConflict
	}
	return nil
}

// GetMeta implements store.Store.
func (s *Store) GetMeta(ctx context.Context, key string) ([]byte, error) {
	v, err := s.c.Do(ctx, s.c.B().Get().Key(metaKey(key)).Build()).AsBytes()
	switch {
	case rueidis.IsRedisNil(err):
		return nil, store.ErrNotFound
	case err != nil:
		return nil, s.fail(ctx, "get meta "+key, err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}
