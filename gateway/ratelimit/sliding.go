// Package ratelimit decides whether a request fits its rate limit. The shared
// state is a sliding window in Redis, updated by one Lua script per decision;
// concurrent decisions are pipelined into one round trip, and when Redis is
// slow or gone an in-process window of the same shape takes over until Redis
// answers again.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
)

// Buckets is how many sub-buckets one window is cut into. A request is counted
// from the moment it is admitted until the end of its bucket plus one window,
// so it is forgotten between Period and Period+Period/Buckets after it was
// made. The count therefore never under-states the requests of any rolling
// window: at most Limit requests are admitted in any interval of length
// Period, and a client may be refused for at most Period/Buckets longer than
// an exact sliding log would refuse it.
const Buckets = 60

// slidingScript keeps one HASH per limited key: field = bucket index
// (milliseconds since the epoch divided by the bucket width), value = number
// of admitted requests in that bucket. It admits up to ARGV[4] requests,
// records them, and answers how many it admitted, how many remain, and when
// (in ms from now) the next request would pass and the window would be empty.
// First it takes back ARGV[6] units from bucket ARGV[7]: a lease's units that
// expired unused, never served. A bucket holding fewer than that (gone, or a
// Redis that lost its data) is left alone, so nothing is freed that was used.
// A bucket after the current one (Redis's clock stepped back: NTP, a VM
// resumed) is moved into the current one: its requests still count, and
// leave the window one window from now, not once the clock has caught up
// with them, which refused a client that had used its limit for as long
// as the clock stepped back.
//
// KEYS[1] window hash
// ARGV[1] window ms, ARGV[2] bucket width ms, ARGV[3] limit, ARGV[4] cost
// (0 = only look), ARGV[5] now in ms (0 = Redis TIME, so all gateways agree),
// ARGV[6] units given back (0 = none), ARGV[7] their bucket.
const slidingScript = `
local window = tonumber(ARGV[1])
local width = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
local back = tonumber(ARGV[6])
if back > 0 then
  local held = tonumber(redis.call('HGET', KEYS[1], ARGV[7]))
  if held == back then
    redis.call('HDEL', KEYS[1], ARGV[7])
  elseif held and held > back then
    redis.call('HINCRBY', KEYS[1], ARGV[7], -back)
  end
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local current = math.floor(now / width)
local oldest = math.floor((now - window) / width)
local fields = redis.call('HGETALL', KEYS[1])
local buckets = {}
local total = 0
for i = 1, #fields, 2 do
  local b = tonumber(fields[i])
  if b < oldest then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    local c = tonumber(fields[i + 1])
    if b > current then
      redis.call('HDEL', KEYS[1], fields[i])
      redis.call('HINCRBY', KEYS[1], string.format('%d', current), c)
      b = current
    end
    total = total + c
    buckets[#buckets + 1] = {b, c}
  end
end
local admitted = limit - total
if admitted > cost then admitted = cost end
if admitted < 0 then admitted = 0 end
if admitted > 0 then
  redis.call('HINCRBY', KEYS[1], string.format('%d', current), admitted)
  redis.call('PEXPIRE', KEYS[1], window + width)
  total = total + admitted
  buckets[#buckets + 1] = {current, admitted}
end
table.sort(buckets, function(a, b) return a[1] < b[1] end)
local retry = 0
if total >= limit and #buckets > 0 then
  local need = total - limit + 1
  local freed = 0
  for _, bc in ipairs(buckets) do
    freed = freed + bc[2]
    if freed >= need then
      retry = (bc[1] + 1) * width + window - now
      break
    end
  end
end
local reset = 0
if #buckets > 0 then
  reset = (buckets[#buckets][1] + 1) * width + window - now
end
return {admitted, limit - total, retry, reset, now}
`

// Taken is the outcome of one script run.
type Taken struct {
	// Admitted is how many of the requested units were let through.
	Admitted int64
	// Remaining is how many more would pass right now.
	Remaining int64
	// RetryAfter is how long until one more request would pass; zero while
	// Remaining > 0.
	RetryAfter time.Duration
	// ResetAfter is how long until every counted request has left the window.
	ResetAfter time.Duration
	// Now is the clock the decision was made at.
	Now time.Time
}

// Op is one decision of a pipelined batch.
type Op struct {
	Key  string
	Rate limiter.Rate
	Cost int64
	// Back units, recorded in bucket BackBucket and never used (a lease
	// that expired), are uncounted before the decision.
	Back       int64
	BackBucket int64
}

// SlidingStore is a sliding-window implementation of ulule/limiter's Store
// on Redis (ulule's own Redis store is a fixed window).
type SlidingStore struct {
	client *redis.Client
	prefix string
	script *redis.Script
	// now, when set, replaces Redis TIME; tests use it to drive the clock.
	now func() time.Time
}

var _ limiter.Store = (*SlidingStore)(nil)

// NewSlidingStore returns a store whose Redis keys start with prefix.
func NewSlidingStore(client *redis.Client, prefix string) *SlidingStore {
	return &SlidingStore{client: client, prefix: prefix, script: redis.NewScript(slidingScript)}
}

// WithClock makes the store take the time from now instead of Redis TIME.
func (s *SlidingStore) WithClock(now func() time.Time) *SlidingStore {
	c := *s
	c.now = now
	return &c
}

// bucketWidth is the sub-bucket width of a window, at least 1 ms.
func bucketWidth(period time.Duration) int64 {
	return max(period.Milliseconds()/Buckets, 1)
}

func (s *SlidingStore) args(op Op) []any {
	var now int64
	if s.now != nil {
		now = s.now().UnixMilli()
	}
	return []any{op.Rate.Period.Milliseconds(), bucketWidth(op.Rate.Period), op.Rate.Limit, op.Cost, now,
		op.Back, op.BackBucket}
}

// bucketOf is the bucket the script records units in at t.
func bucketOf(t time.Time, period time.Duration) int64 {
	return t.UnixMilli() / bucketWidth(period)
}

// Take runs one decision.
func (s *SlidingStore) Take(ctx context.Context, op Op) (Taken, error) {
	res, err := s.script.Run(ctx, s.client, []string{s.prefix + op.Key}, s.args(op)...).Int64Slice()
	if err != nil {
		return Taken{}, fmt.Errorf("ratelimit: redis: %w", err)
	}
	return parseTaken(res)
}

// TakeMany runs one decision per op in a single pipelined round trip (one
// EVALSHA each). If Redis has lost the script (a restart), it is loaded again
// and the batch is sent once more.
func (s *SlidingStore) TakeMany(ctx context.Context, ops []Op) ([]Taken, error) {
	out, err := s.takeMany(ctx, ops)
	if err != nil && isNoScript(err) {
		if err := s.script.Load(ctx, s.client).Err(); err != nil {
			return nil, fmt.Errorf("ratelimit: redis: load script: %w", err)
		}
		out, err = s.takeMany(ctx, ops)
	}
	return out, err
}

func (s *SlidingStore) takeMany(ctx context.Context, ops []Op) ([]Taken, error) {
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(ops))
	for i, op := range ops {
		cmds[i] = s.script.EvalSha(ctx, pipe, []string{s.prefix + op.Key}, s.args(op)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("ratelimit: redis: %w", err)
	}
	out := make([]Taken, len(ops))
	for i, cmd := range cmds {
		res, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("ratelimit: redis: %w", err)
		}
		if out[i], err = parseTaken(res); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

func parseTaken(res []int64) (Taken, error) {
	if len(res) != 5 {
		return Taken{}, errors.New("ratelimit: redis: unexpected script reply")
	}
	return Taken{
		Admitted:   res[0],
		Remaining:  max(res[1], 0),
		RetryAfter: time.Duration(res[2]) * time.Millisecond,
		ResetAfter: time.Duration(res[3]) * time.Millisecond,
		Now:        time.UnixMilli(res[4]),
	}, nil
}

// ulule's Store contract. Context.Reset is in whole Unix seconds, rounded up,
// so it is never earlier than the moment it names.

// Get records one request and reports the limit's state.
func (s *SlidingStore) Get(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	return s.Increment(ctx, key, 1, rate)
}

// Peek reports the limit's state without recording a request.
func (s *SlidingStore) Peek(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	t, err := s.Take(ctx, Op{Key: key, Rate: rate, Cost: 0})
	if err != nil {
		return limiter.Context{}, err
	}
	return ululeContext(rate, t, t.Remaining == 0), nil
}

// Increment records count requests (as many as fit) and reports the state.
func (s *SlidingStore) Increment(ctx context.Context, key string, count int64, rate limiter.Rate) (limiter.Context, error) {
	t, err := s.Take(ctx, Op{Key: key, Rate: rate, Cost: count})
	if err != nil {
		return limiter.Context{}, err
	}
	return ululeContext(rate, t, t.Admitted < count), nil
}

// Reset forgets every request recorded under key.
func (s *SlidingStore) Reset(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	if err := s.client.Del(ctx, s.prefix+key).Err(); err != nil {
		return limiter.Context{}, fmt.Errorf("ratelimit: redis: %w", err)
	}
	return limiter.Context{Limit: rate.Limit, Remaining: rate.Limit, Reset: time.Now().Unix()}, nil
}

func ululeContext(rate limiter.Rate, t Taken, reached bool) limiter.Context {
	return limiter.Context{
		Limit:     rate.Limit,
		Remaining: t.Remaining,
		Reset:     ceilUnix(t.Now.Add(t.ResetAfter)),
		Reached:   reached,
	}
}

// ceilUnix is t in Unix seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}
