package ratelimit

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/redisclient"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func mustRate(t *testing.T, s string) limiter.Rate {
	t.Helper()
	r, err := limiter.NewRateFromFormatted(s)
	if err != nil {
		t.Fatalf("NewRateFromFormatted(%q) = %v", s, err)
	}
	return r
}

func parseRate(s string) (limiter.Rate, error) { return limiter.NewRateFromFormatted(s) }

func redisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	c, err := redisclient.Open(url, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// clock is a settable time source.
type clock struct{ ms atomic.Int64 }

func (c *clock) now() time.Time      { return time.UnixMilli(c.ms.Load()) }
func (c *clock) set(t time.Time)     { c.ms.Store(t.UnixMilli()) }
func (c *clock) add(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// takers lets the same scenario run against Redis and the local fallback.
func takers(t *testing.T, clk *clock) map[string]func(Op) Taken {
	store := NewSlidingStore(redisClient(t, testenv.RedisURL(t)), testenv.KeyPrefix(t)).WithClock(clk.now)
	local := NewLocal()
	return map[string]func(Op) Taken{
		"redis": func(op Op) Taken {
			got, err := store.Take(context.Background(), op)
			if err != nil {
				t.Fatalf("Take(%v) error = %v", op, err)
			}
			return got
		},
		"local": func(op Op) Taken { return local.Take(op, clk.now()) },
	}
}

func TestSlidingWindowBoundaryBurst(t *testing.T) {
	rate := mustRate(t, "5-S")
	clk := &clock{}
	for name, take := range takers(t, clk) {
		t.Run(name, func(t *testing.T) {
			// A burst at the very end of one clock second and one at the start
			// of the next: a fixed window would admit 10.
			clk.set(time.Unix(1_900_000_000, 990_000_000))
			var admitted []time.Time
			for _, step := range []time.Duration{0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 5} {
				clk.add(step * time.Millisecond)
				if take(Op{Key: "k", Rate: rate, Cost: 1}).Admitted == 1 {
					admitted = append(admitted, clk.now())
				}
			}
			if len(admitted) != 5 {
				t.Fatalf("admitted %d of a burst straddling a second boundary, want 5", len(admitted))
			}
			// Then pace one request every 10 ms for 3 s: no rolling window of
			// one second may ever hold more than 5 admitted requests.
			for i := 0; i < 300; i++ {
				clk.add(10 * time.Millisecond)
				if take(Op{Key: "k", Rate: rate, Cost: 1}).Admitted == 1 {
					admitted = append(admitted, clk.now())
				}
			}
			for i := range admitted {
				n := 0
				for _, a := range admitted[i:] {
					if a.Sub(admitted[i]) < time.Second {
						n++
					}
				}
				if n > 5 {
					t.Fatalf("%d requests admitted within 1s of %v, want at most 5", n, admitted[i])
				}
			}
			// ...and the window is not over-strict: the burst and a full window
			// in each of the next two seconds (the third ends 15 ms too early
			// for its bucket to leave) pass.
			if len(admitted) < 15 {
				t.Errorf("admitted %d in 3 s of pacing after the burst, want at least 15", len(admitted))
			}
		})
	}
}

func TestRetryAfterIsWhenARequestPasses(t *testing.T) {
	rate := mustRate(t, "5-S")
	clk := &clock{}
	for name, take := range takers(t, clk) {
		t.Run(name, func(t *testing.T) {
			clk.set(time.Unix(1_900_000_100, 300_000_000))
			for i := 0; i < 5; i++ {
				take(Op{Key: "r", Rate: rate, Cost: 1})
				clk.add(100 * time.Millisecond)
			}
			refused := take(Op{Key: "r", Rate: rate, Cost: 1})
			if refused.Admitted != 0 || refused.RetryAfter <= 0 {
				t.Fatalf("Take on a full window = %+v, want refused with RetryAfter > 0", refused)
			}
			wait := refused.RetryAfter
			clk.add(wait - time.Millisecond)
			if got := take(Op{Key: "r", Rate: rate, Cost: 0}); got.Remaining != 0 {
				t.Fatalf("1ms before RetryAfter: Remaining = %d, want 0", got.Remaining)
			}
			clk.add(time.Millisecond)
			if got := take(Op{Key: "r", Rate: rate, Cost: 1}); got.Admitted != 1 {
				t.Fatalf("at RetryAfter (%v): Admitted = %d, want 1", wait, got.Admitted)
			}
		})
	}
}

// A clock stepped back (an NTP correction, a VM resumed: Redis's clock, or
// the instance's for the fallback) locks no client out until it catches
// up: what was counted "after" now counts as now's, so it still counts, and
// leaves the window one window from now. Before, a client that had used
// its limit was refused for as long as the clock stepped back, an hour here.
func TestAClockSteppedBackLocksNoClientOutForTheStep(t *testing.T) {
	rate := mustRate(t, "5-S")
	clk := &clock{}
	for name, take := range takers(t, clk) {
		t.Run(name, func(t *testing.T) {
			clk.set(time.Unix(1_900_000_300, 500_000_000))
			for range 5 {
				take(Op{Key: "stepped", Rate: rate, Cost: 1})
			}
			clk.add(-time.Hour)
			refused := take(Op{Key: "stepped", Rate: rate, Cost: 1})
			longest := rate.Period + rate.Period/Buckets
			if refused.Admitted != 0 || refused.RetryAfter <= 0 || refused.RetryAfter > longest {
				t.Fatalf("Take just after the clock stepped back an hour, 5 counted = %+v, want refused with 0 < RetryAfter <= %v", refused, longest)
			}
			if refused.ResetAfter > longest {
				t.Errorf("ResetAfter = %v, want at most %v", refused.ResetAfter, longest)
			}
			clk.add(refused.RetryAfter)
			if got := take(Op{Key: "stepped", Rate: rate, Cost: 1}); got.Admitted != 1 {
				t.Errorf("Take at RetryAfter (%v) = %+v, want admitted", refused.RetryAfter, got)
			}
		})
	}
}

func TestKeysAreIndependent(t *testing.T) {
	rate := mustRate(t, "2-M")
	clk := &clock{}
	clk.set(time.Unix(1_900_000_200, 0))
	for name, take := range takers(t, clk) {
		t.Run(name, func(t *testing.T) {
			for i := 0; i < 3; i++ {
				take(Op{Key: "owner-a", Rate: rate, Cost: 1})
			}
			if got := take(Op{Key: "owner-b", Rate: rate, Cost: 1}); got.Admitted != 1 || got.Remaining != 1 {
				t.Fatalf("Take(owner-b) after owner-a used its limit = %+v, want admitted with 1 remaining", got)
			}
		})
	}
}

func TestSlidingStoreSatisfiesUlule(t *testing.T) {
	var store limiter.Store = NewSlidingStore(redisClient(t, testenv.RedisURL(t)), testenv.KeyPrefix(t))
	ctx := context.Background()
	rate := mustRate(t, "3-M")
	lim := limiter.New(store, rate)
	for i, want := range []int64{2, 1, 0} {
		got, err := lim.Get(ctx, "k")
		if err != nil || got.Remaining != want || got.Reached {
			t.Fatalf("Get #%d = %+v, %v, want Remaining %d, not reached", i, got, err, want)
		}
	}
	if got, _ := lim.Get(ctx, "k"); !got.Reached || got.Reset < time.Now().Unix() {
		t.Fatalf("Get over the limit = %+v, want Reached and a future Reset", got)
	}
	if got, _ := lim.Peek(ctx, "k"); got.Remaining != 0 {
		t.Fatalf("Peek = %+v, want Remaining 0", got)
	}
	if _, err := lim.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if got, _ := lim.Peek(ctx, "k"); got.Remaining != 3 {
		t.Fatalf("Peek after Reset = %+v, want Remaining 3", got)
	}
}

// testTimeout bounds a round trip to Redis in these tests, in place of
// the product's 50 ms: on a loaded test machine (every package's tests
// share two cores) a fresh Redis's first script load, or a batch of 200
// decisions, took 51 to 85 ms, and decisions meant for Redis went to the
// fallback (16 of 60 runs of the package beside a CPU hog failed so). No
// test here relies on the timeout: a Redis that is down (killed) refuses
// at once, and one that refuses writes answers an error.
const testTimeout = 5 * time.Second

// newLimiter is New with testTimeout unless opts sets a timeout.
func newLimiter(store *SlidingStore, opts Options) *Limiter {
	if opts.Timeout == 0 {
		opts.Timeout = testTimeout
	}
	return New(store, opts)
}

func startLimiter(t *testing.T, url string, opts Options) *Limiter {
	t.Helper()
	l := newLimiter(NewSlidingStore(redisClient(t, url), testenv.KeyPrefix(t)), opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func TestConcurrentDecisionsAreExact(t *testing.T) {
	l := startLimiter(t, testenv.RedisURL(t), Options{})
	rate := mustRate(t, "25-M")
	var wg sync.WaitGroup
	var allowed, local atomic.Int64
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := l.Take(context.Background(), "hot", rate)
			if d.Allowed {
				allowed.Add(1)
			}
			if d.Local {
				local.Add(1)
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 25 || local.Load() != 0 {
		t.Fatalf("200 concurrent Take on 25-M: allowed %d (local %d), want 25 (local 0)", allowed.Load(), local.Load())
	}
	if d := l.Take(context.Background(), "hot", rate); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Minute+time.Second {
		t.Fatalf("Take over the limit = %+v, want refused with 0 < RetryAfter <= 61s", d)
	}
}

func TestRedisOutageFallsBackAndRecovers(t *testing.T) {
	srv := testenv.StartRedis(t)
	var events atomic.Int64
	l := startLimiter(t, srv.URL, Options{OnDegraded: func(error) { events.Add(1) }})
	rate := mustRate(t, "3-M")
	if d := l.Take(context.Background(), "k", rate); !d.Allowed || d.Local {
		t.Fatalf("Take with Redis up = %+v, want allowed by Redis", d)
	}
	srv.Stop()
	d := l.Take(context.Background(), "k", rate)
	if !d.Allowed || !d.Local || !l.Degraded() {
		t.Fatalf("Take with Redis down = %+v (degraded %v), want allowed locally and degraded", d, l.Degraded())
	}
	// The fallback still limits.
	l.Take(context.Background(), "k", rate)
	l.Take(context.Background(), "k", rate)
	if d := l.Take(context.Background(), "k", rate); d.Allowed {
		t.Fatalf("4th Take on 3-M with Redis down = %+v, want refused by the fallback", d)
	}
	restartAndRecover(t, srv, l)
	if d := l.Take(context.Background(), "k", rate); !d.Allowed || d.Local {
		t.Fatalf("Take after recovery = %+v, want allowed by Redis (a fresh server)", d)
	}
	if events.Load() != 2 {
		t.Errorf("OnDegraded called %d times, want 2 (down, up)", events.Load())
	}
}

// A Redis that answers PING but refuses the script with an error reply
// (not a timeout) keeps the limiter degraded until a decision would pass
// again: before, the prober's PING made it shared every 250 ms and the
// next batch degraded it again, each turn logged and counted.
func TestAnErrorReplyKeepsTheLimiterDegradedUntilDecisionsPass(t *testing.T) {
	for _, tc := range []struct {
		name           string
		refuse, accept func(context.Context, *redis.Client) error
	}{
		{"OOM at maxmemory with noeviction",
			func(ctx context.Context, c *redis.Client) error {
				if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
					return err
				}
				return c.ConfigSet(ctx, "maxmemory", "1").Err()
			},
			func(ctx context.Context, c *redis.Client) error { return c.ConfigSet(ctx, "maxmemory", "0").Err() }},
		{"READONLY replica of a master that is gone",
			func(ctx context.Context, c *redis.Client) error {
				return c.ReplicaOf(ctx, "127.0.0.1", "1").Err()
			},
			func(ctx context.Context, c *redis.Client) error { return c.ReplicaOf(ctx, "NO", "ONE").Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartRedis(t)
			admin := redisClient(t, srv.URL)
			ctx := context.Background()
			var events atomic.Int64
			l := startLimiter(t, srv.URL, Options{ProbeInterval: 10 * time.Millisecond,
				OnDegraded: func(error) { events.Add(1) }})
			rate := mustRate(t, "3-M")
			if err := tc.refuse(ctx, admin); err != nil {
				t.Fatal(err)
			}
			if err := admin.Ping(ctx).Err(); err != nil {
				t.Fatalf("PING of the refusing Redis = %v, want answered", err)
			}
			if d := l.Take(context.Background(), "k", rate); !d.Allowed || !d.Local {
				t.Fatalf("Take while Redis refuses writes = %+v, want allowed locally", d)
			}
			// Fifty probes' time: each one that passed would end the
			// degraded state, which no decision could.
			for range 50 {
				time.Sleep(10 * time.Millisecond)
				if !l.Degraded() {
					t.Fatalf("limiter shared again while Redis refuses every decision (OnDegraded called %d times)",
						events.Load())
				}
			}
			if err := tc.accept(ctx, admin); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for l.Degraded() && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if d := l.Take(context.Background(), "k2", rate); !d.Allowed || d.Local {
				t.Fatalf("Take once Redis accepts writes again = %+v, want allowed by Redis", d)
			}
			if got := events.Load(); got != 2 {
				t.Errorf("OnDegraded called %d times, want 2 (unusable, usable again)", got)
			}
		})
	}
}

func TestLeasesKeepTheBound(t *testing.T) {
	// Two gateway instances share one Redis; 1000-M allows leases of 10.
	url, prefix := testenv.RedisURL(t), testenv.KeyPrefix(t)
	var instances []*Limiter
	for i := 0; i < 2; i++ {
		l := newLimiter(NewSlidingStore(redisClient(t, url), prefix), Options{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { l.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		instances = append(instances, l)
	}
	rate := mustRate(t, "1000-M")
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if instances[(g+i)%2].Take(context.Background(), "busy", rate).Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// Every unit is recorded in Redis before use, so no more than the limit
	// pass within the window; at most maxLease-1 per instance stay leased.
	lo := int64(1000 - 2*(maxLease(rate)-1))
	if got := allowed.Load(); got > 1000 || got < lo {
		t.Fatalf("3200 Take on 1000-M across 2 instances allowed %d, want %d..1000", got, lo)
	}
	d := instances[0].Take(context.Background(), "busy", rate)
	if d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("Take after the window filled = %+v, want refused with RetryAfter", d)
	}
}

// A decision says whether it waited for Redis, so the gateway traces only
// those: the first of a key fetches a lease, and later ones are served from
// it once the leases have grown.
func TestDecisionsSayWhenTheyAskedRedis(t *testing.T) {
	l := startLimiter(t, testenv.RedisURL(t), Options{})
	rate := mustRate(t, "1000-M") // leases of up to 10
	var asked []bool
	for range 8 {
		d := l.Take(context.Background(), "k", rate)
		if !d.Allowed {
			t.Fatalf("Take = %+v, want allowed", d)
		}
		asked = append(asked, d.AskedRedis)
	}
	// Lease sizes 1, 2, 4: requests 1, 2 and 4 fetch, 3 and 5 to 7 do not.
	want := []bool{true, true, false, true, false, false, false, true}
	if !slices.Equal(asked, want) {
		t.Errorf("AskedRedis of 8 decisions = %v, want %v", asked, want)
	}
}

// Requests still in flight when the gateway stops its limiter (a drain that
// ran past its timeout) must get a decision: a decision queued after Run
// drained its queue used to wait for an answer that never came.
func TestDecisionsAfterRunStopsAreLocal(t *testing.T) {
	l := newLimiter(NewSlidingStore(redisClient(t, testenv.RedisURL(t)), testenv.KeyPrefix(t)), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { l.Run(ctx); close(stopped) }()
	rate := mustRate(t, "1000-M")
	if d := l.Take(context.Background(), "k", rate); !d.Allowed || d.Local {
		t.Fatalf("Take while running = %+v, want allowed by Redis", d)
	}
	cancel()
	<-stopped

	decided := make(chan Decision)
	for i := range 50 {
		key := "k" + string(rune('a'+i%26)) // new keys: no lease to serve them
		go func() { decided <- l.Peek(context.Background(), key, rate) }()
		go func() { decided <- l.Take(context.Background(), key, rate) }()
	}
	timeout := time.After(5 * time.Second)
	for i := range 100 {
		select {
		case d := <-decided:
			if !d.Local {
				t.Errorf("decision after Run stopped = %+v, want a local one", d)
			}
		case <-timeout:
			t.Fatalf("%d of 100 decisions after Run stopped never came", 100-i)
		}
	}
}

// In a Redis outage each request counts once in the fallback, and the
// remaining it shows is after that request: the first local decision
// shows Limit-1, then one less each. (The fallback was charged a whole
// lease for the request whose lease refill met the outage, and showed
// each request's own unit as still remaining.)
func TestFallbackCountsEachRequestOnce(t *testing.T) {
	srv := testenv.StartRedis(t)
	l := startLimiter(t, srv.URL, Options{})
	rate := mustRate(t, "600-M") // leases of up to 6
	for i := range 7 {           // leases of 1, 2 and 4, used up: the next asks for 6
		if d := l.Take(context.Background(), "k", rate); !d.Allowed || d.Local {
			t.Fatalf("Take #%d with Redis up = %+v", i+1, d)
		}
	}
	srv.Stop()
	for i, want := range []int64{599, 598, 597} {
		d := l.Take(context.Background(), "k", rate)
		if !d.Allowed || !d.Local || d.Remaining != want {
			t.Errorf("Take #%d with Redis down = %+v, want allowed locally with %d remaining", i+1, d, want)
		}
	}
}

// The fallback holds at most its bound of keys, and a flood of new keys
// (addresses, during a Redis outage) does not take the window of a key in
// use with it: a client held at its limit stays refused. (At the bound the
// fallback forgot every window, and a tenant refused on 600-M got 600 more
// each time a flood of new addresses reached it.)
func TestFallbackKeepsABusyKeysWindowWhileNewKeysFlood(t *testing.T) {
	const bound = 100
	local, now := newLocal(bound), time.UnixMilli(1_700_000_000_000)
	rate := mustRate(t, "5-M")
	take := func(key string) Taken { return local.Take(Op{Key: key, Rate: rate, Cost: 1}, now) }
	for range rate.Limit {
		take("key:busy")
	}
	for i := range 50 * bound {
		take(fmt.Sprintf("ip:10.0.%d.%d", i/256, i%256))
		if held := len(local.recent) + len(local.older); held > bound {
			t.Fatalf("after %d new keys the fallback holds %d keys, over its bound of %d", i+1, held, bound)
		}
		if i%10 == 0 {
			now = now.Add(time.Millisecond)
			if got := take("key:busy"); got.Admitted != 0 {
				t.Fatalf("after %d new keys the busy key, at its limit of %d, was admitted again: its window was forgotten",
					i+1, rate.Limit)
			}
		}
	}
}

// The leases held are bounded: past the bound a new key's lease is not
// kept, while the keys leased before keep theirs, and a sweep makes room
// again. (A lease was kept for every key and address of the last 10 s,
// as many as a flood from new addresses brought.)
func TestLeasesAreBoundedAndLeasedKeysKeepTheirs(t *testing.T) {
	l := New(nil, Options{})
	l.maxLeases = 10
	busy := l.leaseFor("key:busy")
	for i := range 100 {
		l.leaseFor(fmt.Sprintf("ip:10.0.0.%d", i))
	}
	if n := leasesHeld(l); n != 10 {
		t.Errorf("leases held after 101 keys = %d, want the bound, 10", n)
	}
	if l.leaseFor("key:busy") != busy {
		t.Error("the key leased first lost its lease to the keys that came after the bound")
	}
	l.sweepLeases(time.Now().Add(time.Minute), 10*time.Second)
	l.leaseFor("ip:10.0.1.1")
	if n := leasesHeld(l); n != 1 {
		t.Errorf("leases held after a sweep of every idle one and a new key = %d, want 1", n)
	}
}

// A key whose lease is not kept (past the bound) is still limited: each
// of its decisions goes to Redis.
func TestAKeyWithoutALeaseIsLimitedByRedis(t *testing.T) {
	l := startLimiter(t, testenv.RedisURL(t), Options{})
	l.maxLeases = 0
	rate := mustRate(t, "3-M")
	for i := range 4 {
		d := l.Take(context.Background(), "k", rate)
		if want := i < 3; d.Allowed != want || d.Local {
			t.Errorf("Take #%d = %+v, want allowed %v by Redis", i+1, d, want)
		}
	}
	if n := leasesHeld(l); n != 0 {
		t.Errorf("leases held past a bound of 0 = %d", n)
	}
}

// leasesHeld counts the leases l's shards hold.
func leasesHeld(l *Limiter) int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.leases)
		sh.mu.Unlock()
	}
	return n
}

// A lease's units that expire unused were recorded in Redis; they are given
// back with the next lease fetch, so X-RateLimit-Remaining is what a client
// is then admitted even after a pause. (They stayed counted for the rest of
// the window: a 600-M client shown 592 remaining got 587 after a pause of 2
// s, and lost 5 of its 600.)
func TestExpiredLeaseUnitsAreGivenBack(t *testing.T) {
	l, clk := runningOnAClock(t)

	rate := mustRate(t, "600-M") // leases of up to 6, usable for 1 s
	var d Decision
	for i := range 8 { // leases of 1, 2 and 4, used up, then one of 6
		if d = l.Take(context.Background(), "k", rate); !d.Allowed || d.Local {
			t.Fatalf("Take #%d = %+v, want allowed by Redis", i+1, d)
		}
	}
	if d.Remaining != 592 {
		t.Fatalf("Remaining after 8 Take on 600-M = %d, want 592", d.Remaining)
	}
	clk.add(2 * time.Second) // the lease of 6 expires with 5 unused
	var admitted int64
	for l.Take(context.Background(), "k", rate).Allowed {
		admitted++
	}
	if admitted != d.Remaining {
		t.Errorf("Take after a pause of 2 s admitted %d, want the %d remaining shown before it", admitted, d.Remaining)
	}
}

// runningOnAClock is a running Limiter on Redis whose clock, and the
// store's, is the returned one, which only the test moves.
func runningOnAClock(t *testing.T) (*Limiter, *clock) {
	clk := &clock{}
	clk.set(time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC))
	store := NewSlidingStore(redisClient(t, testenv.RedisURL(t)), testenv.KeyPrefix(t)).WithClock(clk.now)
	l := newLimiter(store, Options{Now: clk.now})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l, clk
}

// The sweep keeps an idle lease until its unused units have left the
// window, so that they can still be given back.
func TestSweepKeepsUnitsToGiveBack(t *testing.T) {
	l, clk := runningOnAClock(t)

	rate := mustRate(t, "600-M")
	for range 8 { // the last lease, of 6, keeps 5 units
		l.Take(context.Background(), "k", rate)
	}
	clk.add(20 * time.Second)
	l.sweepLeases(clk.now(), 10*time.Second)
	if d := l.Take(context.Background(), "k", rate); d.Remaining != 592-1 {
		t.Errorf("Take after 20 s idle and a sweep: Remaining = %d, want 591 (the 5 unused units given back)", d.Remaining)
	}
	clk.add(2 * time.Minute)
	l.sweepLeases(clk.now(), 10*time.Second)
	if n := len(l.shardOf("k").leases); n != 0 {
		t.Errorf("leases after 2 min idle and a sweep = %d, want 0", n)
	}
}

// Giving units back frees only what the bucket holds: a bucket with fewer
// (gone from the window, or a Redis that lost its data) is left alone.
func TestGivingBackFreesNoMoreThanRecorded(t *testing.T) {
	var clk clock
	clk.set(time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC))
	store := NewSlidingStore(redisClient(t, testenv.RedisURL(t)), testenv.KeyPrefix(t)).WithClock(clk.now)
	rate := mustRate(t, "10-M")
	bucket := bucketOf(clk.now(), rate.Period)
	take := func(op Op) Taken {
		t.Helper()
		got, err := store.Take(context.Background(), op)
		if err != nil {
			t.Fatalf("Take(%+v) error = %v", op, err)
		}
		return got
	}
	take(Op{Key: "k", Rate: rate, Cost: 3})
	tests := []struct {
		name string
		op   Op
		want int64 // remaining after it
	}{
		{"more than the bucket holds", Op{Key: "k", Rate: rate, Back: 4, BackBucket: bucket}, 7},
		{"a bucket never written", Op{Key: "k", Rate: rate, Back: 1, BackBucket: bucket - 5}, 7},
		{"part of the bucket", Op{Key: "k", Rate: rate, Back: 2, BackBucket: bucket}, 9},
		{"the rest of it", Op{Key: "k", Rate: rate, Back: 1, BackBucket: bucket}, 10},
		{"from a bucket now empty", Op{Key: "k", Rate: rate, Back: 1, BackBucket: bucket}, 10},
	}
	for _, tt := range tests {
		if got := take(tt.op); got.Remaining != tt.want {
			t.Errorf("%s: Take(%+v).Remaining = %d, want %d", tt.name, tt.op, got.Remaining, tt.want)
		}
	}
}

// The in-process window outlives a recovery: what an instance admitted
// locally still counts if Redis goes again within the window, so an
// instance admits at most Limit locally in any window however often Redis
// comes and goes (the README's bound across an outage rests on it).
func TestFallbackCountsSurviveRecovery(t *testing.T) {
	srv := testenv.StartRedis(t)
	var clk clock
	clk.set(time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC))
	l := startLimiter(t, srv.URL, Options{Now: clk.now})
	rate := mustRate(t, "3-M")
	srv.Stop()
	for i := range 3 {
		if d := l.Take(context.Background(), "k", rate); !d.Allowed || !d.Local {
			t.Fatalf("Take #%d with Redis down = %+v, want allowed locally", i+1, d)
		}
	}
	restartAndRecover(t, srv, l)
	srv.Stop()
	if d := l.Take(context.Background(), "k", rate); d.Allowed {
		t.Errorf("Take with Redis gone again, 3 admitted locally in the window = %+v, want refused", d)
	}
}

// restartAndRecover starts srv again and waits until l uses it (its
// prober finds it within a second), failing the test after 10 s.
func restartAndRecover(t *testing.T, srv *testenv.RedisServer, l *Limiter) {
	t.Helper()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Degraded() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if l.Degraded() {
		t.Fatal("limiter still degraded 10s after Redis came back")
	}
}
