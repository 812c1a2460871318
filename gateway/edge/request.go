package edge

import (
	"context"
	"crypto/rand"
	"log/slog"
	"math"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/saleclaim"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// request is what the gateway knows about one request while serving it.
type request struct {
	ctx   context.Context
	span  trace.Span
	id    string
	route string
	// method, path and clientIP are read once and kept: Fiber's strings
	// point into buffers that the proxy rewrites or that are reused after
	// the handler, and spans outlive both.
	method, path, clientIP string
	// keyInPath: a path segment was an API key (path has it redacted).
	keyInPath bool
	// authFailure is why the request's key did not pass (authFailureMissing
	// and the others), for the access line and the span only: every 401
	// reads alike.
	authFailure string
	// unreadReason is the part of a request that could not be read
	// (unreadReason) on its 400, for the access line and the span.
	unreadReason string
	// lookingUp: the request holds one of its address's places among the
	// keys in lookup at once (guessLookups) until authenticate is done.
	lookingUp bool
	start     time.Time
	key       keystore.Key
	// rate is the decision whose X-RateLimit-* headers the answer carries
	// (when hasRate).
	rate    ratelimit.Decision
	hasRate bool
	// limitedBy is the class of the limit that refused the request (a
	// route class; an address's failure budget, auth_failures, or its guess
	// budget, auth_guesses; or a cap on what is in flight at once: an
	// address's keys in lookup, auth_guesses_in_lookup, the shop schema
	// route's calls per address, the keyed routes' per owner), named on a
	// 429's access line and span; empty when the last limit asked let it
	// through.
	limitedBy string
	// instance is the upstream instance (scheme://host:port) whose answer
	// or failure the request got, for the access line: with several
	// instances, which one served a slow 200 is otherwise nowhere.
	instance string
	// failed is the first attempt of a request sent again, which names
	// the instance that failed it (as instance is written): the "sent
	// again" warning is throttled, so without it a request's access line
	// would hide that instance and the time it cost (a whole read
	// timeout). A pointer, not its fields: every request carries it.
	failed *upstream.FailedAttempt
	// clientRequestID is an X-Request-Id the client sent, as recorded
	// (httpserver.LoggableClientValue): never the request id, which the
	// gateway chooses, but a client that logs only its own id can still
	// be found by it.
	clientRequestID string
	// clientTraceID is the trace id of a traceparent the client sent and
	// the gateway did not adopt (GATEWAY_TRUST_TRACEPARENT off): a client
	// whose own tracing logged that id for the call is found by it.
	clientTraceID string
	// sale names a sale request's item and Idempotency-Key, as the
	// writer's access line does (nil on other routes): a sale the gateway
	// answers itself (the writer out, or killed mid-call: "the sale may
	// have been applied") leaves no line of the writer's, and its request
	// id must still lead to the item and key to reconcile.
	sale *saleNames
	// ownerSlots is the share of its owner's slots takeOwnerSlot took one
	// of for the request, which endCall gives back; nil when none was
	// taken (a keyless route, no cap).
	ownerSlots *inFlightSlots
	// mayHaveSent: an attempt of the request may have reached its
	// service and applied something (proxy passed it on, and upstream.Do
	// did not say otherwise, nothingSent): a panic's answer to a sale says
	// so (panicError).
	mayHaveSent bool
}

// saleNames are a sale request's item id (decoded, as the writer reads
// it) and Idempotency-Key, as httpserver.LoggableClientValue records them.
type saleNames struct {
	itemID, idempotencyKey string
	// applied is what the gateway's own answer said of the sale
	// (saleClaims), as sales-writer records its own: "" for an answer
	// relayed or one that says nothing of it.
	applied string
}

// noteSale records the sale's item and Idempotency-Key (request.sale).
func (rq *request) noteSale(c *fiber.Ctx) {
	rq.noteSaleOf(c.Params("item_id"), c)
}

// noteSaleOf is noteSale with the item as its path has it, escaped (Fiber
// leaves the path so). Fiber's strings point into buffers reused after the
// handler: copied.
func (rq *request) noteSaleOf(escapedItem string, c *fiber.Ctx) {
	item := strings.Clone(escapedItem)
	if decoded, err := url.PathUnescape(item); err == nil {
		item = decoded
	}
	rq.sale = &saleNames{itemID: httpserver.LoggableClientValue(item),
		idempotencyKey: httpserver.LoggableClientValue(string(c.Request().Header.Peek(idempotencyKeyHeader)))}
}

// Span attribute keys of our own.
const (
	attrRequestID   = attribute.Key("request.id")
	attrOwnerID     = attribute.Key("owner.id")
	attrPlatformID  = attribute.Key("platform.id")
	attrKeyID       = attribute.Key("api_key.id")
	attrErrorCode   = httpserver.AttrErrorCode // the services' key too
	attrAuthFailure = attribute.Key("app.auth_failure")
	attrRateClass   = attribute.Key("app.rate_limit.class")
	// attrUnreadReason is the part of a request that could not be read.
	attrUnreadReason = attribute.Key("app.unread_reason")
	// attrItemID and attrIdempotencyKey name a sale's item and key, under
	// the writer's keys.
	attrItemID         = attribute.Key("app.item_id")
	attrIdempotencyKey = attribute.Key("app.idempotency_key")
	attrSaleApplied    = attribute.Key("app.sale_applied")
	// attrFailedAttemptKind and attrFailedAttemptInstance are the error
	// kind and the instance (scheme://host:port) of an attempt sent again.
	attrFailedAttemptKind     = attribute.Key("upstream.failed_attempt.kind")
	attrFailedAttemptInstance = attribute.Key("upstream.failed_attempt.instance")

	// attrClientRequestID is the X-Request-Id a client sent (its own).
	attrClientRequestID = attribute.Key("app.client_request_id")
	// attrClientTraceID is the trace id of a traceparent a client sent,
	// not adopted.
	attrClientTraceID = attribute.Key("app.client_trace_id")
)

// Span start options, built once: each option is an interface value, and
// building them per request costs an allocation apiece.
var (
	serverSpanNewRoot = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot()}
	serverSpanInTrace = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	clientSpanOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// maxServerSpanAttrs is how many attributes endSpan sets at most.
const maxServerSpanAttrs = 17

// begin starts the request's server span. The gateway is the root of a new
// trace unless inbound traceparent headers are trusted by configuration:
// an id chosen by an internet client would let it forge request ids. The
// span's attributes are set once, when it ends (end).
func (g *Gateway) begin(c *fiber.Ctx, routeName string) *request {
	return g.beginAt(c, routeName, time.Time{})
}

// redactSecretLikeSegments is an unmatched path as its access line and
// span record it: each segment holding a run of letters or digits as long
// as a secret's, as sent or %-decoded (httpserver.HoldsSecretLike: a
// shop's ws_key, an API key's secret without its tag), becomes
// "[secret]". Such a path is the client's guess, recorded to show what it
// called; a sale module that sent its shop's ws_key in the schema route's
// path would have it whole in the gateway's log and trace store. A path
// without one is returned as it is.
func redactSecretLikeSegments(path string) string {
	segments := strings.Split(path, "/")
	found := false
	for i, segment := range segments {
		if httpserver.HoldsSecretLike(segment) {
			segments[i], found = "[secret]", true
		}
	}
	if !found {
		return path
	}
	return strings.Join(segments, "/")
}

// beginAt is begin for a request that began before now, at since (an
// unread request's connection start, readStart): its access line's
// duration and its server span both run from it. A zero since is now.
func (g *Gateway) beginAt(c *fiber.Ctx, routeName string, since time.Time) *request {
	return g.beginRecorded(c, routeName, since, true)
}

// beginRecorded is beginAt whose server span is recorded (if sampled) only
// when record is true. Without it the request still has a trace id, its
// request id, and span ids for its log lines, but no span, recorded or
// sampled, whatever the sampler says: a health check's (route.HealthCheck).
func (g *Gateway) beginRecorded(c *fiber.Ctx, routeName string, since time.Time, record bool) *request {
	start := since
	if start.IsZero() {
		start = time.Now()
	}
	raw := c.Path() // Fiber leaves it escaped
	// A whole key in the path is refused (keyInPath); what is recorded
	// also hides one mistyped or cut short, which is no key to refuse.
	// As valid UTF-8: fasthttp takes raw bytes that are not, which OTLP
	// refuses to encode (the span's whole export batch would be dropped).
	path := apikey.RedactKeyLikePath(raw)
	if routeName == unmatchedName {
		path = redactSecretLikeSegments(path)
	}
	rq := &request{route: routeName, method: httpserver.StableMethod(c.Method()), path: strings.Clone(strings.ToValidUTF8(path, "\uFFFD")),
		keyInPath: apikey.PathHoldsKey(raw), clientIP: g.clientIP(c), start: start}
	if own := c.Request().Header.Peek(envelope.RequestIDHeader); len(own) > 0 {
		rq.clientRequestID = httpserver.LoggableClientValue(string(own))
	}
	parent, opts := context.Background(), serverSpanNewRoot
	if g.cfg.TrustTraceparent {
		parent = otel.GetTextMapPropagator().Extract(parent, headerCarrier{&c.Request().Header})
		opts = serverSpanInTrace
	} else {
		rq.clientTraceID = clientTraceID(&c.Request().Header)
	}
	if !since.IsZero() {
		opts = append(slices.Clip(opts), trace.WithTimestamp(since))
	}
	if record {
		rq.ctx, rq.span = g.tracer.Start(parent, routeName, opts...)
	} else {
		rq.ctx = trace.ContextWithSpanContext(parent, unrecordedSpanContext(trace.SpanContextFromContext(parent).TraceID()))
		rq.span = trace.SpanFromContext(rq.ctx) // records nothing
	}
	if tid := rq.span.SpanContext().TraceID(); tid.IsValid() {
		rq.id = tid.String()
	} else {
		rq.id = httpserver.RandomRequestID() // if tracing ever yields no trace id
	}
	return rq
}

// clientTraceID is the trace id of a valid W3C traceparent in h ("" when
// there is none): the caller's trace, which the gateway does not continue
// (it starts a trace of its own) but records, so that an id the client's
// tracing logged for the call leads to the request.
func clientTraceID(h *fasthttp.RequestHeader) string {
	if len(h.Peek("traceparent")) == 0 {
		return "" // most requests: nothing parsed
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), headerCarrier{h}))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// unrecordedSpanContext is the span context of a request whose span is not
// recorded: in the trace traceID (a trusted traceparent's) or, if that is
// not valid, a new one, with a span id of its own, flagged not sampled, so
// that a span started under it is not sampled either (a parent-based
// sampler, the SDK's default) and the context passed on says so.
func unrecordedSpanContext(traceID trace.TraceID) trace.SpanContext {
	var ids [24]byte
	_, _ = rand.Read(ids[:]) // never fails (crypto/rand)
	var sid trace.SpanID
	copy(sid[:], ids[16:])
	if !traceID.IsValid() {
		copy(traceID[:], ids[:16])
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: sid})
}

// clientIP is the caller's address, as a string of its own.
func (g *Gateway) clientIP(c *fiber.Ctx) string {
	peer := c.Context().RemoteIP()
	if g.clientAddr.header == "" {
		return peer.String()
	}
	addr, _ := netip.AddrFromSlice(peer)
	client, notAnAddress := g.clientAddr.read(addr.Unmap(), c.Request().Header.PeekAll(g.clientAddr.header))
	if notAnAddress != nil {
		g.warnNotAnAddress(addr.Unmap(), notAnAddress)
	}
	return client.String()
}

// notAnAddressLogInterval is how often at most warnNotAnAddress speaks:
// a setting that is wrong is wrong on every request, and a line a minute
// is still in any window of the logs someone looks at.
const notAnAddressLogInterval = time.Minute

// notAnAddressLogKey is warnNotAnAddress's one key in its Throttle: one
// key per proxy address would grow with a trusted CIDR's addresses, and
// a single ingress sending junk once would still use up its own.
const notAnAddressLogKey = "GATEWAY_PROXY_HEADER"

// warnNotAnAddress says, at most once a minute while it keeps happening,
// that a trusted proxy (peer) sent the proxy header with an entry that is
// no address: a GATEWAY_PROXY_HEADER naming a header that never holds one
// (a custom header of the scheme or the host; the usual ones are refused
// at start, LoadConfig) started, and made every client the proxy, all in
// one per-IP bucket, with nothing in the logs but their client_ip. Said
// once per process, a trusted internal client sending junk once used it
// up, and the misconfiguration that came later was never said; each line
// counts the entries held back since the last in skipped_since_last. The
// entry is described by its shape, not quoted: the header may carry a
// secret. Only a request whose entry is no address comes here; one whose
// entries are addresses takes no lock and allocates nothing for it.
func (g *Gateway) warnNotAnAddress(peer netip.Addr, entry []byte) {
	ok, skipped := g.notAnAddressLog.Allow(notAnAddressLogKey)
	if !ok {
		return
	}
	g.log.Warn("a trusted proxy sent GATEWAY_PROXY_HEADER's header with an entry that is no IP address: "+
		"the client is taken to be a proxy (the peer, or the trusted address right of the entry); if this header never holds "+
		"the client's address, have the proxy set it in X-Forwarded-For and name that (said at most once a minute)",
		"setting", "GATEWAY_PROXY_HEADER", "header", g.clientAddr.header, "proxy", peer.String(), "entry", entryShape(entry),
		"skipped_since_last", skipped)
}

// end sets the headers every answer carries, then records the request.
func (g *Gateway) end(c *fiber.Ctx, rq *request, rm *routeMetrics) {
	resp := &c.Response().Header
	resp.Set(envelope.RequestIDHeader, rq.id)
	status := c.Response().StatusCode()
	// A 429 of a service's own (shop-schema's reads in flight) is not this
	// limit's: its X-RateLimit-Remaining would contradict the refusal.
	if rq.hasRate && (status != fiber.StatusTooManyRequests || !rq.rate.Allowed) {
		var buf [20]byte
		d := &rq.rate
		resp.SetBytesV("X-RateLimit-Limit", strconv.AppendInt(buf[:0], d.Limit, 10))
		resp.SetBytesV("X-RateLimit-Remaining", strconv.AppendInt(buf[:0], d.Remaining, 10))
		resp.SetBytesV("X-RateLimit-Reset", strconv.AppendInt(buf[:0], d.ResetUnix(), 10))
	}
	elapsed := time.Since(rq.start)
	rm.observe(status, elapsed)
	var errorCode []byte // the gateway's own, or the service's it relays
	if status >= 400 {
		errorCode = resp.Peek(envelope.ErrorCodeHeader)
		rm.countError(errorCode)
	}
	g.endSpan(rq, status, errorCode)
	g.logAccess(rq, status, errorCode, elapsed)
	g.noteAnswer(c, rq, status, rm)
	rq.span.End()
}

// endSpan gives the server span all its attributes in one call (each call
// grows the span's attribute list); none are built for a span that is not
// recorded (sampled out).
func (g *Gateway) endSpan(rq *request, status int, errorCode []byte) {
	span := rq.span
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, maxServerSpanAttrs)
	attrs = append(attrs,
		semconv.HTTPRequestMethodKey.String(rq.method),
		semconv.HTTPRoute(rq.route),
		semconv.ClientAddress(rq.clientIP),
		attrRequestID.String(rq.id),
		semconv.HTTPResponseStatusCode(status))
	if rq.path != "" { // empty when the request could not be read
		attrs = append(attrs, semconv.URLPath(rq.path))
	}
	if rq.clientRequestID != "" {
		attrs = append(attrs, attrClientRequestID.String(rq.clientRequestID))
	}
	if rq.clientTraceID != "" {
		attrs = append(attrs, attrClientTraceID.String(rq.clientTraceID))
	}
	if rq.key.ID != "" {
		attrs = append(attrs, attrOwnerID.String(rq.key.OwnerID), attrKeyID.String(rq.key.ID))
	}
	if rq.key.PlatformID != "" { // read keys have none
		attrs = append(attrs, attrPlatformID.String(rq.key.PlatformID))
	}
	if rq.sale != nil {
		attrs = append(attrs, attrItemID.String(rq.sale.itemID))
		if rq.sale.idempotencyKey != "" {
			attrs = append(attrs, attrIdempotencyKey.String(rq.sale.idempotencyKey))
		}
		if rq.sale.applied != "" {
			attrs = append(attrs, attrSaleApplied.String(rq.sale.applied))
		}
	}
	if rq.authFailure != "" {
		attrs = append(attrs, attrAuthFailure.String(rq.authFailure))
	}
	if status == fiber.StatusTooManyRequests && rq.limitedBy != "" {
		attrs = append(attrs, attrRateClass.String(rq.limitedBy))
	}
	if rq.unreadReason != "" {
		attrs = append(attrs, attrUnreadReason.String(rq.unreadReason))
	}
	if len(errorCode) > 0 {
		attrs = append(attrs, attrErrorCode.String(string(errorCode)))
		if status >= 500 { // error.type marks a failure, which a 4xx is not for a server
			attrs = append(attrs, semconv.ErrorTypeKey.String(string(errorCode)))
		}
	}
	span.SetAttributes(attrs...)
	if status >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(status))
	}
}

// logAccess writes the access line, if the level lets it through; the
// fields are not even built otherwise.
func (g *Gateway) logAccess(rq *request, status int, errorCode []byte, elapsed time.Duration) {
	if !g.log.Enabled(rq.ctx, slog.LevelInfo) {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", rq.method), slog.String("route", rq.route), slog.Int("status", status),
		slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000), slog.String("client_ip", rq.clientIP),
	}
	if len(errorCode) > 0 {
		attrs = append(attrs, slog.String("error_code", string(errorCode)))
	}
	if rq.route == unmatchedName && rq.path != "" {
		// The route names no path here: without it a 404's line says only
		// that some path was wrong, and its span, which has url.path, may
		// be sampled out. As recorded: keys redacted, cut at 128.
		attrs = append(attrs, slog.String("path", httpserver.LoggableClientValue(rq.path)))
	}
	if rq.clientRequestID != "" {
		attrs = append(attrs, slog.String("client_request_id", rq.clientRequestID))
	}
	if rq.clientTraceID != "" {
		attrs = append(attrs, slog.String("client_trace_id", rq.clientTraceID))
	}
	if rq.authFailure != "" {
		attrs = append(attrs, slog.String("auth_failure", rq.authFailure))
	}
	if status == fiber.StatusTooManyRequests && rq.limitedBy != "" {
		attrs = append(attrs, slog.String("rate_limit_class", rq.limitedBy))
	}
	if rq.unreadReason != "" {
		attrs = append(attrs, slog.String("unread_reason", rq.unreadReason))
	}
	if rq.key.ID != "" {
		attrs = append(attrs, slog.String("owner_id", rq.key.OwnerID), slog.String("key_id", rq.key.ID))
		if rq.key.PlatformID != "" {
			attrs = append(attrs, slog.String("platform_id", rq.key.PlatformID))
		}
	}
	if rq.sale != nil {
		attrs = append(attrs, slog.String("item_id", rq.sale.itemID))
		if rq.sale.idempotencyKey != "" {
			attrs = append(attrs, slog.String("idempotency_key", rq.sale.idempotencyKey))
		}
		if rq.sale.applied != "" {
			attrs = append(attrs, slog.String(saleclaim.Key, rq.sale.applied))
		}
	}
	if rq.instance != "" {
		attrs = append(attrs, slog.String("upstream_instance", rq.instance))
	}
	if rq.failed != nil {
		attrs = append(attrs, slog.String("upstream_failed_instance", rq.failed.Instance),
			slog.String("upstream_failed_kind", errorKind(rq.failed)))
	}
	g.log.LogAttrs(rq.ctx, slog.LevelInfo, "request", attrs...)
}

// writeError answers err as an error envelope, dropping whatever an
// upstream may have started to answer.
func (g *Gateway) writeError(c *fiber.Ctx, rq *request, err error) {
	ae, logIt := toAPIError(err)
	if rq.sale != nil {
		rq.sale.applied = saleClaims[ae]
	}
	if logIt {
		// A key lookup PostgreSQL refused (a password changed, the
		// database renamed, a full disk) adds what the operator must do.
		g.log.ErrorContext(rq.ctx, "request failed", "status", ae.Status, "code", ae.Code, "error", err.Error(), postgres.CauseAttr(err))
		rq.span.RecordError(err)
	}
	resp := c.Response()
	resp.Reset()
	setErrorAnswer(resp, ae, rq.id)
}

// setErrorAnswer makes resp, empty, the envelope of ae.
func setErrorAnswer(resp *fasthttp.Response, ae *apiError, requestID string) {
	resp.SetStatusCode(ae.Status)
	resp.Header.SetContentType(envelope.ContentType)
	resp.Header.Set(fiber.HeaderCacheControl, envelope.ErrorCacheControl)
	resp.Header.Set(envelope.ErrorCodeHeader, ae.Code)
	if ae.Status == fiber.StatusUnauthorized {
		// RFC 9110 15.5.2: a 401 names how to authenticate.
		resp.Header.Set(fiber.HeaderWWWAuthenticate, wwwAuthenticate)
	}
	if ae.Status == fiber.StatusUnsupportedMediaType {
		// RFC 9110 15.5.16: the codings that would have been accepted.
		resp.Header.Set(fiber.HeaderAcceptEncoding, "identity")
	}
	if ae.RetryAfter > 0 {
		resp.Header.Set(fiber.HeaderRetryAfter, strconv.FormatInt(retryAfterSeconds(ae.RetryAfter), 10))
	}
	if ae.Allow != "" {
		resp.Header.Set(fiber.HeaderAllow, ae.Allow)
	}
	if ae.Close {
		resp.SetConnectionClose()
	}
	resp.SetBody(envelope.ErrorBytes(ae.Code, ae.Message, requestID))
}

// wwwAuthenticate is the challenge of every 401: an API key in the
// X-API-Key header (no registered scheme fits one).
const wwwAuthenticate = `APIKey realm="export", header="X-API-Key"`

// retryAfterSeconds rounds up, so a client that waits exactly that long is
// never early.
func retryAfterSeconds(d time.Duration) int64 {
	return max(int64(math.Ceil(d.Seconds())), 1)
}

// headerCarrier adapts fasthttp request headers to OTel propagation.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c headerCarrier) Set(key, value string) { c.h.Set(key, value) }
func (c headerCarrier) Keys() []string {
	var keys []string
	for k := range c.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}
