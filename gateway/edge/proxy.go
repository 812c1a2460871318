package edge

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/coinexport/export/gateway/upstream"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

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
// slots, an owner's slots on the export routes): done runs once the answer
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
		relayed = true // relayAnswer's from here, also on a panic in it
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
//
// answer and done are relayAnswer's from its start: each way of relaying
// takes them over as it is called (and cleans up after a panic of its
// own); until then a panic here releases the answer and ends the call
// (end: done, or the page's held bytes then done), exactly once. Left to
// proxyUntilRelayed, which hands them over as it calls relayAnswer, a
// panic in between (growing a page's buffer to a length near the largest
// int, before 8af2e97) held the owner's slot and the upstream connection
// for the process's life.
func (g *Gateway) relayAnswer(resp *fasthttp.Response, rt route, instance string, http11 bool, answer *fasthttp.Response, done callEnd) error {
	end, handedOver := done, false
	defer func() {
		if !handedOver {
			fasthttp.ReleaseResponse(answer)
			end.endCall()
		}
	}()
	length := answer.Header.ContentLength()
	switch {
	case !answer.IsBodyStream():
	case rt.StreamsLargeAnswers && length >= 0 && length <= smallAnswerBytes:
		handedOver = true
		return relaySmall(resp, answer, done)
	case rt.StreamsLargeAnswers && length >= 0:
		page, held := pages.Get(), &heldPageEnd{budget: g.heldAnswers, then: done}
		end = held
		if held.growTo(page, length) {
			handedOver = true
			return relayWholeInto(resp, answer, page, held)
		}
		releasePage(page)
		g.heldAnswers.streamed.Add(1)
	case rt.StreamsLargeAnswers:
		// No length: not export-reader's (each of its answers has one),
		// but an instance's in front of it or a broken one. Read whole, as
		// every answer of these routes once was, so that one broken off is
		// the 502 envelope, not a 200 cut short.
		handedOver = true
		return g.relayWithoutLength(resp, answer, done)
	case length < 0 && !http11:
		handedOver = true
		return g.relayWithoutLength(resp, answer, done)
	}
	var readFailed func(error)
	if answer.IsBodyStream() { // made here alone: a closure the stream keeps costs an allocation
		readFailed = func(err error) { g.countUpstreamError(rt.Upstream, instance, err) }
	}
	// Marked after: relay releases the answer and ends the call (or hands
	// both to resp's stream) as its last steps, and a panic before them
	// is this function's to clean up after.
	relay(resp, answer, done, readFailed)
	handedOver = true
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
	signer := g.signerFor(rt.Upstream)
	if err := g.prepareUpstreamRequest(req, rq, uri, signer); err != nil {
		return err
	}
	idempotentSale := isIdempotentSale(c, rt)
	repeat := upstream.Repeat{
		Always:   idempotentSale,
		IfClosed: rt.safe(),
		Renew:    func(h *fasthttp.RequestHeader, requestURI string) { g.renewIdentity(signer, h, requestURI) },
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
// or the service refusing the gateway's identity (a 401), or a status
// outside 200-599. fasthttp reads any three digits and reads past 1xx
// answers but 101: relayed, "001" reached the client as the status line
// "HTTP/1.1 1 ..." that HTTP clients refuse, a 101 told it the connection
// had switched protocols, and RFC 9110 15 has a client treat any status
// outside 100-599 as a 5xx (FuzzRelay). upstream's plain connections
// refuse such answers as they read them (watchedConn: a 101's connection
// must not be kept, and a "000" is fasthttp's 200), so Do fails on them
// first; the check here is what refuses them from an https instance,
// whose connections are not watched. The failure of a sale sent with an
// Idempotency-Key is marked with what it says of the sale
// (errSaleMayBeApplied, errSaleNothingApplied).
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
	if code := resp.StatusCode(); err == nil && (code < 200 || code > 599) {
		err = fmt.Errorf("%w: status %d, outside HTTP's 200-599", upstream.ErrBadResponse, code)
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
// gateway_upstream_errors_total and sets it on the call's proxy span: its
// kind as the status's description and as error.type, the attribute
// OpenTelemetry's conventions have a failed client span carry, which a
// search for failed calls by kind reads (a description is free text).
func (g *Gateway) countFailure(up, instance string, span trace.Span, err error) {
	kind := errorKind(err)
	g.countUpstreamError(up, instance, err)
	span.SetAttributes(semconv.ErrorTypeKey.String(kind))
	span.SetStatus(codes.Error, kind)
}

// countUpstreamError counts err, a failure of up's instance, in
// gateway_upstream_errors_total.
func (g *Gateway) countUpstreamError(up, instance string, err error) {
	g.metrics.upstreamErrors.WithLabelValues(up, failedInstanceLabel(instance, err), errorKind(err)).Inc()
}

// recordOutcome names, on the access line and the proxy span, the
// instance whose answer or failure the request got (and the answer's
// status), and records a first attempt that failed (noteRepeat).
func (g *Gateway) recordOutcome(rq *request, span trace.Span, up string, out upstream.Outcome, resp *fasthttp.Response, err error) {
	rq.instance = out.Instance
	if out.Instance != "" && span.IsRecording() {
		span.SetAttributes(semconv.ServerAddress(out.Host), semconv.ServerPort(out.Port))
		if err == nil { // else no answer came, and the response's status is fasthttp's default 200
			markAnswerStatus(span, resp.StatusCode())
		}
	}
	if out.Repeated != nil {
		g.noteRepeat(rq, span, up, out.Repeated)
	}
}

// markAnswerStatus records the status of the answer on the proxy span, and
// a 5xx as the span's error with error.type the status, as OpenTelemetry's
// HTTP conventions have a client span do. A 4xx is left unset, as on the
// server spans above and below it, though the conventions say a client
// span should mark one: the request is the client's, relayed unchanged, so
// a 404 is the service answering it rightly, and marking it would make
// every client's 404 or 409 a failed trace. A 401, the service refusing
// the gateway's own identity, is a failure of the call (callFailure).
func markAnswerStatus(span trace.Span, status int) {
	span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= 500 && status <= 599 {
		code := strconv.Itoa(status)
		span.SetAttributes(semconv.ErrorTypeKey.String(code))
		span.SetStatus(codes.Error, code)
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
