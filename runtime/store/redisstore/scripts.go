package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/rueidis"
)

// writeScript writes one part and claims and completes its object, in one
// atomic step on the server.
//
//	KEYS[1] the page's meta hash, KEYS[2] the part's key
//	ARGV[1] manifest key, ARGV[2] part count, ARGV[3] part number,
//	ARGV[4] the part's bytes, ARGV[5] TTL in ms (0: none),
//	ARGV[6] the prefix of the page's part keys (KEYS[2] is ARGV[6]..ARGV[3])
//
// It returns 0 when the part is written (or was already: a retry keeps the
// first copy), 1 when the object is complete (nothing written), 2 when the
// incomplete object has another manifest or part count (nothing written).
//
// The meta hash holds manifest, parts, done (parts written) and w:<i> for
// each written part. The first writer creates it. A complete object one of
// whose parts has expired or was evicted is not complete any more: its lost
// parts are unmarked, and writers of its own layout may write them again.
// The part keys are built from ARGV[6]; they share the hash tag of KEYS[1],
// so they are in its slot.
const writeScript = `
local meta, pkey = KEYS[1], KEYS[2]
local manifest, parts, part = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local ttl, prefix = tonumber(ARGV[5]), ARGV[6]
local m = redis.call('HMGET', meta, 'manifest', 'parts', 'done')
if m[1] then
  local n, done = tonumber(m[2]), tonumber(m[3])
  if done == n then
    for i = 0, n - 1 do
      if redis.call('EXISTS', prefix .. i) == 0 then
        redis.call('HDEL', meta, 'w:' .. i)
        done = done - 1
      end
    end
    if done == n then return 1 end
    redis.call('HSET', meta, 'done', done)
  end
  if m[1] ~= manifest or n ~= parts then return 2 end
  if redis.call('HEXISTS', meta, 'w:' .. part) == 1 then
    if redis.call('EXISTS', pkey) == 1 then return 0 end
  else
    redis.call('HSET', meta, 'w:' .. part, '1')
    redis.call('HINCRBY', meta, 'done', 1)
  end
else
  redis.call('HSET', meta, 'manifest', manifest, 'parts', parts, 'done', 1, 'w:' .. part, '1')
end
if ttl > 0 then
  redis.call('SET', pkey, ARGV[4], 'PX', ttl)
  redis.call('PEXPIRE', meta, ttl)
else
  redis.call('SET', pkey, ARGV[4])
end
return 0
`

// Results of writeScript.
const (
	writeOK       = 0
	writeComplete = 1
	writeConflict = 2
)

// stateScript reports whether an object is complete.
//
//	KEYS[1] the page's meta hash
//	ARGV[1] the prefix of the page's part keys
//
// It returns nil unless every part is written and every part key still
// exists; then one string: the size of each part in decimal, separated by
// spaces, a newline, and the manifest key. A string, not an array, so that
// ReadRanges can take it from a stream of replies (see stream.go).
const stateScript = `
local m = redis.call('HMGET', KEYS[1], 'manifest', 'parts', 'done')
if not m[1] or tonumber(m[2]) ~= tonumber(m[3]) then return false end
local r = {}
for i = 0, tonumber(m[2]) - 1 do
  local k = ARGV[1] .. i
  if redis.call('EXISTS', k) == 0 then return false end
  r[i + 1] = redis.call('STRLEN', k)
end
return table.concat(r, ' ') .. '\n' .. m[1]
`

// script is a Lua script run with EVALSHA, falling back to EVAL when the
// server does not have it cached.
type script struct {
	src, sha string
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	writer = newScript(writeScript)
	state  = newScript(stateScript)
)

// call is one command of a pipeline: a script call (s set) or a plain
// command.
type call struct {
	s    *script
	keys []string
	args []string
	cmd  rueidis.Completed
	// retry marks a call that is safe to send again after a connection
	// failed, whether or not the server ran it: a script that only
	// reads, or writeScript (see WriteParts). The client then sends it
	// again, twice at most, 20 ms apart.
	retry bool
}

func (c *call) build(b rueidis.Builder, eval bool) rueidis.Completed {
	var cmd rueidis.Completed
	switch {
	case c.s == nil:
		return c.cmd
	case eval:
		cmd = b.Eval().Script(c.s.src).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()
	default:
		cmd = b.Evalsha().Sha1(c.s.sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()
	}
	if c.retry {
		cmd = cmd.ToRetryable()
	}
	return cmd
}

// pipeline sends calls in one pipeline (grouped by slot on a cluster) and
// returns their results in order. Script calls that the server answers with
// NOSCRIPT are sent again, in order, with EVAL, which also caches them.
func pipeline(ctx context.Context, c rueidis.Client, calls []call) []rueidis.RedisResult {
	cmds := make(rueidis.Commands, len(calls))
	for i := range calls {
		cmds[i] = calls[i].build(c.B(), false)
	}
	res := c.DoMulti(ctx, cmds...)
	var again []int
	for i, r := range res {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() && calls[i].s != nil {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return res
	}
	cmds = cmds[:0]
	for _, i := range again {
		cmds = append(cmds, calls[i].build(c.B(), true))
	}
	for j, r := range c.DoMulti(ctx, cmds...) {
		res[again[j]] = r
	}
	return res
}
