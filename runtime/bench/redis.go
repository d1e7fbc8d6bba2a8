package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/kvreshard/kvreshard/runtime/content"
	"github.com/kvreshard/kvreshard/runtime/placement"
	"github.com/kvreshard/kvreshard/runtime/plan"
	"github.com/kvreshard/kvreshard/runtime/store"
	_ "github.com/kvreshard/kvreshard/runtime/store/redisstore" // redis:// URLs
	"github.com/kvreshard/kvreshard/runtime/store/redisstore/redistest"
)

// StartRedis starts a redis-server on a free loopback port with
// redistest, as the tests do, and returns its URL and how to stop it. The
// error says why it could not, such as redis-server not being installed.
func StartRedis() (serverURL string, stop func(), err error) {
	t := &tb{}
	defer func() {
		if r := recover(); r != nil {
			s, ok := r.(tbStop)
			if !ok {
				panic(r)
			}
			t.cleanup()
			serverURL, stop, err = "", nil, errors.New(string(s))
		}
	}()
	srv := redistest.StartServer(t)
	return srv.URL(), t.cleanup, nil
}

// tb is what redistest needs of a testing.TB, outside a test: failing or
// skipping stops the start with a tbStop panic, which StartRedis turns
// into an error, and cleanups run when the server is stopped.
type tb struct {
	testing.TB // not set: the methods below are all redistest calls
	cleanups   []func()
}

type tbStop string

func (t *tb) Helper()                        {}
func (t *tb) Fatal(args ...any)              { panic(tbStop(fmt.Sprint(args...))) }
func (t *tb) Fatalf(format string, a ...any) { panic(tbStop(fmt.Sprintf(format, a...))) }
func (t *tb) Skip(args ...any)               { panic(tbStop(fmt.Sprint(args...))) }
func (t *tb) Cleanup(f func())               { t.cleanups = append(t.cleanups, f) }

func (t *tb) TempDir() string {
	dir, err := os.MkdirTemp("", "kvreshard-redis-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (t *tb) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}

// redis measures redis_vs_get and reshard_gbps_redis, or skips them with
// the reason no server could be started.
func (c *case70) redis(ctx context.Context, o *Options) ([]Figure, error) {
	u, stop, err := o.Redis()
	if err != nil {
		reason := "no Redis server: " + err.Error()
		return []Figure{
			{Name: "redis_vs_get", Unit: "x", BaselineUnit: "GB/s", Target: ">= 0.8", Skipped: reason},
			{Name: "redis_vs_get_parts", Unit: "x", BaselineUnit: "GB/s", Skipped: reason},
			{Name: "reshard_gbps_redis", Unit: "GB/s", BaselineUnit: "GB/s", Skipped: reason},
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
	rs, err := c.read(ctx, st, keys, c.reshard, placement.Rank{}, auto(plan.RedisTransport()))
	if err != nil {
		return nil, err
	}
	dr, err := c.read(ctx, st, keys, c.reshard, placement.Rank{}, plan.Options{})
	if err != nil {
		return nil, err
	}
	get, err := c.getBaseline(ctx, u, len(keys), rs.bytes/len(keys))
	if err != nil {
		return nil, err
	}
	parts, err := c.getBaseline(ctx, u, 2*len(keys), c.m.PartBytes(0))
	if err != nil {
		return nil, err
	}
	parts.bytes = rs.bytes // what the reader needed of them
	vsParts := Figure{Name: "redis_vs_get_parts", Value: round(rs.gbps() / parts.gbps()), Unit: "x", Baseline: round(parts.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("the resharded reads against pipelined GET of the two whole parts (%d bytes each) that hold each page's bytes, counting the bytes needed (%.2f GB/s of parts read): what a reader without range reads would fetch before copying",
			c.m.PartBytes(0), gbps(2*len(keys)*c.m.PartBytes(0), parts.best))}
	vs := Figure{Name: "redis_vs_get", Value: round(rs.gbps() / get.gbps()), Unit: "x", Baseline: round(get.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages, TP 4/PP 2 rank 0/0: auto %s (%d ops a page) %.2f GB/s; pipelined GET of %d values of %d bytes into a buffer: %.2f GB/s",
			len(keys), rs.strategy, rs.ops, rs.gbps(), len(keys), rs.bytes/len(keys), get.gbps())}
	atLeast(&vs, 0.8)
	g := Figure{Name: "reshard_gbps_redis", Value: round(rs.gbps()), Unit: "GB/s", Baseline: round(dr.gbps()), BaselineUnit: "GB/s",
		Detail: fmt.Sprintf("%d pages from Redis, TP 4/PP 2 rank 0/0: auto %s (%d ops a page); baseline: direct (%d GETRANGEs a page)",
			len(keys), rs.strategy, rs.ops, dr.ops)}
	return []Figure{vs, vsParts, g}, nil
}

// getBaseline stores n values of size bytes and times one
// pipelined GET of all of them, each copied into a buffer as a read into a
// pool would be.
func (c *case70) getBaseline(ctx context.Context, serverURL string, n, size int) (reading, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return reading{}, err
	}
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{u.Host}, DisableCache: true})
	if err != nil {
		return reading{}, err
	}
	defer cl.Close()
	val := make([]byte, size)
	for i := range val {
		val[i] = byte(i * 7)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench-get-%d", i)
		if err := cl.Do(ctx, cl.B().Set().Key(keys[i]).Value(rueidis.BinaryString(val)).Build()).Error(); err != nil {
			return reading{}, err
		}
	}
	pool := make([]byte, size*len(keys))
	once := func() error {
		cmds := make(rueidis.Commands, len(keys))
		for i, k := range keys {
			cmds[i] = cl.B().Get().Key(k).Build()
		}
		for i, r := range cl.DoMulti(ctx, cmds...) {
			s, err := r.ToString()
			if err != nil {
				return err
			}
			if len(s) != size {
				return fmt.Errorf("GET %s: %d bytes, want %d", keys[i], len(s), size)
			}
			copy(pool[i*size:], s)
		}
		return nil
	}
	if err := once(); err != nil {
		return reading{}, err
	}
	var b time.Duration
	if b, err = best(c.sz.reps, 1, once); err != nil {
		return reading{}, err
	}
	return reading{bytes: len(pool), best: b}, nil
}
