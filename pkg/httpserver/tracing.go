package httpserver

import (
	"net/http"
	"strings"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/percent"
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
		// forwarded by the gateway as clients send it: a module that
		// writes its shop's ws_key there sends it on every call
		if HoldsSecretLike(ua) && !apikey.ContainsKeyLike(ua) {
			ua = "[holds a secret]" // a key is named as such below
		}
		attrs = append(attrs, semconv.UserAgentOriginal(LoggableClientValue(ua)))
	}
	return attrs
}

// secretLikeRun is how many ASCII letters and digits in a row make client
// text look like a secret that no stricter check names: a PrestaShop
// ws_key is 32 of them, an API key's secret without its tag 49
// (apikey.ContainsKeyLike needs the tag).
const secretLikeRun = 32

// secretDecodings is how many times HoldsSecretLike %-decodes text again,
// as apikey decodes a path in its search for a key.
const secretDecodings = 4

// HoldsSecretLike reports whether s holds secretLikeRun ASCII letters or
// digits in a row, as sent or %-decoded (percent.HoldsDecoded). For text
// recorded only to show what a client sent (a User-Agent, a path no route
// has), never for an id the client chose, which may have that shape.
func HoldsSecretLike(s string) bool {
	return percent.HoldsDecoded(s, secretDecodings, holdsSecretLikeRun)
}

// holdsSecretLikeRun reports whether s holds secretLikeRun ASCII letters
// or digits in a row.
func holdsSecretLikeRun(s string) bool {
	run := 0
	for i := range len(s) {
		c := s[i]
		if c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
			if run++; run >= secretLikeRun {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
}

// redactedPath is path without any API key a client put in it, whole,
// mistyped or cut short (the gateway refuses a path with a whole key; this
// keeps the rest, and one sent straight to a service, out of its spans),
// and as valid UTF-8: the path is decoded, so "%FF" is a byte OTLP refuses
// to encode, which would drop the span's whole export batch.
func redactedPath(path string) string {
	return strings.ToValidUTF8(apikey.RedactKeyLikePath(path), "\uFFFD")
}
