package ratelimit

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Decision is the answer for one request. Its booleans are together and
// Batch is a pointer so that it stays 64 bytes: the gateway keeps one in
// each request's state, and a SpanContext (64 bytes) there cost every
// request 64 more bytes, traced or not.
type Decision struct {
	Allowed bool
	// Local reports that the in-process fallback decided (Redis unusable).
	Local bool
	// AskedRedis reports that the decision waited for a lease fetch from
	// Redis, its own or another request's (which a Redis failure may have
	// ended in the local fallback); most decisions are made from a lease
	// in memory.
	AskedRedis bool
	Limit      int64
	Remaining  int64
	// RetryAfter is how long until a request would pass; zero when allowed.
	RetryAfter time.Duration
	// Reset is when every counted request has left the window.
	Reset time.Time
	// Batch is the span of the Redis round trip the decision waited on
	// (the "rate limit batch" span: see startBatchSpan), when one was
	// recorded: when the decision, or the lease fetch it waited for, went
	// to Redis with a traced request among those of its batch; so an
	// untraced request sharing that round trip gets it too (its own span
	// records nothing, link included). Nil otherwise, as always when no
	// span is recorded.
	Batch *trace.SpanContext
}

// Options tune a Limiter. Zero values take the defaults in brackets.
type Options struct {
	// Timeout bounds one round trip to Redis [50ms]; past it the batch is
	// decided locally and the limiter turns degraded.
	Timeout time.Duration
	// MaxBatch caps the decisions sent in one pipeline [512].
	MaxBatch int
	// ProbeInterval is how often a degraded limiter asks Redis for a
	// decision of its own (probeOp) [250ms].
	ProbeInterval time.Duration
	// OnDegraded is called when Redis turns unusable (err) and when it
	// answers again (nil). It must not block.
	OnDegraded func(err error)
	// Now is the clock of the local fallback [time.Now].
	Now func() time.Time
}

// Limiter makes rate-limit decisions. Concurrent decisions are queued and
// sent to Redis together: while one pipeline is in flight the next batch
// gathers, so under load the cost of a round trip is shared by many requests
// (decisions on the same key are merged into one script run with a cost of
// n), and an idle gateway pays no added delay.
type Limiter struct {
	store    *SlidingStore
	local    *Local
	opts     Options
	queue    chan *pending
	done     chan struct{}
	degraded atomic.Bool
	pending  sync.Pool
	shards   [leaseShards]leaseShard
	// leases counts the leases the shards hold, up to MaxLeases.
	leases    atomic.Int64
	maxLeases int64
}

type pending struct {
	op    Op
	reply chan result
	// from is the span of the request that asked, when it is sampled
	// (nil otherwise): the batch's span is made for such requests only.
	from trace.Span
}

// result is one op's share of a script run.
type result struct {
	admitted   int64
	remaining  int64
	retryAfter time.Duration // set when fewer than asked were admitted
	reset      time.Time
	bucket     int64 // where Redis recorded the admitted units
	local      bool
	batch      *trace.SpanContext // the batch's span, when recorded
}

// New returns a limiter over store. Call Run before the first Take.
func New(store *SlidingStore, opts Options) *Limiter {
	if opts.Timeout <= 0 {
		opts.Timeout = 50 * time.Millisecond
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 512
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 250 * time.Millisecond
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.OnDegraded == nil {
		opts.OnDegraded = func(error) {}
	}
	l := &Limiter{store: store, local: NewLocal(), opts: opts, maxLeases: MaxLeases,
		queue: make(chan *pending, 4*opts.MaxBatch), done: make(chan struct{})}
	l.pending.New = func() any { return &pending{reply: make(chan result, 1)} }
	for i := range l.shards {
		l.shards[i].leases = make(map[string]*lease)
	}
	return l
}

// ResetUnix is Reset in Unix seconds, rounded up: a client that waits
// until then is never early.
func (d Decision) ResetUnix() int64 { return ceilUnix(d.Reset) }

// Degraded reports whether decisions are being made in-process because
// Redis is unusable.
func (l *Limiter) Degraded() bool { return l.degraded.Load() }

// Peek reports whether one more request under key would fit, recording
// nothing. A key refused by an earlier Take is answered from memory until
// its Retry-After moment.
func (l *Limiter) Peek(ctx context.Context, key string, rate limiter.Rate) Decision {
	if d, ok := l.refused(key, rate); ok {
		return d
	}
	asked := !l.degraded.Load()
	r := l.take(ctx, Op{Key: key, Rate: rate, Cost: 0})
	d := Decision{Allowed: r.remaining > 0, Limit: rate.Limit, Remaining: r.remaining, Reset: r.reset, Local: r.local,
		AskedRedis: asked, Batch: r.batch}
	if !d.Allowed {
		d.RetryAfter = r.retryAfter
	}
	return d
}

// take runs op in the next batch, or locally while Redis is unusable.
// ctx is the asking request's, for its span alone.
func (l *Limiter) take(ctx context.Context, op Op) result {
	if l.degraded.Load() {
		return l.takeLocally(op)
	}
	p := l.pending.Get().(*pending)
	p.op, p.from = op, nil
	if span := trace.SpanFromContext(ctx); span.SpanContext().IsSampled() {
		p.from = span
	}
	select {
	case l.queue <- p:
	case <-l.done:
		p.from = nil
		l.pending.Put(p)
		return l.takeLocally(op)
	}
	select {
	case r := <-p.reply:
		p.from = nil // not kept alive by the pool
		l.pending.Put(p)
		return r
	case <-l.done:
		// Run stopped: it drained the queue, but p may have been queued
		// after that, and then no answer comes. p is not reused, as a late
		// answer may still land in its reply channel.
		return l.takeLocally(op)
	}
}

// takeLocally decides op in process. Local decisions are per request (a
// lease taken locally is not kept: see refill), so a lease refill is
// charged as the one request it serves: charging its size would count
// requests that never come. Nothing is left for later waiters, so the
// remaining shown is the window's, after this request.
func (l *Limiter) takeLocally(op Op) result {
	op.Cost = min(op.Cost, 1)
	t := l.local.Take(op, l.opts.Now())
	r := share(op, t, t.Admitted, 0)
	r.local = true
	return r
}

// Run sends the queued decisions to Redis and watches for its recovery
// until ctx ends. Decisions asked after that are made locally.
func (l *Limiter) Run(ctx context.Context) {
	go l.probe(ctx)
	go l.sweep(ctx)
	batch := make([]*pending, 0, l.opts.MaxBatch)
	for {
		select {
		case <-ctx.Done():
			close(l.done)
			l.drain()
			return
		case p := <-l.queue:
			batch = append(batch[:0], p)
		}
	gather:
		for len(batch) < l.opts.MaxBatch {
			select {
			case p := <-l.queue:
				batch = append(batch, p)
			default:
				break gather
			}
		}
		l.send(ctx, batch)
	}
}

// drain answers whatever was queued when Run stopped.
func (l *Limiter) drain() {
	for {
		select {
		case p := <-l.queue:
			p.reply <- l.takeLocally(p.op)
		default:
			return
		}
	}
}

// group is the set of queued requests merged into one script run.
type group struct {
	op      Op
	waiters []*pending
}

func (l *Limiter) send(ctx context.Context, batch []*pending) {
	groups := groupOps(batch)
	ops := make([]Op, len(groups))
	for i, g := range groups {
		ops[i] = g.op
	}
	var results []Taken
	var err error
	var batchSpan *trace.SpanContext
	if !l.degraded.Load() {
		rctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
		rctx, span := startBatchSpan(rctx, batch, len(ops))
		results, err = l.store.TakeMany(rctx, ops)
		cancel()
		if span != nil {
			endBatchSpan(span, err)
			sc := span.SpanContext()
			batchSpan = &sc
		}
		if err != nil && l.degraded.CompareAndSwap(false, true) {
			l.opts.OnDegraded(err)
		}
	}
	for i, g := range groups {
		if results == nil {
			for _, p := range g.waiters {
				r := l.takeLocally(p.op)
				r.batch = batchSpan
				p.reply <- r
			}
			continue
		}
		// The admitted units go to the waiters in queue order.
		left := results[i].Admitted
		for _, p := range g.waiters {
			a := min(p.op.Cost, left)
			left -= a
			r := share(p.op, results[i], a, left)
			r.batch = batchSpan
			p.reply <- r
		}
	}
}

// MaxBatchLinks bounds the links of a batch's span to the requests it
// decided: a batch decides up to MaxBatch requests, and a span with
// hundreds of links is more than a trace view shows or a backend keeps.
const MaxBatchLinks = 32

// Attributes of a batch's span.
const (
	attrBatchDecisions = attribute.Key("app.rate_limit.batch.decisions")
	attrBatchScripts   = attribute.Key("app.rate_limit.batch.scripts")
	attrBatchTraced    = attribute.Key("app.rate_limit.batch.traced_requests")
)

// startBatchSpan starts the span of one round trip to Redis, "rate limit
// batch", when a sampled request is among those of batch, and returns ctx
// with it, so that the Redis client's own spans (redisotel) are its
// children; otherwise ctx and nil, at the cost of a look at each pending
// request. The span is a child of the first sampled request's span, so
// that it is sampled with it and adds no trace of its own, and it links
// to the sampled requests it decided (at most MaxBatchLinks; their count
// is an attribute): from a batch found slow, the requests it held. Each
// request's "rate limit" span links back to it (Decision.Batch), so from
// one request id an SRE finds the round trip it waited on, how long that
// took and whether Redis failed it.
func startBatchSpan(ctx context.Context, batch []*pending, scripts int) (context.Context, trace.Span) {
	var parent trace.Span
	var links []trace.Link
	traced := 0
	for _, p := range batch {
		if p.from == nil {
			continue
		}
		traced++
		if parent == nil {
			parent = p.from
		}
		if len(links) < MaxBatchLinks {
			links = append(links, trace.Link{SpanContext: p.from.SpanContext()})
		}
	}
	if parent == nil {
		return ctx, nil
	}
	tracer := parent.TracerProvider().Tracer("github.com/coinexport/export/gateway/ratelimit")
	return tracer.Start(trace.ContextWithSpan(ctx, parent), "rate limit batch", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithLinks(links...), trace.WithAttributes(attribute.String("db.system.name", "redis"),
			attrBatchDecisions.Int(len(batch)), attrBatchScripts.Int(scripts), attrBatchTraced.Int(traced)))
}

// endBatchSpan ends a batch's span with the round trip's outcome: an error
// decided its requests in-process. Its kind is error.type (make trace
// shows it after the status, whose description is err's text): timeout
// (RATE_LIMIT_REDIS_TIMEOUT passed), error_reply (Redis answered with an
// error: OOM, READONLY, ...) or unreachable (no connection, or one that
// broke), or canceled (the limiter was stopped while it was in flight).
func endBatchSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
	}
	span.End()
}

func errorType(err error) string {
	var reply redis.Error
	var network net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &network) && network.Timeout():
		return "timeout"
	case errors.As(err, &reply):
		return "error_reply"
	case errors.Is(err, context.Canceled):
		return "canceled" // the limiter stopped with the round trip in flight: no fault of Redis
	default:
		return "unreachable"
	}
}

// groupOps merges requests on the same key (and of the same kind: look or
// take) so each key costs one script run per batch.
func groupOps(batch []*pending) []*group {
	type gkey struct {
		key  string
		look bool
	}
	index := make(map[gkey]int, len(batch))
	groups := make([]*group, 0, len(batch))
	for _, p := range batch {
		if p.op.Back > 0 { // its units go back to one bucket: a run of its own
			groups = append(groups, &group{op: p.op, waiters: []*pending{p}})
			continue
		}
		k := gkey{p.op.Key, p.op.Cost == 0}
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, &group{op: Op{Key: p.op.Key, Rate: p.op.Rate}})
		}
		groups[i].op.Cost += p.op.Cost
		groups[i].waiters = append(groups[i].waiters, p)
	}
	return groups
}

// share is op's part of script run t: admitted units, with left units
// admitted for later waiters shown as remaining.
func share(op Op, t Taken, admitted, left int64) result {
	r := result{admitted: admitted, remaining: t.Remaining + left, reset: t.Now.Add(t.ResetAfter),
		bucket: bucketOf(t.Now, op.Rate.Period)}
	if admitted < op.Cost || (op.Cost == 0 && r.remaining == 0) {
		r.retryAfter = t.RetryAfter
	}
	return r
}

// probeOp is the decision the prober asks Redis for: one unit of a limit
// never reached, so that the script writes, as every decision that admits
// does. A PING was answered by a Redis that refused every decision with an
// error reply (OOM at maxmemory with noeviction, READONLY on a replica after
// a failover): the limiter went back to it every 250 ms, failed the next
// batch, and the gateway logged both turns, four times a second each, while
// the degraded gauge flapped too fast for the alert on it to fire.
var probeOp = Op{Key: "limiter-probe", Rate: limiter.Rate{Period: time.Second, Limit: math.MaxInt32}, Cost: 1}

// probe asks Redis for probeOp while the limiter is degraded, and makes it
// shared again once that passes.
func (l *Limiter) probe(ctx context.Context) {
	tick := time.NewTicker(l.opts.ProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !l.degraded.Load() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
		_, err := l.store.TakeMany(pctx, []Op{probeOp})
		cancel()
		if err == nil && l.degraded.CompareAndSwap(true, false) {
			l.opts.OnDegraded(nil)
		}
	}
}

// sweep drops idle leases every few seconds.
func (l *Limiter) sweep(ctx context.Context) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			l.sweepLeases(l.opts.Now(), 10*time.Second)
		}
	}
}
