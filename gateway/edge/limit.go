package edge

import (
	"time"

	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/ulule/limiter/v3"
	"go.opentelemetry.io/otel/trace"
)

// limit takes one request from the class's budget for who, a key id or a
// client IP as kind ("key:" or "ip:") says.
func (g *Gateway) limit(rq *request, class, kind, who string) error {
	if g.limiter == nil {
		return nil
	}
	d := g.take(rq, class+":"+kind+who, g.rates[class], class)
	g.recordDecision(rq, class, d)
	if !d.Allowed {
		return errRateLimited(d.RetryAfter)
	}
	return nil
}

// take takes one request from key's budget at rate, and traces its wait
// on Redis as budget's (traceRedisWait): every Take goes through here, so
// that no round trip is in a trace without a "rate limit" span waiting on
// it.
func (g *Gateway) take(rq *request, key string, rate limiter.Rate, budget string) ratelimit.Decision {
	start := time.Now()
	d := g.limiter.Take(rq.ctx, key, rate)
	g.traceRedisWait(rq, start, d, budget)
	return d
}

// traceRedisWait gives a decision that waited on Redis a span, from start
// to now. Only those get one: most decisions come from a lease in memory in
// well under a microsecond, and a span apiece would cost more than they do.
// The span names the budget (app.rate_limit.class): a request can wait on
// two, the address's key-guessing budget before an uncached key is looked
// up and then its route's limit, and "rate limit" alone would not tell
// which one was slow. It links to the span of the Redis round trip it
// waited on, "rate limit batch" (ratelimit.Decision.Batch, recorded only
// for a traced request): that round trip's time, error and go-redis span.
func (g *Gateway) traceRedisWait(rq *request, start time.Time, d ratelimit.Decision, budget string) {
	// A request whose server span is not recorded gets none: a health
	// check's, which whatever the sampler (always_on samples a child of an
	// unsampled span) would be a trace of its own.
	if !d.AskedRedis || !rq.span.IsRecording() {
		return
	}
	opts := make([]trace.SpanStartOption, 0, 3) // one allocation, as the variadic call made
	opts = append(opts, trace.WithTimestamp(start), trace.WithAttributes(attrRateClass.String(budget)))
	if d.Batch != nil {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: *d.Batch}))
	}
	_, span := g.tracer.Start(rq.ctx, "rate limit", opts...)
	span.End()
}

// recordDecision counts d and makes it the one the answer's headers show.
func (g *Gateway) recordDecision(rq *request, class string, d ratelimit.Decision) {
	if c, ok := g.decisionMetrics[decisionLabels{class, d.Allowed, d.Local}]; ok {
		c.Inc()
	} else {
		g.metrics.rateDecisions.WithLabelValues(class, decisionLabel(d.Allowed), backendLabel(d.Local)).Inc()
	}
	rq.rate, rq.hasRate, rq.limitedBy = d, true, ""
	if !d.Allowed {
		rq.limitedBy = class
	}
}
