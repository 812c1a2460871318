package identity

import (
	"net/http"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"go.opentelemetry.io/otel/trace"
)

// Middleware verifies the signed identity of every request and stores it in
// the request's context. Unsigned calls get a 401 envelope; the request id of
// such an answer is the trace id of the current span, since no trusted one
// was sent.
func (s *Signer) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.Verify(r.Header.Get, time.Now())
		if err != nil {
			requestID := trace.SpanContextFromContext(r.Context()).TraceID().String()
			envelope.WriteError(w, http.StatusUnauthorized, "unauthenticated",
				"the request did not come through the gateway", requestID)
			return
		}
		next.ServeHTTP(w, r.WithContext(WithContext(r.Context(), id)))
	})
}
