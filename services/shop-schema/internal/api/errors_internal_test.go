package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/iotest"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/prometheus/client_golang/prometheus"
)

// A read the shutdown's drain cut off is the service's doing: 503
// unavailable, neither the 499 of a caller that left nor a shop's
// failure.
func TestCutOffReadIsUnavailable(t *testing.T) {
	h := NewHandler(nil, slog.New(slog.NewJSONHandler(io.Discard, nil)), prometheus.NewRegistry(), 1)
	cutOff, cut := context.WithCancelCause(context.Background())
	cut(httpserver.ErrCutOff)
	// A lookup's error is the context's; net/http's client returns its cause.
	for _, err := range []error{fmt.Errorf("lookup: %w", context.Canceled), fmt.Errorf("shop: %w", httpserver.ErrCutOff)} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/sync/prestashop/schema", nil).WithContext(cutOff)
		code := h.writeError(rec, req, err, "req-1", "shop.example")
		if rec.Code != http.StatusServiceUnavailable || code != "unavailable" {
			t.Errorf("writeError(%v) = %d %s, want 503 unavailable", err, rec.Code, code)
		}
	}
}

// A body its caller stopped sending, closing the connection (net/http then
// cancels the request's context), is a caller that left: 499, not the 400
// of a body that could not be read.
func TestAbandonedBodyIsACallerGone(t *testing.T) {
	h := NewHandler(nil, slog.New(slog.NewJSONHandler(io.Discard, nil)), prometheus.NewRegistry(), 1)
	gone, hangUp := context.WithCancel(context.Background())
	hangUp()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/sync/prestashop/schema", iotest.ErrReader(io.ErrUnexpectedEOF)).WithContext(gone)
	_, err := decode(rec, req)
	code := h.writeError(rec, req, err, "req-1", "")
	if rec.Code != httpserver.StatusClientClosed || code != httpserver.CodeClientClosed {
		t.Errorf("writeError(decode(abandoned body)) = %d %s, want 499 %s", rec.Code, code, httpserver.CodeClientClosed)
	}
}
