package httpserver

import (
	"net/http"
	"strings"

	"github.com/coinexport/export/pkg/apikey"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// serverSpanOptions are built once: each option is an interface value.
var serverSpanOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// traced starts each request's server span, continuing the trace of the
// gateway's traceparent, and ends it when next returns; the health probe
// has none. dispatch names the span after the route and adds the identity.
//
// It stands in for otelhttp's handler, which built a dozen attributes,
// wrapped the writer and the body, and recorded metrics (to a meter
// provider we never install) for every request, recorded or not: 11 % of
// sales-writer's CPU in the sales bench. Attributes are set here only on a
// recorded span; the status comes from dispatch's statusRecorder.
func (s *Server) traced(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == healthPath {
			next.ServeHTTP(w, r)
			return
		}
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := s.tracer.Start(ctx, s.cfg.Service, serverSpanOptions...)
		defer span.End()
		if span.IsRecording() {
			span.SetAttributes(requestAttrs(r)...)
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// requestAttrs are the server span's attributes known before routing.
func requestAttrs(r *http.Request) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(StableMethod(r.Method)),
		semconv.URLPath(redactedPath(r.URL.Path)),
	}
	if ua := r.UserAgent(); ua != "" {
		// forwarded by the gateway as clients send it
		attrs = append(attrs, semconv.UserAgentOriginal(LoggableClientValue(ua)))
	}
	return attrs
}

// redactedPath is path without any API key a client put in it, whole,
// mistyped or cut short (the gateway refuses a path with a whole key; this
// keeps the rest, and one sent straight to a service, out of its spans),
// and as valid UTF-8: the path is decoded, so "%FF" is a byte OTLP refuses
// to encode, which would drop the span's whole export batch.
func redactedPath(path string) string {
	return strings.ToValidUTF8(apikey.RedactKeyLikePath(path), "\uFFFD")
}
