package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/services/export-reader/internal/export"
	"github.com/coinexport/export/services/export-reader/internal/replica"
	"github.com/jackc/pgx/v5/pgconn"
)

// fail answers every error it can be given with its status, code and
// message, and logs what on-call must see, at its level, once; a client's
// 4xx is not logged (but for a cursor refused on its signature). A read
// whose caller hung up is a 499, not the reader's failure (500); a read
// the shutdown's drain cut off is a 503 (the reader's doing); any other
// failure while the caller still waits is a 500. The rows pin the mapping
// as it was when fail's 4xx cases moved to refused.
func TestFailAnswersEveryError(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	cutOff, cut := context.WithCancelCause(context.Background())
	cut(httpserver.ErrCutOff)
	wrapped := func(err error) error { return fmt.Errorf("read page: %w", err) }
	tests := []struct {
		name        string
		ctx         context.Context
		err         error
		wantStatus  int
		wantCode    string
		wantMessage string
		wantLog     string // the level and message of the one line logged, "" for none
	}{
		{"bad parameter", context.Background(), wrapped(&paramError{Code: "invalid_parameter", Message: "limit must be 1..500"}),
			400, "invalid_parameter", "limit must be 1..500", ""},
		{"bad cursor", context.Background(), wrapped(export.ErrInvalidCursor),
			400, "invalid_cursor", "cursor is invalid or belongs to another query; pass meta.next_cursor unchanged with the same status and updated_after", ""},
		{"cursor of another secret", context.Background(), wrapped(export.ErrCursorSignature),
			400, "invalid_cursor", "cursor is invalid or belongs to another query; pass meta.next_cursor unchanged with the same status and updated_after",
			"WARN cursor refused: its signature does not match CURSOR_SECRET nor CURSOR_SECRET_PREVIOUS: " +
				"a client sent it with other filters or for another owner, or another reader signed it with another secret " +
				"(every reader must accept every secret in use; see the README's rotation)"},
		{"not found", context.Background(), wrapped(export.ErrNotFound), 404, "not_found", "export item not found", ""},
		{"no key", context.Background(), errNoKey, 401, "unauthenticated", "an API key is required", ""},
		{"no scope", context.Background(), errNoScope, 403, "forbidden", "the API key lacks the export:read scope", ""},
		{"sync barrier gave up", context.Background(), wrapped(catalog.ErrSyncBusy),
			503, "unavailable", "a change to this catalog is still being written; retry this page with backoff",
			"WARN sync barrier gave up: a write of the owner's items is still in flight"},
		{"replica behind", context.Background(), wrapped(replica.ErrBehind),
			503, "unavailable", "the read replica is behind its primary; retry this page (the same cursor) later", ""},
		{"timed out", context.Background(), wrapped(context.DeadlineExceeded),
			503, "unavailable", "the export store did not answer in time; retry with backoff", "ERROR export read timed out"},
		{"cut off by the shutdown's drain", cutOff, wrapped(context.Canceled),
			503, "unavailable", "the reader is shutting down; retry with backoff", "WARN export read cut off: the shutdown's drain timed out"},
		{"caller hung up", gone, wrapped(context.Canceled), 499, "client_closed_request", "the caller closed the request", "INFO client canceled"},
		{"database unreachable", context.Background(), &net.OpError{Op: "write", Net: "unix", Err: syscall.EPIPE},
			503, "unavailable", "the export store is unreachable; retry with backoff", "ERROR export store unreachable"},
		{"query cancelled by the replica's replay", context.Background(), wrapped(&pgconn.PgError{Code: "40001"}),
			503, "unavailable", "the export store cannot serve this read now; retry with backoff", "ERROR export store unavailable"},
		{"a bug", context.Background(), errors.New("scan: wrong number of columns"), 500, "internal_error", "internal error", "ERROR export read failed"},
	}
	for _, tt := range tests {
		var logged bytes.Buffer
		a := New(nil, slog.New(slog.NewJSONHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})), 0, "DATABASE_URL")
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/v1/export/items", nil).WithContext(tt.ctx)
		a.fail(rec, req, tt.err)
		var env envelope.Parsed
		if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error == nil {
			t.Fatalf("%s: body %s is not an error envelope (%v)", tt.name, rec.Body, err)
		}
		if rec.Code != tt.wantStatus || env.Error.Code != tt.wantCode || env.Error.Message != tt.wantMessage {
			t.Errorf("%s: fail = %d %s %q, want %d %s %q", tt.name, rec.Code, env.Error.Code, env.Error.Message,
				tt.wantStatus, tt.wantCode, tt.wantMessage)
		}
		if got := loggedLines(t, &logged); got != tt.wantLog {
			t.Errorf("%s: logged %q, want %q", tt.name, got, tt.wantLog)
		}
	}
}

// loggedLines is each JSON line of logged as its level and message,
// joined by "; ".
func loggedLines(t *testing.T, logged *bytes.Buffer) string {
	t.Helper()
	var lines string
	dec := json.NewDecoder(logged)
	for dec.More() {
		var line struct{ Level, Msg string }
		if err := dec.Decode(&line); err != nil {
			t.Fatalf("log line: %v", err)
		}
		if lines != "" {
			lines += "; "
		}
		lines += line.Level + " " + line.Msg
	}
	return lines
}
