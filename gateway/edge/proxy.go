package edge

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// limit takes one request from the class's budget for who, a key id or a
// client IP as kind ("key:" or "ip:") says.
func (g *Gateway) limit(rq *request, class, kind, who string) error {
	if g.limiter == nil {
		return nil
	}
	start := time.Now()
	d := g.limiter.Take(rq.ctx, class+":"+kind+who, g.rates[class])
	g.traceRedisWait(rq, start, d, class)
	g.recordDecision(rq, class, d)
	if !d.Allowed {
		return errRateLimited(d.RetryAfter)
	}
	return nil
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

// forwardedHeaders are the only client headers a service receives; every
// other one (the API key, identity or internal headers, hop-by-hop headers,
// cookies, forwarding headers) is dropped, so nothing a client sends can
// pose as something the gateway vouches for. Keys are lower case.
var forwardedHeaders = map[string]bool{
	"accept": true, "accept-encoding": true, "accept-language": true,
	"content-type": true, "content-length": true, "idempotency-key": true,
	"user-agent": true, "if-none-match": true, "if-modified-since": true,
	"host": true, // replaced with the instance's address
}

// proxySpanNames are the client spans' names, built once per upstream.
var proxySpanNames = map[string]string{
	upstreamExportReader: "proxy " + upstreamExportReader,
	upstreamSalesWriter:  "proxy " + upstreamSalesWriter,
	upstreamShopSchema:   "proxy " + upstreamShopSchema,
}

// proxy sends the request to the route's upstream with the signed identity
// and the trace context, and puts its answer in the response.
func (g *Gateway) proxy(c *fiber.Ctx, rq *request, rt route) error {
	return g.proxyInto(c, rq, rt, c.Response(), nil)
}

// proxyUntilRelayed is proxy for a call whose end matters (the shop schema
// slots, an owner's slots on the list route): done runs once the answer
// has left the gateway. An answer read whole has, when proxy returns; a
// streamed one (shop-schema's, a large list page) only once fasthttp has
// written it to the client, which a slow reader can make a long time, with
// the slot held all along: released when proxy returned, the address's
// slot let one address start a call for each rate-limit token and hold
// every one of shop-schema's slots by reading slowly. The answer is read
// into a response of its own, whose stream is handed to the client's
// wrapped (relayedStream): a response's body stream cannot be replaced
// without closing it.
//
// A route that StreamsLargeAnswers (list pages, up to MaxPageBytes and an
// item: about 5 MB; an item, up to about 2 MiB) has its answers asked for
// as streams. One of at most smallAnswerBytes (most items, a short page) is
// read into the client's response at once and its call ended, done run
// (relaySmall). A larger one is read whole while the gateway holds less
// than heldAnswersLimit bytes of such answers (heldAnswers); past it, it is
// relayed as it comes, through fasthttp's buffers. An answer read whole
// keeps the 502 envelope of an instance that breaks it off, and has
// GATEWAY_WRITE_TIMEOUT to be read; a streamed one reaches the client cut
// short (its Content-Length shows it), and must be read within
// UPSTREAM_READ_TIMEOUT, the bound of the read from the service.
func (g *Gateway) proxyUntilRelayed(c *fiber.Ctx, rq *request, rt route, done callEnd) error {
	answer := fasthttp.AcquireResponse()
	answer.StreamBody = rt.StreamsLargeAnswers
	relayed := false
	defer func() { // also on a panic, which guardedServe answers
		if !relayed {
			fasthttp.ReleaseResponse(answer)
			done.endCall()
		}
	}()
	// Taken before the call, which speaks HTTP/1.1 to the service
	// (inHTTP11) until proxyInto returns.
	http11 := c.Request().Header.IsHTTP11()
	return g.proxyInto(c, rq, rt, answer, func(span trace.Span) error {
		relayed = true
		return g.countRelayFailure(rt.Upstream, rq.instance, span, g.relayAnswer(c.Response(), rt, rq.instance, http11, answer, done))
	})
}

// countRelayFailure counts err, relayAnswer's, as a failure of instance
// unless it is the gateway's own (errAnswersHeldFull), and returns it.
// errors.Is, not errors.As: the target errors.As is given escapes, and
// declared for every answer it cost each GET by id and list page an
// allocation (BenchmarkGateway: 15 allocs/op, 14 without).
func (g *Gateway) countRelayFailure(up, instance string, span trace.Span, err error) error {
	if err != nil && !errors.Is(err, errAnswersHeldFull) {
		g.countFailure(up, instance, span, err)
	}
	return err
}

// relayAnswer is the rest of proxyUntilRelayed once the answer's head has
// come from instance, relaying it into resp for a client that speaks
// HTTP/1.1 or not: answer is released and done run as each way of relaying
// it says. An error is the failure to read an answer read whole
// (relayWholeInto, relaySmall), or the gateway's own errAnswersHeldFull:
// nothing was written yet. A stream relayed as it comes that fails to be
// read is counted once it has ended.
func (g *Gateway) relayAnswer(resp *fasthttp.Response, rt route, instance string, http11 bool, answer *fasthttp.Response, done callEnd) error {
	length := answer.Header.ContentLength()
	switch {
	case !answer.IsBodyStream():
	case rt.StreamsLargeAnswers && length >= 0 && length <= smallAnswerBytes:
		return relaySmall(resp, answer, done)
	case rt.StreamsLargeAnswers && length >= 0:
		page, held := pages.Get(), &heldPageEnd{budget: g.heldAnswers, then: done}
		if held.growTo(page, length) {
			return relayWholeInto(resp, answer, page, held)
		}
		releasePage(page)
		g.heldAnswers.streamed.Add(1)
	case rt.StreamsLargeAnswers:
		// No length: not export-reader's (each of its answers has one),
		// but an instance's in front of it or a broken one. Read whole, as
		// every answer of these routes once was, so that one broken off is
		// the 502 envelope, not a 200 cut short.
		return g.relayWithoutLength(resp, answer, done)
	case length < 0 && !http11:
		return g.relayWithoutLength(resp, answer, done)
	}
	var readFailed func(error)
	if answer.IsBodyStream() { // made here alone: a closure the stream keeps costs an allocation
		readFailed = func(err error) { g.countUpstreamError(rt.Upstream, instance, err) }
	}
	relay(resp, answer, done, readFailed)
	return nil
}

// heldAnswersLimit bounds the bytes of list pages and items (past
// smallAnswerBytes) a gateway holds whole at once, each from its read
// until its client has taken it: 320 ordinary pages of 100 items, or 6
// pages of large items, or 32 items of 1 MiB. Without it nothing did: with
// 160 items of 1 MB (pages of 5.2 MB), 48 syncs at once held 302 MB in the
// gateway, and one key's connections reading slowly 853 MB, past the 256
// Mi of deploy/k8s's gateway pod, which serves every tenant; 400
// connections reading 1 MB items slowly, 820 MB (93 MB with items held to
// it). A var for the tests.
var heldAnswersLimit = 32 << 20

// byteBudget counts bytes held against a limit.
type byteBudget struct {
	mu    sync.Mutex
	held  int
	limit int
	// streamed and refused count the answers that found the budget full:
	// relayed as they come (with their length), or refused 503 (without
	// one). /metrics reads them (watchHeld): how often the bound bites.
	streamed, refused atomic.Uint64
}

// bytesHeld is the bytes counted held now.
func (b *byteBudget) bytesHeld() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// take counts n bytes held, or reports that they would pass the limit.
func (b *byteBudget) take(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.limit {
		return false
	}
	b.held += n
	return true
}

// add counts n bytes held, past the limit if need be.
func (b *byteBudget) add(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held += n
}

// give counts n bytes take counted as no longer held.
func (b *byteBudget) give(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
}

// callEnd ends a call once its answer has left the gateway
// (proxyUntilRelayed): it gives back what the call held, its owner's slot
// (request.endCall) or its address's shop schema slot (endFunc), and the
// bytes of a page held whole (heldPageEnd). An interface, not a func: the
// request ends its owner's call itself, where a closure over it cost every
// GET by id and list page an allocation of 128 bytes (BenchmarkGateway).
type callEnd interface{ endCall() }

// endFunc is a func that ends a call.
type endFunc func()

func (f endFunc) endCall() { f() }

// heldPageEnd ends a call whose answer was held whole within budget: the
// bytes its buffer held (held) are given back, then the call ends as then
// says.
type heldPageEnd struct {
	budget *byteBudget
	held   int
	then   callEnd
}

func (e *heldPageEnd) endCall() {
	e.budget.give(e.held)
	e.then.endCall()
}

// growTo grows page, a pooled buffer, to hold at least n bytes, and counts
// held the buffer's whole capacity, which may be far more than n (up to
// maxPooledPage, a buffer last grown by a larger page): counted by the
// answers' lengths, a page held in a buffer of 1 MiB counted only its own
// bytes, and the budget no longer bounded the memory its pages held. It
// reports false, the buffer not grown, when that would pass the budget.
// What an allocation rounds up past n (its size class: at most 8 KiB past
// 32 KiB) is counted once made, past the budget if need be: counted by n
// alone, a buffer's first growth went uncounted by up to 25 % (32 KiB and
// a byte held in 40 KiB; 100,001 bytes in 106,496).
// The buffer is grown to n alone (grownTo), not by append's steps.
func (e *heldPageEnd) growTo(page *bytebufferpool.ByteBuffer, n int) bool {
	if want := max(cap(page.B), n); want > e.held {
		if !e.budget.take(want - e.held) {
			return false
		}
		e.held = want
	}
	page.B = grownTo(page.B, n)
	if rounded := cap(page.B) - e.held; rounded > 0 {
		e.budget.add(rounded)
		e.held += rounded
	}
	return true
}

// refuse counts an answer without a length refused for the budget, read
// bytes of it read, and is its error: errAnswersHeldFull, with the figures
// that say why for the cause's log line (the access line names only the
// instance the answer came from).
func (e *heldPageEnd) refuse(read int) error {
	e.budget.refused.Add(1)
	return fmt.Errorf("%w: %d bytes of an answer without a length read, %d bytes of other answers held whole, of at most %d",
		errAnswersHeldFull, read, e.budget.bytesHeld()-e.held, e.budget.limit)
}

// grownTo is b with room for n bytes, its bytes kept: a slice made for n
// alone, whose capacity is n rounded up to its size class. Grown by
// append (slices.Grow on b), a buffer that held something grew by steps
// of a quarter past what it was asked for: a buffer of 20 MiB asked to
// hold 32 MiB held 39 MiB, counted past the budget.
func grownTo(b []byte, n int) []byte {
	if cap(b) >= n {
		return b
	}
	return append(slices.Grow([]byte(nil), n), b...) // from nothing, append grows to n exactly
}

// readWholeWithoutLength bounds a streamed answer without a length read
// whole (relayWithoutLength), with heldAnswersLimit: export-reader's bound
// (readWholeUpTo), far above a large shop's full schema (a few MB) or a
// list page (about 5 MB).
const readWholeWithoutLength = 64 << 20

// errTooLargeWithoutLength is a streamed answer without a length larger
// than the gateway reads whole: a 502, the answer being one the gateway
// does not frame.
var errTooLargeWithoutLength = fmt.Errorf("%w: a streamed answer without a length larger than the gateway holds whole is not relayed",
	upstream.ErrBadResponse)

// firstReadWithoutLength is the buffer an answer without a length is first
// read into, doubled as it fills.
const firstReadWithoutLength = 4 << 10

// relayWithoutLength is relay for a streamed answer read whole first
// (proxyUntilRelayed): one of unknown length on the export routes, or to a
// client of HTTP/1.0.
// On the export routes it comes from no export-reader (each of its
// answers has its length), but from something in front of it or broken:
// read whole, one broken off is the 502 envelope, not a 200 cut short, as
// when every answer of theirs was read whole.
// To a client of HTTP/1.0 it comes only from a shop-schema of a build
// before its answer carried its length (mid-upgrade), to a client that
// fasthttp does not read as HTTP/1.1 (1.0, or 1.2 and up, served by 1.0's
// rules): the answer read here is held in the gateway, the service's slot
// free again, for as long as the client takes to read it. fasthttp frames
// such a stream chunked, whatever the client, and RFC 9112 7.1 forbids
// chunked towards HTTP/1.0 (a client that implements 1.0 alone reads the
// chunk sizes as part of the body).
// The answer is read whole, its buffer counted against heldAnswersLimit as
// it grows, as a list page's is (read outside it, up to 64 MiB each, such
// answers were not bounded together), and sent with its Content-Length,
// still as a stream, so that done runs once it has left, as relay's. A
// read that fails is the error to answer (nothing was written yet): a 502
// past readWholeWithoutLength or of the whole budget or more, and a 503
// with Retry-After while other answers hold the budget
// (errAnswersHeldFull); done has run.
func (g *Gateway) relayWithoutLength(resp, answer *fasthttp.Response, done callEnd) error {
	return relayWholeInto(resp, answer, pages.Get(), &heldPageEnd{budget: g.heldAnswers, then: done})
}

// relayWholeInto reads the answer whole into page, a buffer of pages
// counted held (held, which ends the call) and given back once the answer
// has left, and hands it to fasthttp as a stream: a page of a sync made
// afresh each time cost the gateway 110 KB of garbage per ~100 KB page
// (BenchmarkGatewaySyncPage).
func relayWholeInto(resp, answer *fasthttp.Response, page *bytebufferpool.ByteBuffer, held *heldPageEnd) error {
	done := callEnd(held)
	handedOver := false
	defer func() { // after a read that failed, or panicked: proxyUntilRelayed no longer ends the call
		if !handedOver {
			releasePage(page)
			fasthttp.ReleaseResponse(answer)
			done.endCall()
		}
	}()
	if err := readWhole(answer, page, held); err != nil {
		return err
	}
	answer.Header.CopyTo(&resp.Header)
	resp.SetBodyStream(&relayedStream{Reader: bytes.NewReader(page.B), page: page, answer: answer, done: done}, page.Len())
	handedOver = true
	return nil
}

// smallAnswerBytes is the size up to which an answer asked for as a
// stream (StreamsLargeAnswers) is read into the client's response at once
// and its call ended (relaySmall), as the other routes' answers are: 8 of
// make bench's items (~2 KB each), and the last short page of a sync. Such
// answers weigh no more than a sale's answer or an error, and counting
// them against heldAnswersLimit, or holding the owner's slot while a slow
// client reads them, would bound nothing that matters.
const smallAnswerBytes = 16 << 10

// relaySmall is relay for a streamed answer of at most smallAnswerBytes
// (by its Content-Length): it is read into resp's body, the upstream connection
// given back and done run before the client reads it. Read into resp
// (pooled, as every response's body) through a pooled buffer (smallAnswers), a GET by id
// asked for as a stream costs the gateway about what one read whole does
// (BenchmarkGateway). A read that fails is the error to answer (502, or
// 504 on a timeout); done has run.
func relaySmall(resp, answer *fasthttp.Response, done callEnd) error {
	defer done.endCall()
	defer fasthttp.ReleaseResponse(answer)
	page := smallAnswers.Get()
	defer smallAnswers.Put(page)
	if err := readWhole(answer, page, nil); err != nil {
		return err
	}
	answer.Header.CopyTo(&resp.Header)
	resp.SetBody(page.B)
	return nil
}

// readWhole reads answer's body stream into page, its Content-Length's
// bytes (within heldAnswersLimit or smallAnswerBytes: proxyUntilRelayed)
// or, without one, as readWithoutLength does, counted in held, and closes
// the stream: the upstream connection is reused only after a read that
// did not fail.
func readWhole(answer *fasthttp.Response, page *bytebufferpool.ByteBuffer, held *heldPageEnd) error {
	stream := answer.BodyStream()
	var err error
	if length := answer.Header.ContentLength(); length >= 0 {
		page.B = slices.Grow(page.B[:0], length)[:length]
		_, err = io.ReadFull(stream, page.B)
		if err != nil {
			err = upstreamReadError(err)
		}
	} else {
		err = readWithoutLength(stream, page, held)
	}
	if closer, ok := stream.(fasthttp.ReadCloserWithError); ok {
		_ = closer.CloseWithError(err) // with an error, the connection is not reused
	}
	return err
}

// readWithoutLength reads stream, an answer without a length, into page
// up to its end, growing page as it fills, its buffer and each growth
// counted in held first: past readWholeWithoutLength, or of the budget's
// whole limit or more (one of exactly the limit too: a byte is kept to
// tell it from a larger one), it is errTooLargeWithoutLength, and while
// other answers hold the budget errAnswersHeldFull.
func readWithoutLength(stream io.Reader, page *bytebufferpool.ByteBuffer, held *heldPageEnd) error {
	// A byte under the budget's limit, so that the buffer that finds an
	// answer one byte too large is within it: a growth refused is then
	// other answers' doing.
	limit := min(readWholeWithoutLength, held.budget.limit-1)
	page.B = page.B[:0]
	if cap(page.B) > limit+1 { // pooled, larger than the whole budget (a budget under maxPooledPage): left to the collector
		page.B = nil
	}
	// The pooled buffer is counted before it is read into, as a page's
	// with its length is: counted only once it had to grow, an answer that
	// fit in a buffer of up to maxPooledPage was counted nothing, and
	// relayed while other answers held the budget.
	if !held.growTo(page, cap(page.B)) {
		return held.refuse(0)
	}
	for {
		if len(page.B) == cap(page.B) {
			if len(page.B) > limit {
				return errTooLargeWithoutLength
			}
			next := min(max(2*cap(page.B), firstReadWithoutLength), limit+1)
			if !held.growTo(page, next) {
				return held.refuse(len(page.B))
			}
		}
		n, err := stream.Read(page.B[len(page.B):cap(page.B)])
		page.B = page.B[:len(page.B)+n]
		switch {
		case err == io.EOF && len(page.B) > limit:
			return errTooLargeWithoutLength
		case err == io.EOF:
			return nil
		case err != nil:
			return upstreamReadError(err)
		}
	}
}

// pages pools the buffers of answers read whole (relayWholeInto). One over
// maxPooledPage (a page of large items, up to about 5 MB) is left to the
// collector, as export-reader does with its own: pooled, a few such pages
// would pin their buffers for the ordinary pages after them, outside
// heldAnswersLimit's count.
var pages bytebufferpool.Pool

// smallAnswers pools the buffers of answers relaySmall reads, apart from
// pages: bytebufferpool keeps only buffers up to the size of 95 % of those
// put back (it calibrates every 42,000 of a size), and items of ~2 KB,
// far more numerous than a sync's pages, had every page's buffer dropped
// when put back, each page read into one made afresh
// (TestItemsLeaveThePagesBuffersPooled).
var smallAnswers bytebufferpool.Pool

// maxPooledPage is the largest buffer pages keeps: 10 ordinary pages.
const maxPooledPage = 1 << 20

func releasePage(page *bytebufferpool.ByteBuffer) {
	if cap(page.B) <= maxPooledPage {
		pages.Put(page)
	}
}

// upstreamReadError names the kind of a failure to read an answer's body
// as upstream.Do names those of an answer read whole: a timeout is a 504,
// anything else a broken answer, a 502.
func upstreamReadError(err error) error {
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Errorf("%w: reading the answer: %w", upstream.ErrTimeout, err)
	}
	return fmt.Errorf("%w: reading the answer: %w", upstream.ErrBadResponse, err)
}

// relay moves answer into resp and releases answer, then calls done; for a
// streamed answer, both once the stream is closed (written, or failed),
// and readFailed with the failure to read it from the service, if it
// failed so (a 200 its client got cut short).
func relay(resp, answer *fasthttp.Response, done callEnd, readFailed func(error)) {
	answer.Header.CopyTo(&resp.Header)
	if !answer.IsBodyStream() {
		resp.SetBody(answer.Body())
		fasthttp.ReleaseResponse(answer)
		done.endCall()
		return
	}
	resp.SetBodyStream(&relayedStream{Reader: answer.BodyStream(), answer: answer, done: done, readFailed: readFailed},
		answer.Header.ContentLength())
}

// relayedStream is an upstream answer's body stream as the client's
// response holds it: fasthttp closes it once it has written it (or failed
// to), and that is when the call ends.
type relayedStream struct {
	io.Reader
	// page holds the answer relayWholeInto read whole (Reader reads it),
	// nil for one relayed as it comes.
	page   *bytebufferpool.ByteBuffer
	answer *fasthttp.Response
	done   callEnd
	once   sync.Once
	// readFailed, when set, is told of readErr, the first failure to read
	// the stream from the service (not a write's to the client), once the
	// stream is closed: the client got a 200 cut short, which its access
	// line cannot tell, so gateway_upstream_errors_total counts it. Not a
	// timeout: the stream is read from the service as fast as its client
	// takes it, so UPSTREAM_READ_TIMEOUT passing mid-stream is as likely a
	// slow client's (a 5 MB page at under 170 KB/s) as a stalled
	// instance's, and counted under the instance it would set off its
	// alerts for clients' slowness.
	readFailed func(error)
	readErr    error
}

// Read reads the answer, keeping its first failure (readErr).
func (s *relayedStream) Read(p []byte) (int, error) {
	n, err := s.Reader.Read(p)
	if err != nil && err != io.EOF && s.readErr == nil {
		s.readErr = err
	}
	return n, err
}

// WriteTo writes the rest of the answer to w. fasthttp copies a body
// stream through WriteTo when it has one; without, it copied a page read
// whole (a bytes.Reader) through the connection's write buffer and the
// connection's ReadFrom, in chunks, not in the one write it takes, and
// relaying a ~100 KB sync page (with a buffer made afresh for each) cost
// the gateway 3 times the CPU of a page read into the answer's body,
// 1.6 times with WriteTo alone (BenchmarkGatewaySyncPage,
// TestAPageReadWholeLeavesInOneWriteFromAPooledBuffer). A stream that is
// no WriterTo is copied as before.
func (s *relayedStream) WriteTo(w io.Writer) (int64, error) {
	if page, ok := s.Reader.(io.WriterTo); ok {
		return page.WriteTo(w)
	}
	return io.Copy(w, struct{ io.Reader }{s}) // through Read, not back into WriteTo
}

// CloseWithError closes the upstream stream, passing on the write's error
// (with one, fasthttp drops the upstream connection instead of reusing it),
// then releases the answer and calls done.
func (s *relayedStream) CloseWithError(err error) error {
	s.once.Do(func() {
		if stream, ok := s.Reader.(fasthttp.ReadCloserWithError); ok {
			_ = stream.CloseWithError(err)
		}
		if s.page != nil {
			releasePage(s.page)
		}
		fasthttp.ReleaseResponse(s.answer)
		s.done.endCall()
		if s.readErr != nil && s.readFailed != nil {
			if err := upstreamReadError(s.readErr); !errors.Is(err, upstream.ErrTimeout) {
				s.readFailed(err)
			}
		}
	})
	return nil
}

// proxyInto is proxy, putting the answer in resp; then relay, if not nil,
// relays an answer that is not a failure, within the proxy span: an
// answer asked for as a stream is read after upstream.Do returns
// (proxyUntilRelayed), and the span, its failure (relay's, counted as
// callFailure counts Do's: an answer broken off or stalled after its head)
// and gateway_upstream_errors_total cover that read as they cover one in
// Do. Read after the span had ended, an item broken off, counted when it
// was read whole in Do, was counted nowhere, and its proxy span said 200.
func (g *Gateway) proxyInto(c *fiber.Ctx, rq *request, rt route, resp *fasthttp.Response, relay func(trace.Span) error) error {
	req := c.Request()
	uri := receivedRequestURI(req.URI())
	if err := g.prepareUpstreamRequest(req, rq, uri); err != nil {
		return err
	}
	idempotentSale := isIdempotentSale(c, rt)
	repeat := upstream.Repeat{
		Always:   idempotentSale,
		IfClosed: rt.safe(),
		Renew:    g.renewIdentity,
	}
	// The client span only where the trace is recorded: otherwise it would
	// be one more span that goes nowhere, and the service continues the
	// trace from the server span as well.
	ctx, span := rq.ctx, rq.span
	if rq.span.IsRecording() {
		ctx, span = g.tracer.Start(rq.ctx, proxySpanNames[rt.Upstream], clientSpanOptions...)
		defer span.End()
	}
	addTraceContext(&req.Header, trace.SpanContextFromContext(ctx))
	affinity := ""
	if rt.StickyByKey {
		affinity = rq.key.ID
	}
	defer inHTTP11(&req.Header)()
	// From here until Do says otherwise, a panic answers as for a request
	// that may have reached the service (panicError).
	rq.mayHaveSent = true
	out, err := g.upstreams[rt.Upstream].Do(req, resp, uri, repeat, affinity)
	rq.mayHaveSent = !nothingSent(err)
	g.recordOutcome(rq, span, rt.Upstream, out, resp, err)
	if failure := g.callFailure(rt.Upstream, span, idempotentSale, out, resp, err); failure != nil {
		return failure
	}
	resp.Header.Del(fiber.HeaderConnection)
	if relay != nil {
		return relay(span)
	}
	return nil
}

// callFailure is the failure that a call's outcome stands for, counted
// and set on its proxy span, or nil for an answer to relay: Do's error, a
// sale's repeat that left its first attempt in doubt (repeatLeftInDoubt),
// or the service refusing the gateway's identity (a 401). The failure of a
// sale sent with an Idempotency-Key is marked with what it says of the
// sale (errSaleMayBeApplied, errSaleNothingApplied).
func (g *Gateway) callFailure(up string, span trace.Span, idempotentSale bool, out upstream.Outcome, resp *fasthttp.Response, err error) error {
	if err == nil && idempotentSale && repeatLeftInDoubt(out, resp) {
		// The repeat's 5xx speaks of its own attempt (a writer's 503
		// "nothing was applied" when it could not reach the database),
		// and a 401 of the identity alone, not of the first attempt, which
		// may have been applied: the answer is the first's failure, as
		// when the repeat never left (upstream.Do). Relayed, the 503 told
		// a platform that such a sale was not applied.
		err = fmt.Errorf("%w; sent again to %s, which answered %d", out.Repeated, out.Instance, resp.StatusCode())
		out.Instance = out.Repeated.Instance
	}
	if err == nil && resp.StatusCode() == fiber.StatusUnauthorized {
		err = errIdentityRefused
	}
	if err == nil {
		return nil
	}
	g.countFailure(up, out.Instance, span, err)
	switch {
	case idempotentSale && mayHaveArrived(err):
		err = fmt.Errorf("%w: %w", errSaleMayBeApplied, err)
	case idempotentSale && nothingSent(err):
		err = fmt.Errorf("%w: %w", errSaleNothingApplied, err)
	}
	return err
}

// countFailure counts err, a failure of a call to instance, in
// gateway_upstream_errors_total and sets it on the call's proxy span.
func (g *Gateway) countFailure(up, instance string, span trace.Span, err error) {
	g.countUpstreamError(up, instance, err)
	span.SetStatus(codes.Error, errorKind(err))
}

// countUpstreamError counts err, a failure of up's instance, in
// gateway_upstream_errors_total.
func (g *Gateway) countUpstreamError(up, instance string, err error) {
	g.metrics.upstreamErrors.WithLabelValues(up, failedInstanceLabel(instance, err), errorKind(err)).Inc()
}

// prepareUpstreamRequest makes the client's request the one a service
// gets: only the forwarded headers, X-Forwarded-For and the signed
// identity for uri, the path and query as sent. It refuses a compressed
// body (errEncodedBody).
func (g *Gateway) prepareUpstreamRequest(req *fasthttp.Request, rq *request, uri string) error {
	// Once scrubbed, the request holds none of the headers set below, so
	// they are added, without the search for one to replace that Set does.
	if encoded := scrubHeaders(&req.Header); encoded && len(req.Body()) > 0 {
		return errEncodedBody
	}
	// fasthttp writes "Content-Type: application/octet-stream" for a body
	// sent without one; the service would refuse that type, not the missing
	// one (Python requests' data= with a string sends none), and shop-schema,
	// which reads any, would log a type no client sent.
	req.Header.SetNoDefaultContentType(true)
	req.Header.Add(fiber.HeaderXForwardedFor, rq.clientIP)
	g.signer.SignInto(req.Header.AddBytesV, identity.Identity{OwnerID: rq.key.OwnerID, PlatformID: rq.key.PlatformID,
		KeyID: rq.key.ID, Scopes: rq.key.Scopes, RequestID: rq.id}, signedRequest(rq.method, &req.Header, uri), time.Now())
	return nil
}

// inHTTP11 makes the request one in HTTP/1.1 for its way to the service and
// returns what gives it back the client's version. Sent on in the client's
// HTTP/1.0, a request made the service's net/http answer in 1.0 and close
// the connection: each one cost a kept-alive connection to the service, a
// new one dialled and a connection the service left in TIME_WAIT, however
// cheap it was for the client (HTTP/1.0 with Connection: keep-alive,
// pipelined); so did every request of a proxy in front that speaks
// HTTP/1.0 (nginx's default proxy_http_version).
//
// The client's answer does not hang on the restore: fasthttp (v1.78,
// server.go) takes the version and the keep-alive decision that frame it
// (no chunked coding for HTTP/1.0, the connection closed unless asked to
// stay) before it calls the handler, and
// TestServicesAreSpokenToInHTTP11WhateverTheClientSpoke passes without it.
// It keeps the request as the client sent it for whatever reads it after
// the call.
func inHTTP11(h *fasthttp.RequestHeader) (restore func()) {
	if h.IsHTTP11() {
		return func() {}
	}
	client := string(h.Protocol()) // a copy: SetProtocol reuses the buffer
	h.SetProtocol("HTTP/1.1")
	return func() { h.SetProtocol(client) }
}

// recordOutcome names, on the access line and the proxy span, the
// instance whose answer or failure the request got (and the answer's
// status), and records a first attempt that failed (noteRepeat).
func (g *Gateway) recordOutcome(rq *request, span trace.Span, up string, out upstream.Outcome, resp *fasthttp.Response, err error) {
	rq.instance = out.Instance
	if out.Instance != "" && span.IsRecording() {
		span.SetAttributes(semconv.ServerAddress(out.Host), semconv.ServerPort(out.Port))
		if err == nil { // else no answer came, and the response's status is fasthttp's default 200
			span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode()))
		}
	}
	if out.Repeated != nil {
		g.noteRepeat(rq, span, up, out.Repeated)
	}
}

// repeatLogInterval is how often at most a "sent again" warning is logged
// per upstream and kind.
const repeatLogInterval = 10 * time.Second

// noteRepeat records a request sent a second time after its first attempt
// failed: a failure no client saw, so shown to the operator (counted by the
// instance that failed and the kind, logged with the instance at most once
// per interval), on the request's access line (the instance that failed
// and the kind, never throttled) and in the trace, whose proxy span then
// holds two attempts' server spans. The second attempt may go to the same
// instance (a lone one that dropped a kept-alive connection).
func (g *Gateway) noteRepeat(rq *request, span trace.Span, up string, attempt *upstream.FailedAttempt) {
	kind := errorKind(attempt)
	g.metrics.upstreamRetries.WithLabelValues(up, failedInstanceLabel(attempt.Instance, attempt), kind).Inc()
	rq.failed = attempt
	if ok, skipped := g.repeatLog.Allow(up + "/" + kind); ok {
		// Logged once the repeat is done; failed_at says when the first
		// attempt failed (the line's time may be a read timeout later).
		g.log.WarnContext(rq.ctx, "upstream attempt failed; request sent again",
			"upstream", up, "kind", kind, "error", attempt.Error(), "failed_at", attempt.At.UTC().Format(time.RFC3339Nano),
			"skipped_since_last", skipped)
	}
	span.AddEvent("sent again", trace.WithTimestamp(attempt.At), trace.WithAttributes(attrFailedAttemptKind.String(kind),
		attrFailedAttemptInstance.String(attempt.Instance)))
}

// errIdentityRefused is a service's 401. The gateway has already checked
// the key, so the service refused the identity the gateway signed: the
// fault is ours, and relaying the 401 would send the client to rotate a
// valid key.
var errIdentityRefused = errors.New("the service refused the gateway's signed identity: " +
	"IDENTITY_SECRET differs between the gateway and the service, their clocks differ by more than identity.MaxSkew, " +
	"something between them rewrote the request's method, path, query or Idempotency-Key, " +
	"or the service is of a build before identity-v2 (upgrade services first: README, Upgrading to identity-v2)")

// signedRequest is the request the identity is signed for: method as sent
// (proxy passes rq.method, which httpserver.StableMethod keeps as a constant: only a
// routed method is proxied), requestURI as upstream.Do sends it
// (the service reads the same bytes as its RequestURI) and the
// Idempotency-Key, so that the signature opens no other request.
func signedRequest(method string, h *fasthttp.RequestHeader, requestURI string) identity.Request {
	if method == httpserver.MethodOther { // never proxied; the bytes as sent, all the same
		method = string(h.Method())
	}
	r := identity.Request{Method: method, Target: requestURI}
	if key := h.Peek(idempotencyKeyHeader); len(key) > 0 {
		r.IdempotencyKey = string(key)
	}
	return r
}

const idempotencyKeyHeader = "Idempotency-Key"

// renewIdentity signs again, at the time of a repeat, the identity proxy
// signed: a sale repeated after a whole UPSTREAM_READ_TIMEOUT would
// otherwise reach the second instance with a signature the service may
// find too old (identity.MaxSkew), and the client would get a 401 for a
// valid key.
func (g *Gateway) renewIdentity(h *fasthttp.RequestHeader, requestURI string) {
	get := func(name string) string { return string(h.Peek(name)) }
	if err := g.signer.Renew(get, signedRequest(string(h.Method()), h, requestURI), h.SetBytesV, time.Now()); err != nil {
		// Only if the headers were not the ones proxy signed: a bug. The
		// request id is the signed one, for the SRE who greps for it.
		g.log.Error("could not renew the identity of a repeated request", "error", err,
			"request_id", get(identity.HeaderRequestID))
	}
}

// receivedRequestURI is the path and query as the client sent them, copied:
// the services route on the same raw segments as the gateway did (checkPath
// keeps out what they would read otherwise). Not req.RequestURI(), which
// fasthttp rebuilds from the decoded, dot-resolved path once the URI is
// parsed: "a%2F..%2F..%2Fitems" matched the item route here and reached the
// list there.
func receivedRequestURI(u *fasthttp.URI) string {
	var buf [256]byte // longer ones spill to the heap
	b := append(buf[:0], u.PathOriginal()...)
	if query := u.QueryString(); len(query) > 0 {
		b = append(append(b, '?'), query...)
	}
	return string(b)
}

// addTraceContext adds the W3C trace context of sc (traceparent, and
// tracestate if any), which the services' propagator reads. Written here
// rather than by the global propagator's Inject, which costs an allocation
// and a header search per request. Baggage is not forwarded: the gateway
// starts each trace, and trusts no client's baggage.
func addTraceContext(h *fasthttp.RequestHeader, sc trace.SpanContext) {
	if !sc.IsValid() {
		return
	}
	var buf [55]byte // 00-{32 hex}-{16 hex}-{2 hex}
	tid, sid := sc.TraceID(), sc.SpanID()
	b := append(buf[:0], "00-"...)
	b = hex.AppendEncode(b, tid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, sid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, []byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))}) // as Inject writes them
	h.AddBytesV(headerTraceparent, b)
	if ts := sc.TraceState(); ts.Len() > 0 {
		h.Add(headerTracestate, ts.String())
	}
}

// The W3C trace-context headers.
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)

// scrubHeaders deletes every header of the header section outside
// forwardedHeaders, and cookies, and reports whether a Content-Encoding
// other than identity was sent (it visits every header anyway, so the
// check costs no search of its own). All does not visit fasthttp's
// trailer section, which Peek reads after the header section: the scrub
// is whole because misreadHead refused every request with trailer fields.
// The names to drop are gathered first (fasthttp's headers cannot change
// while visited) into one buffer, without an allocation per header.
func scrubHeaders(h *fasthttp.RequestHeader) (encoded bool) {
	var (
		lowerBuf [64]byte
		namesBuf [256]byte
		ends     [16]int
	)
	names, drop := namesBuf[:0], ends[:0]
	for k, v := range h.All() {
		lower := appendLower(lowerBuf[:0], k)
		if string(lower) == "content-encoding" && !noCoding(v) {
			encoded = true // each of the header's lines is seen here
		}
		if !forwardedHeaders[string(lower)] {
			names = append(names, k...)
			drop = append(drop, len(names))
		}
	}
	from := 0
	for _, to := range drop {
		h.DelBytes(names[from:to])
		from = to
	}
	// Cookies are kept apart from the other headers by fasthttp.
	h.DelAllCookies()
	return encoded
}

// noCoding reports whether a Content-Encoding value names no coding:
// identity, or nothing.
func noCoding(v []byte) bool {
	v = bytes.TrimSpace(v)
	return len(v) == 0 || bytes.EqualFold(v, []byte("identity"))
}

// appendLower appends ASCII-lowercased b to dst.
func appendLower(dst, b []byte) []byte {
	for _, ch := range b {
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		dst = append(dst, ch)
	}
	return dst
}

// isIdempotentSale reports whether the request is a sale sent with an
// Idempotency-Key: safe to send again, by us or by the client; one without
// is neither (the writer refuses it 400 anyway).
func isIdempotentSale(c *fiber.Ctx, rt route) bool {
	return rt.RepeatWithIdempotencyKey && len(c.Request().Header.Peek(idempotencyKeyHeader)) > 0
}

// nothingSent reports whether err, upstream.Do's, says that no attempt of
// the request left the gateway: every instance out, or refused, or no
// connection free (a repeat refused after a first attempt that was sent
// is that attempt's failure, not this).
func nothingSent(err error) bool {
	return errors.Is(err, upstream.ErrUnavailable) || errors.Is(err, upstream.ErrUnreachable)
}

// errSaleMayBeApplied marks the failure of a sale sent with an
// Idempotency-Key that may have reached the writer: its answer tells the
// client to retry with the same key. A sale sent without one gets the
// generic answer: there is no key to retry with.
var errSaleMayBeApplied = errors.New("the sale may have been applied")

// errSaleNothingApplied marks the failure of a sale sent with an
// Idempotency-Key that reached no writer (nothingSent): its answer says so,
// as the writer's own 503s do, so that a platform reads the same words for
// the same outcome whoever answered.
var errSaleNothingApplied = errors.New("nothing was applied")

// mayHaveArrived reports whether the request may have reached the
// instance before err: it timed out, or the connection closed or the answer
// was unreadable after it was sent.
func mayHaveArrived(err error) bool {
	return errors.Is(err, upstream.ErrTimeout) || errors.Is(err, upstream.ErrClosed) || errors.Is(err, upstream.ErrBadResponse)
}

// repeatLeftInDoubt reports whether a request was sent again after a first
// attempt that may have arrived, and the repeat answered a 5xx or refused
// the gateway's identity (401), which say nothing of that first attempt.
func repeatLeftInDoubt(out upstream.Outcome, resp *fasthttp.Response) bool {
	status := resp.StatusCode()
	return out.Repeated != nil && mayHaveArrived(out.Repeated.Err) &&
		(status >= fiber.StatusInternalServerError || status == fiber.StatusUnauthorized)
}

// kindUnavailable is errorKind's name for a request no instance was
// tried for; instanceErrorKinds are its other values, each the failure of
// an instance.
const kindUnavailable = "unavailable"

// kindShortage is errorKind's name for a connection the gateway could not
// open for want of its own file descriptors or memory. Counted as the
// instance's "unreachable", it had ExportUpstreamRetries blame a reader
// that was fine ("repeats export-reader requests after unreachable
// failures of http://…:24301") while the gateway sat at its limit; it is
// counted under no instance (failedInstanceLabel).
const kindShortage = "gateway_shortage"

var instanceErrorKinds = []string{"unreachable", "timeout", "closed", "identity_refused", "bad_response"}

// instanceLabel is the upstream_instance of a failure on instance, as
// upstream.Outcome names it: "" when none was tried.
func instanceLabel(instance string) string {
	if instance == "" {
		return noInstance
	}
	return instance
}

// failedInstanceLabel is the upstream_instance of a failure err on
// instance: none for a shortage of the gateway's own, which no instance had.
func failedInstanceLabel(instance string, err error) string {
	if errors.Is(err, upstream.ErrShortage) {
		return noInstance
	}
	return instanceLabel(instance)
}

// repeatedErrorKinds are those after which upstream.Do may send a request
// again (nothing was sent after "unavailable", and a refused identity is
// not repeated).
var repeatedErrorKinds = []string{"unreachable", "timeout", "closed", "bad_response"}

// errorKind names err's kind in gateway_upstream_errors_total.
func errorKind(err error) string {
	switch {
	case errors.Is(err, upstream.ErrUnavailable):
		return kindUnavailable
	case errors.Is(err, upstream.ErrShortage):
		return kindShortage
	case errors.Is(err, upstream.ErrUnreachable):
		return "unreachable"
	case errors.Is(err, upstream.ErrTimeout):
		return "timeout"
	case errors.Is(err, upstream.ErrClosed):
		return "closed"
	case errors.Is(err, errIdentityRefused):
		return "identity_refused"
	default:
		return "bad_response"
	}
}
