package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/coinexport/export/pkg/testenv"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// spanOf is the ended span whose context is sc, nil if none.
func spanOf(rec *tracetest.SpanRecorder, sc trace.SpanContext) sdktrace.ReadOnlySpan {
	for _, s := range rec.Ended() {
		if s.SpanContext().Equal(sc) {
			return s
		}
	}
	return nil
}

// A traced request's decision that went to Redis names the round trip it
// waited on (Decision.Batch): a "rate limit batch" span under the
// request's span, linked to it, with the Redis client's span under it, so
// from one request id an SRE finds how long Redis took for it. An untraced
// request's decision makes no span at all.
func TestATracedDecisionNamesItsRedisRoundTrip(t *testing.T) {
	tp, rec := testenv.RecordGlobalSpans(t)
	l := startLimiter(t, testenv.RedisURL(t), Options{})
	rate := mustRate(t, "600-M")

	if d := l.Take(context.Background(), "untraced", rate); !d.AskedRedis || d.Batch != nil {
		t.Errorf("untraced Take = %+v, want asked Redis with no batch span", d)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("an untraced decision made %d spans, want none", n)
	}

	ctx, request := tp.Tracer("test").Start(context.Background(), "request")
	d := l.Take(ctx, "traced", rate)
	request.End()
	if !d.Allowed || d.Local || !d.AskedRedis || d.Batch == nil {
		t.Fatalf("traced Take = %+v, want allowed by Redis with its batch's span", d)
	}
	batch := spanOf(rec, *d.Batch)
	if batch == nil || batch.Name() != "rate limit batch" {
		t.Fatalf("Decision.Batch %v is no recorded \"rate limit batch\" span", d.Batch)
	}
	if batch.Parent().SpanID() != request.SpanContext().SpanID() {
		t.Errorf("batch span's parent = %v, want the request's span %v", batch.Parent().SpanID(), request.SpanContext().SpanID())
	}
	if links := batch.Links(); len(links) != 1 || !links[0].SpanContext.Equal(request.SpanContext()) {
		t.Errorf("batch span's links = %v, want the request's span", links)
	}
	if batch.Status().Code == codes.Error {
		t.Errorf("batch span status = %v, want no error", batch.Status())
	}
	redisSpans := 0
	for _, s := range rec.Ended() {
		if s.Parent().SpanID() == d.Batch.SpanID() && strings.HasPrefix(s.Name(), "redis.") {
			redisSpans++
		}
	}
	if redisSpans == 0 {
		t.Error("no go-redis span under the batch's span")
	}

	// The next fetch leases 2 units (the first lease is 1), and the one
	// after is served from memory: no round trip, no span.
	l.Take(ctx, "traced", rate)
	if d := l.Take(ctx, "traced", rate); d.AskedRedis || d.Batch != nil {
		t.Errorf("Take from the lease = %+v, want neither a round trip nor a batch span", d)
	}
}

// A round trip that failed says so on its span, which the request decided
// in-process for it links to: status error with the cause, and error.type
// the kind of failure, which make trace shows.
func TestAFailedRoundTripIsAnErrorOnItsSpan(t *testing.T) {
	// A Redis that answers at once, refused or an error reply, is given
	// a round trip of a loaded machine's length: at 100 ms, under -race
	// beside a CPU hog, the error reply came after it once and was named
	// a timeout. The stalled one must outlast it (its pause is 2 s).
	const atOnce = 5 * time.Second
	for _, tc := range []struct {
		name, errorType string
		timeout         time.Duration             // Options.Timeout
		redis           func(t *testing.T) string // the URL of a Redis that fails
	}{
		{"refused", "unreachable", atOnce, func(t *testing.T) string { return "redis://" + testenv.RefusingAddr(t) }},
		{"stalled", "timeout", 100 * time.Millisecond, func(t *testing.T) string {
			srv := testenv.StartRedis(t)
			if err := redisClient(t, srv.URL).Do(context.Background(), "CLIENT", "PAUSE", 2000).Err(); err != nil {
				t.Fatal(err)
			}
			return srv.URL
		}},
		{"error reply", "error_reply", atOnce, func(t *testing.T) string {
			srv := testenv.StartRedis(t)
			if err := redisClient(t, srv.URL).ReplicaOf(context.Background(), "127.0.0.1", "1").Err(); err != nil {
				t.Fatal(err)
			}
			return srv.URL
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, rec := testenv.RecordGlobalSpans(t)
			l := startLimiter(t, tc.redis(t), Options{Timeout: tc.timeout})
			ctx, request := tp.Tracer("test").Start(context.Background(), "request")
			d := l.Take(ctx, "k", mustRate(t, "600-M"))
			request.End()
			if !d.Local || d.Batch == nil {
				t.Fatalf("Take with Redis failing = %+v, want decided locally, with its batch's span", d)
			}
			batch := spanOf(rec, *d.Batch)
			if batch == nil || batch.Status().Code != codes.Error || batch.Status().Description == "" {
				t.Fatalf("failed batch span = %v, want status error with the cause", batch)
			}
			if got := attrOf(batch, "error.type"); got != tc.errorType {
				t.Errorf("failed batch span error.type = %q, want %s (status %q)", got, tc.errorType, batch.Status().Description)
			}
		})
	}
}

// A round trip cut short because the limiter stopped is named canceled,
// not blamed on Redis as unreachable; a wrapped error is read through.
func TestAStoppedRoundTripIsNamedCanceled(t *testing.T) {
	for err, want := range map[error]string{
		context.Canceled: "canceled",
		fmt.Errorf("evalsha: %w", context.Canceled): "canceled",
		context.DeadlineExceeded:                    "timeout",
		errors.New("dial unix: connection refused"): "unreachable",
	} {
		if got := errorType(err); got != want {
			t.Errorf("errorType(%v) = %q, want %q", err, got, want)
		}
	}
}

// attrOf is the value of s's attribute key, "" when it has none.
func attrOf(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// A batch links to at most MaxBatchLinks of the traced requests it
// decides, and counts them all.
func TestABatchSpansLinksAreBounded(t *testing.T) {
	tp, rec := testenv.RecordGlobalSpans(t)
	l := New(NewSlidingStore(redisClient(t, testenv.RedisURL(t)), testenv.KeyPrefix(t)), Options{})
	rate := mustRate(t, "600-M")
	const traced = MaxBatchLinks + 8
	var batch []*pending
	for i := range traced + 3 { // three untraced among them
		p := &pending{op: Op{Key: "k", Rate: rate, Cost: 1}, reply: make(chan result, 1)}
		if i < traced {
			_, span := tp.Tracer("test").Start(context.Background(), "request")
			defer span.End()
			p.from = span
		}
		batch = append(batch, p)
	}
	l.send(context.Background(), batch)
	r := <-batch[0].reply
	if r.batch == nil {
		t.Fatal("no batch span for a batch of traced requests")
	}
	span := spanOf(rec, *r.batch)
	if span == nil {
		t.Fatal("no batch span for a batch of traced requests")
	}
	if n := len(span.Links()); n != MaxBatchLinks {
		t.Errorf("batch span has %d links, want %d", n, MaxBatchLinks)
	}
	for _, a := range span.Attributes() {
		if a.Key == attrBatchTraced && a.Value.AsInt64() != traced || a.Key == attrBatchDecisions && a.Value.AsInt64() != traced+3 {
			t.Errorf("batch span %s = %d, want %d traced of %d", a.Key, a.Value.AsInt64(), traced, traced+3)
		}
	}
}

// A Decision is 64 bytes, as before it named its batch's span: the gateway
// keeps one in every request's state, traced or not, and the span context
// itself there (64 bytes more) cost each request 64 bytes more.
func TestADecisionStays64Bytes(t *testing.T) {
	if size := unsafe.Sizeof(Decision{}); size > 64 {
		t.Errorf("a Decision is %d bytes, want at most 64", size)
	}
}

// The request's context is read for its span alone: a traced request
// whose client hung up (its context canceled) is still decided by Redis,
// and the round trip it shares with others is not cut, failed nor
// counted as Redis failing (the limiter stays out of its fallback).
func TestACanceledRequestStillSharesARoundTrip(t *testing.T) {
	tp, rec := testenv.RecordGlobalSpans(t)
	l := startLimiter(t, testenv.RedisURL(t), Options{})
	rate := mustRate(t, "600-M")
	ctx, request := tp.Tracer("test").Start(context.Background(), "request")
	defer request.End()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, decide := range []struct {
		name string
		do   func() Decision
	}{
		{"Take", func() Decision { return l.Take(canceled, "hung-up", rate) }},
		{"Peek", func() Decision { return l.Peek(canceled, "hung-up-peek", rate) }},
	} {
		d := decide.do()
		if !d.AskedRedis || d.Local || d.Batch == nil {
			t.Fatalf("%s with a canceled request context = %+v, want decided by Redis, with its batch's span", decide.name, d)
		}
		if batch := spanOf(rec, *d.Batch); batch == nil || batch.Status().Code == codes.Error {
			t.Errorf("%s: batch span of a canceled request = %v, want one with no error", decide.name, batch)
		}
	}
	if l.Degraded() {
		t.Error("a canceled request context made the limiter fall back in-process")
	}
}

// A sampled request's trace holds nothing of the untraced requests that
// shared its round trip: go-redis' span under the batch recorded the
// whole pipeline as db.statement, every request's key (other tenants' key
// ids, other clients' addresses) and arguments, 59,903 bytes for a batch
// of 512, so at a 10% sample nearly every round trip exported the keys of
// all its requests, sampled or not.
func TestATracedBatchRecordsNoOtherRequestsKey(t *testing.T) {
	tp, rec := testenv.RecordGlobalSpans(t)
	l := New(NewSlidingStore(redisClient(t, testenv.RedisURL(t)), testenv.KeyPrefix(t)), Options{})
	rate := mustRate(t, "600-M")
	_, request := tp.Tracer("test").Start(context.Background(), "request")
	defer request.End()
	traced := &pending{op: Op{Key: "export_read:key:traced", Rate: rate, Cost: 1}, reply: make(chan result, 1), from: request}
	untraced := &pending{op: Op{Key: "export_read:ip:192.0.2.77", Rate: rate, Cost: 1}, reply: make(chan result, 1)}
	l.send(context.Background(), []*pending{traced, untraced})
	if r := <-traced.reply; r.batch == nil {
		t.Fatal("no batch span for a batch with a traced request")
	}
	spans := rec.Ended()
	if len(spans) < 2 {
		t.Fatalf("%d spans, want the batch's and go-redis' under it", len(spans))
	}
	for _, s := range spans {
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), "192.0.2.77") {
				t.Errorf("span %q attribute %s = %.200q: an untraced request's key in a traced request's trace", s.Name(), a.Key, a.Value.String())
			}
		}
	}
}
