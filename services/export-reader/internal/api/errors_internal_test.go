package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
)

// A read whose caller hung up is answered 499 client_closed_request, not
// counted as the reader's failure (500); PostgreSQL out of reach is 503
// unavailable, and so is a read the shutdown's drain cut off (the reader's
// doing, not a 499); any other failure while the caller still waits is a
// 500.
func TestFailTellsAHangUpFromAFailure(t *testing.T) {
	a := New(nil, slog.New(slog.NewJSONHandler(io.Discard, nil)), 0, "DATABASE_URL")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	cutOff, cut := context.WithCancelCause(context.Background())
	cut(httpserver.ErrCutOff)
	tests := []struct {
		name       string
		ctx        context.Context
		err        error
		wantStatus int
		wantCode   string
	}{
		{"caller hung up", gone, context.Canceled, 499, "client_closed_request"},
		{"cut off by the shutdown's drain", cutOff, context.Canceled, 503, "unavailable"},
		{"database unreachable", context.Background(), &net.OpError{Op: "write", Net: "unix", Err: syscall.EPIPE}, 503, "unavailable"},
		{"a bug", context.Background(), errors.New("scan: wrong number of columns"), 500, "internal_error"},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/v1/export/items", nil).WithContext(tt.ctx)
		a.fail(rec, req, tt.err)
		var env envelope.Parsed
		if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error == nil {
			t.Fatalf("%s: body %s is not an error envelope (%v)", tt.name, rec.Body, err)
		}
		if rec.Code != tt.wantStatus || env.Error.Code != tt.wantCode {
			t.Errorf("%s: fail = %d %s, want %d %s", tt.name, rec.Code, env.Error.Code, tt.wantStatus, tt.wantCode)
		}
	}
}
