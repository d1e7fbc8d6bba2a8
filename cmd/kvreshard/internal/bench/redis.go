package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/kvreshard/kvreshard/internal/content"
	"github.com/kvreshard/kvreshard/internal/redisserver"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/store"
	_ "github.com/kvreshard/kvreshard/runtime/store/redisstore" // redis:// URLs
)

// StartRedis starts a redis-server on a free loopback port, in a
// temporary directory, and returns its URL and how to stop it (which kills
// the server and removes the directory). The error says why it could not,
// such as redis-server not being installed.
func StartRedis() (serverURL string, stop func(), err error) {
	srv, err := redisserver.Start(context.Background(), redisserver.Options{})
	if err != nil {
		return "", nil, err
	}
	return srv.URL(), func() { srv.Close() }, nil
}

// redis measures the Redis figures (redis_vs_get, redis_getrange_vs_get,
// redis_vs_get_parts, reshard_gbps_redis, auto_regret_redis,
// checksum_cost_range_redis), or skips
// them with the reason no server could be started.
func (c *case70) redis(ctx context.Context, o *Options) ([]Figure, error) {
	u, stop, err := o.Redis()
	if err != nil {
		reason := "no Redis server: " + err.Error()
		return []Figure{
			{Name: "redis_vs_get", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.8", Skipped: reason},
			{Name: "redis_getrange_vs_get", Unit: "x", BaselineUnit: "GB/s", Skipped: reason},
			{Name: "redis_vs_get_parts", Unit: "x", BaselineUnit: "GB/s", Skipped: reason},
			{Name: "reshard_gbps_redis", Unit: "GB/s", BaselineUnit: "GB/s", Skipped: reason},
			{Name: "auto_regret_redis", Unit: "x", BaselineUnit: "GB/s", Target: "<= 1.1", Skipped: reason},
			{Name: "checksum_cost_range_redis", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.9", Skipped: reason},
		}, nil
	}
	defer stop()
	st, err := store.Open(ctx, u)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	keys := content.PageKeys("bench-redis", c.model.Domain(), c.sz.pages)
	if err := c.write(ctx, st, keys); err != nil {
		return nil, err
	}
	rs, readOnce, err := c.reader(ctx, st, keys, c.reshard, placement.Rank{}, auto(plan.RedisTransport()))
	if err != nil {
		return nil, err
	}
	regret, runs, err := c.regret(ctx, st, keys, plan.RedisTransport(), "auto_regret_redis")
	if err != nil {
		return nil, err
	}
	dr := runs[plan.Direct]
	cl, err := getClient(u)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	// Values of the size the reader reads of a page, and the two whole
	// parts that hold its bytes.
	size := rs.bytes / len(keys)
	getOnce, err := getBaseline(ctx, cl, "bench-get-", len(keys), size)
	if err != nil {
		return nil, err
	}
	partsOnce, err := getBaseline(ctx, cl, "bench-parts-", 2*len(keys), c.m.PartBytes(0))
	if err != nil {
		return nil, err
	}
	rangesOnce, err := c.getrangeBaseline(ctx, cl, "bench-parts-", len(keys))
	if err != nil {
		return nil, err
	}
	// In turns, as the memory figure: the ratios are the medians of the
	// turns', which see the same load.
	get, parts := reading{bytes: rs.bytes}, reading{bytes: rs.bytes} // parts: counting the bytes needed
	var vsGet, vsParts, rangesVsGet float64
	if rs.best, get.best, vsGet, err = pairwiseErr(3*c.sz.reps, 1, readOnce, getOnce); err != nil {
		return nil, err
	}
	var ranges, getAgain time.Duration
	if ranges, getAgain, rangesVsGet, err = pairwiseErr(3*c.sz.reps, 1, rangesOnce, getOnce); err != nil {
		return nil, err
	}
	get.best = min(get.best, getAgain)
	var again time.Duration
	if again, parts.best, vsParts, err = pairwiseErr(3*c.sz.reps, 1, readOnce, partsOnce); err != nil {
		return nil, err
	}
	rs.best = min(rs.best, again, runs[regret.pick].best)
	partsFig := Figure{Name: "redis_vs_get_parts", Value: round(vsParts), Unit: "x", Baseline: round(parts.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("the resharded reads against pipelined GET of the two whole parts (%d bytes each) that hold each page's bytes, streamed, counting the bytes needed (%.2f GB/s of parts read): what a reader without range reads would fetch before copying; median of %d turns",
			c.m.PartBytes(0), gbps(2*len(keys)*c.m.PartBytes(0), parts.best), 3*c.sz.reps)}
	vs := Figure{Name: "redis_vs_get", Value: round(vsGet), Unit: "x", Baseline: round(get.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages, TP 4/PP 2 rank 0/0: auto %s (%d ops a page) %.2f GB/s; pipelined GET of %d values of %d bytes into a buffer, streamed as the store streams its reads: %.2f GB/s; median of %d turns",
			len(keys), rs.strategy, rs.ops, rs.gbps(), len(keys), size, get.gbps(), 3*c.sz.reps)}
	atLeast(&vs, 0.8)
	rangesFig := Figure{Name: "redis_getrange_vs_get", Value: round(rangesVsGet), Unit: "x", Baseline: round(get.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("the server's share, without kvreshard: the same %d spans a page read by plain pipelined GETRANGE (a page a round trip, streamed into a buffer; %.2f GB/s), against the GET baseline above: what a range reader without kvreshard gets from this server, the reference for redis_vs_get; median of %d turns",
			2*len(c.d.HeadDims)*c.d.PageSize, gbps(rs.bytes, ranges), 3*c.sz.reps)}
	g := Figure{Name: "reshard_gbps_redis", Value: round(rs.gbps()), Unit: "GB/s", Baseline: round(dr.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages from Redis, TP 4/PP 2 rank 0/0: auto %s (%d ops a page); baseline: direct (%d GETRANGEs a page), best of %d turns",
			len(keys), rs.strategy, rs.ops, dr.ops, regret.turns)}
	sums, err := c.checksumRange(ctx, st, "bench-redis-tp1", plan.RedisTransport(), "checksum_cost_range_redis", "Redis")
	if err != nil {
		return nil, err
	}
	return []Figure{vs, rangesFig, partsFig, g, regret.fig, sums}, nil
}

// getClient connects to the server of a redis:// URL for the GET
// baselines.
func getClient(serverURL string) (rueidis.Client, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, err
	}
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{u.Host}, DisableCache: true})
}

// getBaseline stores n values of size bytes under prefix0, prefix1, ...,
// reads them once and checks them, and returns the read to time: one
// pipelined GET of all of them into a buffer, as a read into a pool would
// be. The replies are streamed (DoMultiStream), each value's bytes written
// straight into its place in the buffer: the same client method as the
// Redis store's reads, and the faster one for the baseline too (no reply
// value allocated and copied again).
func getBaseline(ctx context.Context, cl rueidis.Client, prefix string, n, size int) (func() error, error) {
	val := make([]byte, size)
	for i := range val {
		val[i] = byte(i * 7)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
		if err := cl.Do(ctx, cl.B().Set().Key(keys[i]).Value(rueidis.BinaryString(val)).Build()).Error(); err != nil {
			return nil, err
		}
	}
	pool := make([]byte, size*len(keys))
	once := func() error {
		cmds := make(rueidis.Commands, len(keys))
		for i, k := range keys {
			cmds[i] = cl.B().Get().Key(k).Build()
		}
		st := cl.DoMultiStream(ctx, cmds...)
		for i := 0; st.HasNext(); i++ {
			n, err := st.WriteTo(&sliceWriter{b: pool[i*size : (i+1)*size]})
			if err != nil {
				for st.HasNext() {
					st.WriteTo(io.Discard)
				}
				return err
			}
			if n != int64(size) {
				return fmt.Errorf("GET %s: %d bytes, want %d", keys[i], n, size)
			}
		}
		if err := st.Error(); err != io.EOF {
			return err
		}
		return nil
	}
	if err := once(); err != nil {
		return nil, err
	}
	for i := range keys {
		if !bytes.Equal(pool[i*size:(i+1)*size], val) {
			return nil, fmt.Errorf("GET %s: the bytes read differ from the bytes stored", keys[i])
		}
	}
	return once, nil
}

// getrangeBaseline returns a read of the resharding reader's spans of
// pages pages out of the whole parts stored by getBaseline under prefix
// (two a page, parts 0 and 1): a token's layers 0-39 of each part and
// component, with one pipelined GETRANGE each, a page a round trip,
// streamed into a buffer. It checks the bytes of one read first.
func (c *case70) getrangeBaseline(ctx context.Context, cl rueidis.Client, prefix string, pages int) (func() error, error) {
	span, pitch, tokens := c.spans()
	perPage := 2 * len(c.d.HeadDims) * tokens
	buf := make([]byte, pages*perPage*span)
	once := func() error {
		cmds := make(rueidis.Commands, 0, perPage)
		for p := range pages {
			cmds = cmds[:0]
			for h := range 2 {
				key := prefix + strconv.Itoa(2*p+h)
				for comp := range c.d.HeadDims {
					for t := range tokens {
						start := (comp*tokens + t) * pitch
						cmds = append(cmds, cl.B().Getrange().Key(key).Start(int64(start)).End(int64(start+span-1)).Build())
					}
				}
			}
			st := cl.DoMultiStream(ctx, cmds...)
			for i := 0; st.HasNext(); i++ {
				at := (p*perPage + i) * span
				n, err := st.WriteTo(&sliceWriter{b: buf[at : at+span]})
				if err == nil && n != int64(span) {
					err = fmt.Errorf("GETRANGE: %d bytes, want %d", n, span)
				}
				if err != nil {
					for st.HasNext() {
						st.WriteTo(io.Discard)
					}
					return err
				}
			}
			if err := st.Error(); err != io.EOF {
				return err
			}
		}
		return nil
	}
	if err := once(); err != nil {
		return nil, err
	}
	// getBaseline's values: byte i is byte(i*7).
	for i := range pages * perPage {
		comp, t := i%(len(c.d.HeadDims)*tokens)/tokens, i%tokens
		start := (comp*tokens + t) * pitch
		for j, b := range buf[i*span : (i+1)*span] {
			if b != byte((start+j)*7) {
				return nil, fmt.Errorf("GETRANGE span %d: byte %d is %d, want %d", i, j, b, byte((start+j)*7))
			}
		}
	}
	return once, nil
}

// sliceWriter writes a streamed value into b; bytes past its end are
// counted, not written.
type sliceWriter struct{ b []byte }

func (w *sliceWriter) Write(p []byte) (int, error) {
	w.b = w.b[copy(w.b, p):]
	return len(p), nil
}

// ReadFrom reads the value straight into b (io.Copy calls it).
func (w *sliceWriter) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.ReadFull(r, w.b)
	w.b = w.b[n:]
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return int64(n), nil
	}
	if err != nil {
		return int64(n), err
	}
	m, err := io.Copy(io.Discard, r)
	return int64(n) + m, err
}
