package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/kvreshard/kvreshard/runtime/store"
)

// maxManifestKey bounds the length of a manifest key: WriteParts refuses a
// longer one, and a stored one longer makes the page's state unreadable, so
// that a state reply is bounded (at most store.MaxParts sizes, and this).
const maxManifestKey = 4096

// inspectLua defines inspect(meta, prefix), which reads and checks a
// page's state: the meta hash and, when every part is counted, each part's
// mark and key. It returns nil when there is no state (no hash, or a hash
// without manifest, parts and done). Otherwise a table s:
//
//   - s.t: the claim's last write, in ms of the server's clock, or -1 when
//     it cannot be read;
//   - s.err, when the state cannot be read: what is wrong, as lines
//     ("what", then values) that unreadableState (Go) formats;
//   - else s.manifest, s.parts, s.done, and when done == parts s.sizes
//     of the parts, or s.lost, the first part whose key is gone (expired
//     or evicted since the page was complete).
//
// It also defines drop(meta, prefix, n, keep), which deletes a page's meta
// hash and its n part keys but part keep (nil: all of them).
//
// Every number is checked before it is used: a hash of more than
// MAXPARTS+4 fields is not fetched, and a part count out of [1, MAXPARTS]
// makes the state unreadable rather than drive a loop. The hash is read
// with one HGETALL: on a page of 8 parts the whole check costs the server
// 17-19 us, against 10-11 us for the check before checksums, which read
// no marks and checked nothing (redis-benchmark, EVALSHA, 2 busy cores).
const inspectLua = `
-- bad records in s what is wrong and the values that show it (each cut to
-- 64 bytes; a missing one ends the list), and returns s.
local function bad(s, what, ...)
  local e = {what}
  for _, v in ipairs({...}) do
    if not v then break end
    e[#e + 1] = string.sub(v, 1, 64)
  end
  s.err = table.concat(e, '\n')
  return s
end

-- count returns v as a number if it is the decimal form of one from 0 to
-- max, else nil.
local function count(v, max)
  if v and #v <= 15 and string.find(v, '^%d+$') then
    local n = tonumber(v)
    if n <= max then return n end
  end
  return nil
end

local function inspect(meta, prefix)
  local have = redis.pcall('HLEN', meta)
  if type(have) ~= 'number' then
    return {t = -1, err = 'type\n' .. redis.call('TYPE', meta).ok}
  end
  if have == 0 then return nil end
  local s = {t = -1}
  -- manifest, parts, done, t and a mark per written part, nothing else
  if have > MAXPARTS + 4 then return bad(s, 'size', have) end
  local a = redis.call('HGETALL', meta)
  local h = {}
  for i = 1, #a, 2 do h[a[i]] = a[i + 1] end
  local manifest = h['manifest']
  if not (manifest or h['parts'] or h['done']) then return nil end
  s.t = count(h['t'], 1e15) or -1
  if not manifest or manifest == '' then return bad(s, 'manifest') end
  if #manifest > MAXKEY then return bad(s, 'manifest-size', #manifest) end
  local n = count(h['parts'], MAXPARTS)
  if not n or n < 1 then return bad(s, 'parts', h['parts']) end
  local done = count(h['done'], n)
  if not done then return bad(s, 'done', n, h['done']) end
  local want = done + 3
  if h['t'] then want = want + 1 end
  if have ~= want then return bad(s, 'fields', have, want, done) end
  s.manifest, s.parts, s.done = manifest, n, done
  if done < n then return s end
  s.sizes = {}
  for i = 0, n - 1 do
    local c = h['w:' .. i]
    if not c then return bad(s, 'mark', i) end
    if c ~= '1' then return bad(s, 'mark-value', i, c) end
    local k = prefix .. i
    local l = redis.pcall('STRLEN', k)
    if type(l) ~= 'number' then return bad(s, 'part-type', i, redis.call('TYPE', k).ok) end
    if l == 0 and redis.call('EXISTS', k) == 0 then
      s.lost = i
      return s
    end
    s.sizes[i + 1] = l
  end
  return s
end

-- drop deletes the meta hash and the n part keys of a page but part keep
-- (nil: all), in DELs of at most 256 keys.
local function drop(meta, prefix, n, keep)
  for first = 0, n - 1, 256 do
    local k = {}
    for i = first, math.min(first + 255, n - 1) do
      if i ~= keep then k[#k + 1] = prefix .. i end
    end
    if #k > 0 then redis.call('DEL', unpack(k)) end
  end
  redis.call('DEL', meta)
end
`

// writeScript writes one part and claims and completes its object, in one
// atomic step on the server.
//
//	KEYS[1] the page's meta hash, KEYS[2] the part's key,
//	KEYS[3] the page's stamp of an unreadable state
//	ARGV[1] manifest key, ARGV[2] part count, ARGV[3] part number,
//	ARGV[4] the part's bytes, ARGV[5] TTL in ms (0: none),
//	ARGV[6] the prefix of the page's part keys (KEYS[2] is ARGV[6]..ARGV[3]),
//	ARGV[7] the lease in ms
//
// It returns 0 when the part is written (or was already: a retry keeps the
// first copy), 1 when the object is complete (nothing written), 2 when the
// incomplete object has another manifest or part count (nothing written),
// and "!" followed by inspect's s.err when the page's state cannot be read
// (nothing written).
//
// The meta hash holds manifest, parts, done (parts written), t (the
// server's time of the last part write, ms) and w:<i> = 1, a mark of each
// written part. The first writer creates it; every part write,
// retries included, sets t. A complete object one of whose parts has
// expired or was evicted is deleted, as stateScript deletes it (see
// there), and the write claims it as new, in any layout. The write that
// completes an object checks that the parts written before are still
// there: one that was lost meanwhile is unmarked, so that the object
// completes only when its writer writes it again (it is never complete
// without it).
//
// On a server over maxmemory (noeviction, or nothing left to evict), the
// write is refused with the server's OOM error and nothing is written:
// Redis refuses a command that may use more memory only when it is the
// first write of a script (after one it lets the script finish, to keep
// it atomic), so the first write is always such a command: the part's
// SET on a new claim, before anything is deleted, and HSET of t otherwise.
//
// An incomplete object whose t is further than the lease from now (t
// cannot be read, or lies in the past or the future by more) is taken
// over by a writer of another layout: its meta and part keys are deleted
// and the write claims it as new. A complete object is never taken over.
// An unreadable state is refused until a lease has passed since the first
// write refused it (KEYS[3], which expires after two leases, holds that
// time); then it is taken over in the same way, by any layout.
//
// The part keys are built from ARGV[6]; they share the hash tag of KEYS[1],
// so they are in its slot.
const writeScript = inspectLua + `
local meta, pkey, stamp = KEYS[1], KEYS[2], KEYS[3]
local manifest, parts, part = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, prefix, lease = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
if redis.replicate_commands then redis.replicate_commands() end
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local s = inspect(meta, prefix)
local new = not s
if s and s.err then
  local seen = redis.pcall('GET', stamp)
  seen = type(seen) == 'string' and tonumber(seen)
  if not seen then
    -- A full server refuses it: the lease then starts at a later write.
    redis.pcall('SET', stamp, string.format('%d', now), 'PX', string.format('%d', 2 * lease))
    seen = now
  end
  if math.abs(now - seen) <= lease then return '!' .. s.err end
  new = true
elseif s then
  if s.done == s.parts then
    if not s.lost then return 1 end
    new = true
  elseif s.manifest ~= manifest or s.parts ~= parts then
    if math.abs(now - s.t) <= lease then return 2 end
    new = true
  end
end
local t = string.format('%d', now)
local function setPart()
  if ttl > 0 then
    redis.call('SET', pkey, ARGV[4], 'PX', ARGV[5])
  else
    redis.call('SET', pkey, ARGV[4])
  end
end
if new then
  setPart()
  drop(meta, prefix, s and s.parts or 0, part)
  redis.call('DEL', stamp)
  redis.call('HSET', meta, 'manifest', manifest, 'parts', parts, 'done', 1, 'w:' .. part, '1', 't', t)
else
  redis.call('HSET', meta, 't', t)
  local marked = redis.call('HEXISTS', meta, 'w:' .. part) == 1
  if marked and redis.call('EXISTS', pkey) == 1 then return 0 end
  local done = s.done
  if not marked then
    redis.call('HSET', meta, 'w:' .. part, '1')
    done = redis.call('HINCRBY', meta, 'done', 1)
  end
  if done == s.parts then
    for i = 0, s.parts - 1 do
      if i ~= part and redis.call('EXISTS', prefix .. i) == 0 then
        redis.call('HDEL', meta, 'w:' .. i)
        done = redis.call('HINCRBY', meta, 'done', -1)
      end
    end
  end
  setPart()
end
if ttl > 0 then redis.call('PEXPIRE', meta, ARGV[5]) end
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
// spaces, a newline, and the manifest key. When the state cannot be read,
// "!" followed by inspect's s.err. A string, not an array, so that
// ReadRanges can take it from a stream of replies (see stream.go).
//
// A page that was complete and has lost a part since (it expired, or the
// server evicted it) is deleted, meta hash and every part key, and
// reported missing. It cannot be read until the lost part is written
// again, and until then its other keys would hold memory: until they
// expire (with a ttl), or under allkeys-lru and allkeys-lfu until the
// server evicts them too, which it puts off, since every check of the
// page touches its meta hash and the parts before the lost one; for ever
// when the part was deleted by hand and nothing else expires. What it
// costs: writers write the whole page again, not only the lost
// part; but every rank of the layout sends its part of a page that is
// not complete anyway (reshard.Writer), so only the server's SET of the
// parts that had survived is done again. The state check therefore
// writes, and runs on the master, as EVALSHA does.
const stateScript = inspectLua + `
local s = inspect(KEYS[1], ARGV[1])
if not s then return false end
if s.err then return '!' .. s.err end
if s.done < s.parts then return false end
if s.lost then
  drop(KEYS[1], ARGV[1], s.parts)
  return false
end
return table.concat(s.sizes, ' ') .. '\n' .. s.manifest
`

// getMetaScript returns a metadata object: nil when there is none, its
// length when it is longer than ARGV[1] bytes (the value is not sent),
// else its bytes.
const getMetaScript = `
local n = redis.call('STRLEN', KEYS[1])
if n == 0 and redis.call('EXISTS', KEYS[1]) == 0 then return false end
if n > tonumber(ARGV[1]) then return n end
return redis.call('GET', KEYS[1])
`

// putMetaScript stores a metadata object unless it exists; it returns 0
// when the object holds ARGV[1] (now or already), 1 when it holds other
// bytes. The comparison is done on the server, so that a large stored
// value is never sent. It reads before it writes: a server over maxmemory
// refuses a SET, even a SET NX of a key that exists, so that storing a
// manifest that is there (reshard.Writer does on every batch) would fail
// on a full server.
const putMetaScript = `
local v = redis.call('GET', KEYS[1])
if v then
  if v == ARGV[1] then return 0 end
  return 1
end
redis.call('SET', KEYS[1], ARGV[1])
return 0
`

// script is a Lua script run with EVALSHA, falling back to EVAL when the
// server does not have it cached.
type script struct {
	src, sha string
}

// newScript makes a script of src, with the limits MAXPARTS and MAXKEY
// written in.
func newScript(src string) *script {
	src = strings.NewReplacer("MAXPARTS", strconv.Itoa(store.MaxParts), "MAXKEY", strconv.Itoa(maxManifestKey)).Replace(src)
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	writer  = newScript(writeScript)
	state   = newScript(stateScript)
	getMeta = newScript(getMetaScript)
	putMeta = newScript(putMetaScript)
)

// call is one command of a pipeline: a script call (s set) or a plain
// command.
type call struct {
	s    *script
	keys []string
	args []string
	cmd  rueidis.Completed
	// retry marks a call that is safe to send again after a connection
	// failed, whether or not the server ran it: stateScript (it writes
	// only to delete a page that lost a part, and deleting it twice is
	// deleting it once), writeScript (see WriteParts) or putMetaScript
	// (storing the same bytes twice is storing them once). The client
	// then sends it again, twice at most, 20 ms apart.
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
