package ratelimit

import (
	"context"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/ulule/limiter/v3"
	"go.opentelemetry.io/otel/trace"
)

// LeaseDivisor sets the largest lease: a gateway instance may take up to
// Limit/LeaseDivisor units (at least 1) from Redis at once and hand them
// out locally. Limits below 2×LeaseDivisor therefore get leases of 1,
// that is one exact decision per request.
const LeaseDivisor = 100

// lease is one instance's local allowance for one key: units recorded in
// Redis ahead of use. A key that is refused is remembered as refused until
// the moment Redis said a request would pass, so a flood of refused
// requests costs Redis nothing.
//
// Bound: units are recorded when leased, at or before their use, and an
// instance holds at most maxLease-1 unused units per key at any time. Since
// Redis admits at most Limit recorded units in any rolling window, at most
// Limit + instances×(maxLease-1) requests pass in any rolling window. Units
// that expired unused are given back to Redis with the next fetch: they were
// never served, so uncounting them keeps the bound, and a client is not
// charged for them (X-RateLimit-Remaining, which counts them, stays true).
type lease struct {
	mu           sync.Mutex
	units        int64     // leased, not yet used
	expires      time.Time // unused units are dropped then
	bucket       int64     // the Redis bucket the units were recorded in
	size         int64     // next lease size, adapted to demand
	waiters      int64     // requests waiting for the fetch in flight
	fetching     chan struct{}
	remaining    int64 // Redis' remaining at the last fetch
	reset        time.Time
	refusedUntil time.Time
	used         time.Time // last use, for the sweep
	// batch is the span of the last fetch's round trip, when recorded,
	// for the requests that waited for that fetch.
	batch *trace.SpanContext
}

// maxLease is the largest lease for rate.
func maxLease(rate limiter.Rate) int64 {
	return max(rate.Limit/LeaseDivisor, 1)
}

// leaseTTL is how long leased units stay usable: one bucket of the
// window, at least 100 ms.
func leaseTTL(rate limiter.Rate) time.Duration {
	return max(time.Duration(bucketWidth(rate.Period))*time.Millisecond, 100*time.Millisecond)
}

// Take records one request under key if it fits rate. Requests on a busy
// key are served from a lease; see lease for the bound this keeps. ctx is
// the request's, read only for its span (Decision.Batch).
func (l *Limiter) Take(ctx context.Context, key string, rate limiter.Rate) Decision {
	if l.degraded.Load() {
		return decisionOf(rate, l.takeLocally(Op{Key: key, Rate: rate, Cost: 1}))
	}
	ls := l.leaseFor(key)
	waited := false
	for {
		now := l.opts.Now()
		ls.mu.Lock()
		ls.used = now
		if ls.units > 0 && now.Before(ls.expires) {
			ls.units--
			d := Decision{Allowed: true, Limit: rate.Limit, Remaining: ls.remaining + ls.units, Reset: ls.reset, AskedRedis: waited}
			if waited {
				d.Batch = ls.batch
			}
			ls.mu.Unlock()
			return d
		}
		if now.Before(ls.refusedUntil) {
			d := Decision{Limit: rate.Limit, RetryAfter: ls.refusedUntil.Sub(now), Reset: ls.reset, AskedRedis: waited}
			if waited {
				d.Batch = ls.batch
			}
			ls.mu.Unlock()
			return d
		}
		if w := ls.fetching; w != nil {
			ls.waiters++
			ls.mu.Unlock()
			<-w
			waited = true
			continue
		}
		return l.refill(ctx, ls, key, rate, now)
	}
}

// refill takes a new lease (called with ls.mu held; returns with it
// released) and uses its first unit for the caller.
func (l *Limiter) refill(ctx context.Context, ls *lease, key string, rate limiter.Rate, now time.Time) Decision {
	top := maxLease(rate)
	switch {
	case ls.units > 0: // the last lease expired unused: ask for less
		ls.size = max(ls.size/2, 1)
	case !ls.expires.IsZero(): // the last lease was used up: ask for more
		ls.size = min(max(ls.size*2, 1), top)
	default:
		ls.size = 1
	}
	size := min(max(ls.size, ls.waiters+1), top)
	op := Op{Key: key, Rate: rate, Cost: size, Back: ls.units, BackBucket: ls.bucket}
	ls.units, ls.waiters = 0, 0
	done := make(chan struct{})
	ls.fetching = done
	ls.mu.Unlock()

	r := l.take(ctx, op)

	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.fetching = nil
	close(done)
	ls.remaining, ls.reset, ls.batch = r.remaining, r.reset, r.batch
	if r.admitted == 0 {
		// Counted from after the round trip, so never earlier than Redis
		// meant.
		ls.refusedUntil = l.opts.Now().Add(r.retryAfter)
		d := decisionOf(rate, r)
		d.AskedRedis, d.Batch = true, r.batch
		return d
	}
	// Units leased from the local fallback are not kept: it decides per
	// request anyway.
	if !r.local {
		ls.units = r.admitted - 1
		ls.expires = now.Add(leaseTTL(rate))
		ls.bucket = r.bucket
	}
	return Decision{Allowed: true, Limit: rate.Limit, Remaining: r.remaining + ls.units, Reset: r.reset, Local: r.local,
		AskedRedis: true, Batch: r.batch}
}

// refused returns the remembered refusal of key, if one still holds.
func (l *Limiter) refused(key string, rate limiter.Rate) (Decision, bool) {
	sh := l.shardOf(key)
	sh.mu.Lock()
	ls, ok := sh.leases[key]
	sh.mu.Unlock()
	if !ok {
		return Decision{}, false
	}
	now := l.opts.Now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !now.Before(ls.refusedUntil) {
		return Decision{}, false
	}
	return Decision{Limit: rate.Limit, RetryAfter: ls.refusedUntil.Sub(now), Reset: ls.reset}, true
}

func decisionOf(rate limiter.Rate, r result) Decision {
	d := Decision{Allowed: r.admitted > 0, Limit: rate.Limit, Remaining: r.remaining, Reset: r.reset, Local: r.local}
	if !d.Allowed {
		d.RetryAfter = r.retryAfter
	}
	return d
}

// leaseShards spreads the lease map over several locks.
const leaseShards = 32

type leaseShard struct {
	mu     sync.Mutex
	leases map[string]*lease
}

// shardOf is the shard that holds key's lease.
func (l *Limiter) shardOf(key string) *leaseShard {
	return &l.shards[xxhash.Sum64String(key)%leaseShards]
}

// MaxLeases bounds the leases held, about 250 bytes each with their keys.
// A lease is kept for every key and client address used in the last 10 to
// 15 s (sweepLeases), so a flood from new addresses held one or two per
// address for as many seconds as it was fast, with no other bound
// (measured: 13 MB of them during a flood from 8,400 new addresses a second
// on two shared cores).
const MaxLeases = 100_000

// leaseFor returns key's lease. Past MaxLeases a new key's lease is not
// kept: its decisions then go to Redis one by one and its refusals are
// not remembered, which costs Redis a round trip per request of such a
// key (a flood's, or a new key's while a flood lasts), while the keys
// already leased, busy clients' among them, keep theirs. A lease not kept
// may take its unused units with it: they were recorded in Redis, so that
// errs towards refusing, by less than a lease.
func (l *Limiter) leaseFor(key string) *lease {
	sh := l.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ls, ok := sh.leases[key]
	if !ok {
		ls = &lease{}
		if l.leases.Add(1) <= l.maxLeases {
			sh.leases[key] = ls
		} else {
			l.leases.Add(-1)
		}
	}
	return ls
}

// Leases is how many leases are held, up to MaxLeases: read at each
// scrape, from the count leaseFor and sweepLeases keep anyway.
func (l *Limiter) Leases() int64 { return l.leases.Load() }

// LocalKeys is how many keys' windows the in-process fallback holds.
func (l *Limiter) LocalKeys() int { return l.local.Keys() }

// sweepLeases forgets leases unused for a while, so memory follows the
// set of active keys. One still holding units is kept until they have left
// the window: forgotten, they could not be given back, and the client
// would be charged for them.
func (l *Limiter) sweepLeases(now time.Time, idle time.Duration) {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for k, ls := range sh.leases {
			ls.mu.Lock()
			stale := ls.fetching == nil && now.Sub(ls.used) > idle && now.After(ls.refusedUntil) &&
				(ls.units == 0 || now.After(ls.reset))
			ls.mu.Unlock()
			if stale {
				delete(sh.leases, k)
				l.leases.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}
