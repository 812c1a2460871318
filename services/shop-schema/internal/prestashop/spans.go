package prestashop

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/httpserver"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Each hop of a shop request (each redirect followed is a hop of its own)
// is a client span, started by tracingTransport. What a hop's outcome was
// is known only once this client has read what the answer says (not JSON,
// too large, wrong shape), so the spans of a page read are held in a
// spanScope until the page read ends and are named by the client, in the
// route's vocabulary; each still ends at the time its answer was read, so
// durations are those of the requests (README, "PrestaShop client").

// Attributes of a shop request that this client gave up on. The request
// did not fail: it was cancelled because another fetch of the same schema
// read failed (cancel_cause names that failure), or the caller left.
const (
	attrCancelReason = attribute.Key("app.cancel_reason") // sibling_failed, caller_left or cut_off
	attrCancelCause  = attribute.Key("app.cancel_cause")  // the sibling's error code
	errorTypeCancel  = "canceled"
)

// tracingTransport starts a client span for each hop and sends the shop
// the span's trace context.
type tracingTransport struct {
	next   http.RoundTripper
	tracer trace.Tracer
}

func (t tracingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	scope := spanScopeOf(r.Context())
	if scope == nil { // not reached: listPage makes every request in a scope
		return t.next.RoundTrip(r)
	}
	ctx, span := t.tracer.Start(r.Context(), "prestashop "+r.Method,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(requestAttrs(r)...))
	h := scope.add(span)
	r = r.Clone(ctx)
	// The trace id is the request id the caller already has (meta.request_id):
	// the shop learns nothing new, and can be asked about a request by it.
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(r.Header))
	resp, err := t.next.RoundTrip(r)
	if err != nil {
		h.stop()
		return nil, err
	}
	_, version, _ := strings.Cut(resp.Proto, "/")
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode), semconv.NetworkProtocolVersion(version))
	resp.Body = answerBody{resp.Body, h}
	return resp, nil
}

// requestAttrs describe a hop as otelhttp did, with the URL and the host
// redacted (a redirect's is the shop's to write, and the guard lets a
// public name such as <key>.example.com through to the dial) and the port
// only when not 443.
func requestAttrs(r *http.Request) []attribute.KeyValue {
	key, _ := r.Context().Value(keyInContext{}).(string)
	host := apikey.RedactKeyLikeHost(r.URL.Hostname())
	if HoldsKey(host, key) {
		host = redacted
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(r.Method),
		semconv.URLFull(redactURL(r.URL.String(), key)),
		semconv.ServerAddress(host),
	}
	if port, err := strconv.Atoi(r.URL.Port()); err == nil && port != 443 {
		attrs = append(attrs, semconv.ServerPort(port))
	}
	return attrs
}

// answerBody notes when the client is done with a hop's answer: it closes
// the body after reading it, and before following a redirect.
type answerBody struct {
	io.ReadCloser
	hop *hop
}

func (b answerBody) Close() error {
	b.hop.stop()
	return b.ReadCloser.Close()
}

// spanScope holds the client spans of one page read: one per hop, counting
// redirects, the dispatcher.php fallback and the display=full retry. A page
// read is sequential, so it needs no lock.
type spanScope struct{ hops []*hop }

type hop struct {
	span    trace.Span
	named   bool      // fail named its outcome
	stopped time.Time // when its answer was read or its request failed
}

func (h *hop) stop() {
	if h.stopped.IsZero() {
		h.stopped = time.Now()
	}
}

type scopeInContext struct{}

// withSpanScope returns ctx carrying a new scope, whose spans end at end.
func withSpanScope(ctx context.Context) (context.Context, *spanScope) {
	s := &spanScope{}
	return context.WithValue(ctx, scopeInContext{}, s), s
}

func spanScopeOf(ctx context.Context) *spanScope {
	s, _ := ctx.Value(scopeInContext{}).(*spanScope)
	return s
}

func (s *spanScope) add(span trace.Span) *hop {
	h := &hop{span: span}
	s.hops = append(s.hops, h)
	return h
}

// fail names err as the outcome of the scope's last request, unless it
// already has one: the route's error code as error.type with status
// Error, or, for a request this client cancelled, canceled and why,
// without Error. err is the *Error of a request or of its answer.
func (s *spanScope) fail(ctx context.Context, err error) {
	var e *Error
	if s == nil || len(s.hops) == 0 || !errors.As(err, &e) {
		return
	}
	last := s.hops[len(s.hops)-1]
	if last.named {
		return
	}
	last.named = true
	// A request that ended because its context was cancelled (not timed
	// out) is our doing. Its own error must say so (Go's client returns the
	// context's cause, or context.Canceled without one): when a shop
	// refuses every connection, the fetches fail together, and one whose
	// failure is named after errgroup cancelled the rest failed all the same.
	if e.err != nil && errors.Is(ctx.Err(), context.Canceled) &&
		(errors.Is(e.err, context.Canceled) || errors.Is(e.err, context.Cause(ctx))) {
		last.span.SetAttributes(append(cancelReason(context.Cause(ctx)), semconv.ErrorTypeKey.String(errorTypeCancel))...)
		return
	}
	last.span.SetAttributes(semconv.ErrorTypeKey.String(errorType(e.Kind)))
	last.span.SetStatus(codes.Error, e.Reason)
}

// cancelReason names who cancelled a request, by its context's cause:
// errgroup cancels with the first failure of a sibling fetch; the drain of
// a stopping server with httpserver.ErrCutOff (the read is answered 503
// unavailable); net/http with none when the caller hangs up.
func cancelReason(cause error) []attribute.KeyValue {
	var sibling *Error
	switch {
	case errors.As(cause, &sibling):
		return []attribute.KeyValue{attrCancelReason.String("sibling_failed"), attrCancelCause.String(errorType(sibling.Kind))}
	case errors.Is(cause, httpserver.ErrCutOff):
		return []attribute.KeyValue{attrCancelReason.String("cut_off")}
	}
	return []attribute.KeyValue{attrCancelReason.String("caller_left")}
}

func errorType(k Kind) string {
	if c := k.Code(); c != "" {
		return c
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// end ends every span of the scope, at the time its hop stopped.
func (s *spanScope) end() {
	for _, h := range s.hops {
		h.stop() // an answer never closed: now
		h.span.End(trace.WithTimestamp(h.stopped))
	}
}
