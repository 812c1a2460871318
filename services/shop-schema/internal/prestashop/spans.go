package prestashop

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Each shop request is an otelhttp client span, and otelhttp names a
// failure by the Go type of the error (*prestashop.Error for a request that
// was only cancelled because another fetch of the call failed first) or by
// the status code, marks a request we cancelled ourselves as failed, and
// ends the span when the body is read to EOF, before this client has read
// what the answer says. So the spans it starts for a page read are held in
// a spanScope: otelhttp's error.type and Error status are kept off them, and
// they end when the page read ends, once its outcome is named (README,
// "PrestaShop client").

// Attributes of a shop request that this client gave up on. The request
// did not fail: it was cancelled because another fetch of the same schema
// read failed (cancel_cause names that failure), or the caller left.
const (
	attrCancelReason = attribute.Key("app.cancel_reason") // sibling_failed or caller_left
	attrCancelCause  = attribute.Key("app.cancel_cause")  // the sibling's error code
	errorTypeCancel  = "canceled"
)

// spanScope holds the client spans of one page read: one per hop, counting
// redirects, the dispatcher.php fallback and the display=full retry.
type spanScope struct {
	mu    sync.Mutex
	spans []*hopSpan
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

// fail names err as the outcome of the scope's last request, unless it
// already has one: the route's error code as error.type with status
// Error, or, for a request this client cancelled, canceled and why,
// without Error. err is the *Error of a request or of its answer.
func (s *spanScope) fail(ctx context.Context, err error) {
	var e *Error
	if s == nil || !errors.As(err, &e) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.spans) == 0 {
		return
	}
	last := s.spans[len(s.spans)-1]
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
		why := []attribute.KeyValue{attrCancelReason.String("caller_left")}
		var sibling *Error // errgroup cancels with the first failure as the cause
		if errors.As(context.Cause(ctx), &sibling) {
			why = []attribute.KeyValue{attrCancelReason.String("sibling_failed"), attrCancelCause.String(errorType(sibling.Kind))}
		}
		last.Span.SetAttributes(append(why, semconv.ErrorTypeKey.String(errorTypeCancel))...)
		return
	}
	last.Span.SetAttributes(semconv.ErrorTypeKey.String(errorType(e.Kind)))
	last.Span.SetStatus(codes.Error, e.Reason)
}

func errorType(k Kind) string {
	if c := k.Code(); c != "" {
		return c
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// end ends every span of the scope, at the time otelhttp ended it. A span
// otelhttp saw fail whose outcome was not named gets _OTHER, so that no
// failure passes for a success.
func (s *spanScope) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.spans {
		h.mu.Lock()
		failed := h.failed
		h.mu.Unlock()
		if failed && !h.named {
			h.Span.SetAttributes(semconv.ErrorTypeOther)
			h.Span.SetStatus(codes.Error, "")
		}
		h.release()
	}
}

// hopSpan is a client span otelhttp started inside a scope.
type hopSpan struct {
	trace.Span
	named bool // the scope named its outcome (guarded by the scope's mu)

	mu       sync.Mutex
	failed   bool // otelhttp saw the request fail
	endOpts  []trace.SpanEndOption
	ended    bool // otelhttp ended it
	released bool // the scope ended it
}

// SetAttributes keeps otelhttp's error.type off the span.
func (h *hopSpan) SetAttributes(kv ...attribute.KeyValue) {
	kept := kv[:0:0]
	for _, a := range kv {
		if a.Key == semconv.ErrorTypeKey {
			h.mu.Lock()
			h.failed = true
			h.mu.Unlock()
			continue
		}
		kept = append(kept, a)
	}
	h.Span.SetAttributes(kept...)
}

// SetStatus keeps otelhttp's Error status off the span.
func (h *hopSpan) SetStatus(code codes.Code, description string) {
	if code == codes.Error {
		h.mu.Lock()
		h.failed = true
		h.mu.Unlock()
		return
	}
	h.Span.SetStatus(code, description)
}

// End notes when otelhttp ended the span; the scope ends it.
func (h *hopSpan) End(opts ...trace.SpanEndOption) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		h.Span.End(opts...)
		return
	}
	if !h.ended {
		h.ended = true
		h.endOpts = append([]trace.SpanEndOption{trace.WithTimestamp(time.Now())}, opts...)
	}
}

func (h *hopSpan) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
	h.Span.End(h.endOpts...)
}

// scopedTracerProvider gives otelhttp a tracer whose spans, when started
// inside a spanScope, are hopSpans of that scope.
type scopedTracerProvider struct{ trace.TracerProvider }

func (p scopedTracerProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return scopedTracer{p.TracerProvider.Tracer(name, opts...)}
}

type scopedTracer struct{ trace.Tracer }

func (t scopedTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, span := t.Tracer.Start(ctx, name, opts...)
	s := spanScopeOf(ctx)
	if s == nil {
		return ctx, span
	}
	h := &hopSpan{Span: span}
	s.mu.Lock()
	s.spans = append(s.spans, h)
	s.mu.Unlock()
	return trace.ContextWithSpan(ctx, h), h
}
