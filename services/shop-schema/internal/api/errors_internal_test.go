package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/iotest"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
	"github.com/coinexport/export/services/shop-schema/internal/shopschema"
	"github.com/prometheus/client_golang/prometheus"
)

// writeError answers every error it can be given with its status, code
// and message, returns that code (the reads counter's outcome), sends
// Retry-After: 1 with the busy 429 and with no other 4xx or 5xx (a 503's
// is envelope.WriteError's), and logs a shop's failure (WARN)
// and an unexpected error (ERROR), never a call refused as sent nor a
// caller gone. The rows pin the mapping as it was when writeError's
// refusals moved to refused.
func TestWriteErrorAnswersEveryError(t *testing.T) {
	gone, hangUp := context.WithCancel(context.Background())
	hangUp()
	cutOff, cut := context.WithCancelCause(context.Background())
	cut(httpserver.ErrCutOff)
	type row struct {
		name        string
		ctx         context.Context
		err         error
		wantStatus  int
		wantCode    string
		wantMessage string
		wantLog     string // the level and message of the one line logged, "" for none
	}
	tests := []row{
		{"busy", context.Background(), errBusy, 429, "rate_limited", "too many shop schema reads in progress; retry with backoff", ""},
		{"body too large", context.Background(), fmt.Errorf("%w: over %d bytes", httpserver.ErrBodyTooLarge, maxBodyBytes),
			413, "payload_too_large", "the body must be at most 16384 bytes", ""},
		{"body abandoned", gone, fmt.Errorf("%w: %w", httpserver.ErrBodyAbandoned, io.ErrUnexpectedEOF),
			499, "client_closed_request", "the caller closed the request before sending its body whole", ""},
		{"bad input", context.Background(), &shopschema.InputError{Code: shopschema.CodeMustBeHTTPS, Message: "base_url must use https"},
			400, "base_url_must_be_https", "base_url must use https", ""},
		{"cut off by the shutdown's drain", cutOff, fmt.Errorf("shop: %w", httpserver.ErrCutOff),
			503, "unavailable", "the service is shutting down; retry with backoff", "WARN shop schema read cut off: the shutdown's drain timed out"},
		{"caller gone", gone, fmt.Errorf("lookup: %w", context.Canceled), 499, "client_closed_request", "the caller closed the request", ""},
		{"a bug", context.Background(), errors.New("schema: nil map"), 500, "internal_error", "internal error", "ERROR shop schema read failed"},
	}
	// Each kind of shop failure, and one of no kind, which is a bug.
	for _, shop := range []struct {
		kind   prestashop.Kind
		status int
		code   string
	}{
		{prestashop.KindUnauthorized, 400, "shop_401"},
		{prestashop.KindForbidden, 400, "shop_403"},
		{prestashop.KindNotAllowed, 400, "base_url_not_allowed"},
		{prestashop.KindUnreachable, 502, "shop_unreachable"},
		{prestashop.KindTLS, 502, "shop_tls_error"},
		{prestashop.KindTimeout, 504, "shop_timeout"},
		{prestashop.KindBadResponse, 502, "shop_bad_response"},
		{prestashop.KindTooLarge, 502, "shop_too_large"},
		{prestashop.KindDisabled, 502, "shop_webservice_disabled"},
		{prestashop.KindUnavailable, 502, "shop_unavailable"},
		{prestashop.KindNotFound, 502, "shop_not_found"},
		{prestashop.KindNotShopRoot, 400, "invalid_base_url"},
		{prestashop.KindShortage, 503, "unavailable"},
		{0, 500, "internal_error"},
	} {
		err := fmt.Errorf("read schema: %w", &prestashop.Error{Kind: shop.kind, Resource: "categories", Reason: "the reason"})
		r := row{"shop failure " + shop.code, context.Background(), err, shop.status, shop.code, "categories: the reason", "WARN shop call failed"}
		switch shop.kind {
		case 0:
			r.wantMessage, r.wantLog = "internal error", "ERROR shop schema read failed"
		case prestashop.KindShortage:
			r.wantMessage = "the service is short of resources; retry with backoff"
			r.wantLog = "ERROR shop schema read failed: this process is out of file descriptors, memory or local ports"
		}
		tests = append(tests, r)
	}
	for _, tt := range tests {
		var logged bytes.Buffer
		h := NewHandler(nil, slog.New(slog.NewJSONHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})), prometheus.NewRegistry(), 1, 0)
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/sync/prestashop/schema", nil).WithContext(tt.ctx)
		code := h.writeError(rec, req, tt.err, "req-1", "shop.example")
		var env envelope.Parsed
		if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error == nil {
			t.Fatalf("%s: body %s is not an error envelope (%v)", tt.name, rec.Body, err)
		}
		if rec.Code != tt.wantStatus || env.Error.Code != tt.wantCode || env.Error.Message != tt.wantMessage || code != tt.wantCode {
			t.Errorf("%s: writeError = %d %s %q, returned %s; want %d %s %q", tt.name, rec.Code, env.Error.Code, env.Error.Message,
				code, tt.wantStatus, tt.wantCode, tt.wantMessage)
		}
		// A 503's Retry-After is envelope.WriteError's.
		if retry, want := rec.Header().Get("Retry-After"), map[bool]string{true: "1"}[tt.wantStatus == 429]; retry != want && tt.wantStatus != 503 {
			t.Errorf("%s: Retry-After %q, want %q", tt.name, retry, want)
		}
		var lines []string
		for dec := json.NewDecoder(&logged); dec.More(); {
			var line struct{ Level, Msg string }
			if err := dec.Decode(&line); err != nil {
				t.Fatalf("%s: log line: %v", tt.name, err)
			}
			lines = append(lines, line.Level+" "+line.Msg)
		}
		if want := []string{tt.wantLog}; (tt.wantLog == "" && len(lines) != 0) || (tt.wantLog != "" && fmt.Sprint(lines) != fmt.Sprint(want)) {
			t.Errorf("%s: logged %q, want %q", tt.name, lines, tt.wantLog)
		}
	}
}

// A read the shutdown's drain cut off is the service's doing: 503
// unavailable, neither the 499 of a caller that left nor a shop's
// failure.
func TestCutOffReadIsUnavailable(t *testing.T) {
	h := NewHandler(nil, slog.New(slog.NewJSONHandler(io.Discard, nil)), prometheus.NewRegistry(), 1, 0)
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
	h := NewHandler(nil, slog.New(slog.NewJSONHandler(io.Discard, nil)), prometheus.NewRegistry(), 1, 0)
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
