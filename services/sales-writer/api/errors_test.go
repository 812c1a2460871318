package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/coinexport/export/services/sales-writer/salescheck"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestRefusalsBeforeTheSaleOnTheWire pins, byte for byte, every answer
// decided before the sale logic runs (the caller's identity, the query,
// the headers, the body, the item id): status, body and headers. Other
// tests check the code and a word of the message; a client may match the
// whole message, and which function picks the status is no concern of it.
func TestRefusalsBeforeTheSaleOnTheWire(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	w := f.writer("market-a")
	good := `{"external_order_id":"order-1"}`
	const useUTF8 = "; send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)"
	anonymous := identity.Identity{RequestID: "req-anon"}
	readOnly := w
	readOnly.Scopes = []string{identity.ScopeExportRead}
	noPlatform := w
	noPlatform.PlatformID = ""
	badOwner := w
	badOwner.OwnerID = "not-a-uuid"
	// A key cut short still looks like one (apikey.ContainsKeyLike), and is
	// short enough to be repeated if it did not.
	key, _, err := apikey.Generate([]string{identity.ScopeSalesWrite})
	if err != nil {
		t.Fatal(err)
	}
	keyLike := key[:40]
	callerGone, hangUp := context.WithCancel(context.Background())
	hangUp()

	tests := []struct {
		name       string
		c          call
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"anonymous", call{id: anonymous, key: "k", body: good}, 401, "unauthenticated", "this route needs an API key"},
		{"anonymous with a bad body", call{id: anonymous, key: "k", body: "x"}, 401, "unauthenticated", "this route needs an API key"},
		{"key without sales:write", call{id: readOnly, key: "k", body: good}, 403, "forbidden", "the API key lacks scope sales:write"},
		{"key without platform", call{id: noPlatform, key: "k", body: good}, 403, "forbidden", "the API key is not bound to a platform"},
		{"key of an invalid owner", call{id: badOwner, key: "k", body: good}, 403, "forbidden", "the API key is not bound to a valid owner"},
		{"a query parameter", call{key: "k", body: good, query: "dry_run=1"}, 400, "invalid_parameter",
			"the sale routes read no query parameters; the request is the JSON body"},
		// Each library's default for a body given as a string or a map,
		// named in the answer so that its user recognises it.
		{"no content type", call{key: "k", body: good, contentType: "-"}, 400, "invalid_content_type",
			"Content-Type must be application/json; the request has none"},
		{"fetch's string body", call{key: "k", body: good, contentType: "text/plain;charset=UTF-8"}, 400, "invalid_content_type",
			"Content-Type must be application/json, not text/plain"},
		{"axios' string body", call{key: "k", body: good, contentType: "application/x-www-form-urlencoded"}, 400, "invalid_content_type",
			"Content-Type must be application/json, not application/x-www-form-urlencoded"},
		{"PHP curl's array", call{key: "k", body: good, contentType: "multipart/form-data; boundary=------------------------1d3b5a7c"}, 400,
			"invalid_content_type", "Content-Type must be application/json, not multipart/form-data"},
		{"unreadable content type", call{key: "k", body: good, contentType: "application/json; charset"}, 400, "invalid_content_type",
			"Content-Type must be application/json; the one sent cannot be read"},
		{"content type holding a key", call{key: "k", body: good, contentType: "application/" + keyLike}, 400, "invalid_content_type",
			"Content-Type must be application/json"},
		{"content type too long to repeat", call{key: "k", body: good, contentType: "application/" + strings.Repeat("x", 60)}, 400,
			"invalid_content_type", "Content-Type must be application/json"},
		{"latin1 charset", call{key: "k", body: good, contentType: "application/json; charset=latin1"}, 400, "invalid_content_type",
			"the body must be UTF-8 JSON"},
		{"no key header", call{body: good}, 400, "invalid_idempotency_key", "the Idempotency-Key header is required"},
		{"two keys", call{body: good, header: http.Header{"Idempotency-Key": {"k1", "k2"}}}, 400, "invalid_idempotency_key",
			"send exactly one Idempotency-Key header"},
		{"key not ASCII", call{key: "clé-1", body: good}, 400, "invalid_idempotency_key", "Idempotency-Key must be printable ASCII"},
		{"key of 129 characters", call{key: strings.Repeat("k", 129), body: good}, 400, "invalid_idempotency_key",
			"Idempotency-Key must be at most 128 characters"},
		{"body too large", call{key: "k", body: `{"external_order_id":"o","x":"` + strings.Repeat("x", 20000) + `"}`}, 413, "payload_too_large",
			"the body must be at most 16384 bytes"},
		{"body unreadable", call{key: "k", bodyReader: iotest.ErrReader(iotest.ErrTimeout)}, 400, "invalid_body", "the body could not be read"},
		// The connection closed mid-body (net/http cancels the request's
		// context then): the caller left, 499, not a bad request.
		{"body abandoned by the caller", call{key: "k", bodyReader: iotest.ErrReader(io.ErrUnexpectedEOF), ctx: callerGone}, 499,
			"client_closed_request", "the caller closed the request before sending its body whole; nothing was applied"},
		{"empty body", call{key: "k", body: ""}, 400, "invalid_body", "the body is empty: send a JSON object"},
		{"trailing object", call{key: "k", body: good + `{}`}, 400, "invalid_body", "unexpected data after the JSON object"},
		{"duplicate property", call{key: "k", body: `{"external_order_id":"o","external_order_id":"p"}`}, 400, "invalid_body",
			`property "external_order_id" appears twice`},
		{"unknown property", call{key: "k", body: `{"external_order_id":"o","platform_id":"market-b"}`}, 400, "invalid_body",
			`unknown property "platform_id"`},
		{"missing order id", call{key: "k", body: `{"quantity":1}`}, 400, "invalid_body", "external_order_id is required"},
		{"order id number", call{key: "k", body: `{"external_order_id":12}`}, 400, "invalid_body", "external_order_id must be a string"},
		{"order id empty", call{key: "k", body: `{"external_order_id":""}`}, 400, "invalid_body", "external_order_id must be 1 to 128 characters long"},
		{"order id with NUL", call{key: "k", body: `{"external_order_id":"a\u0000b"}`}, 400, "invalid_body", "external_order_id must not contain NUL characters"},
		{"quantity 2", call{key: "k", body: `{"external_order_id":"o","quantity":2}`}, 400, "invalid_body", "quantity must be the integer 1"},
		{"not JSON", call{key: "k", body: `{"external_order_id":}`}, 400, "invalid_body", "the body is not valid JSON"},
		{"array", call{key: "k", body: `[]`}, 400, "invalid_body", "the body must be a JSON object"},
		{"not UTF-8", call{key: "k", body: "{\"external_order_id\":\"o\xff\"}"}, 400, "invalid_body", "the body is not valid UTF-8"},
		{"lone surrogate", call{key: "k", body: `{"external_order_id":"\ud800"}`}, 400, "invalid_body",
			`a string in the body holds a lone surrogate escape (\ud800 to \udfff not in a pair)`},
		{"UTF-8 byte order mark", call{key: "k", body: "\xef\xbb\xbf" + good}, 400, "invalid_body",
			"the body starts with a byte order mark" + useUTF8},
		{"UTF-16 byte order mark", call{key: "k", body: "\xff\xfe{\x00}\x00"}, 400, "invalid_body",
			"the body is UTF-16 (it starts with a byte order mark)" + useUTF8},
		{"UTF-32 byte order mark", call{key: "k", body: "\xff\xfe\x00\x00{\x00\x00\x00"}, 400, "invalid_body",
			"the body is UTF-32 (it starts with a byte order mark)" + useUTF8},
		{"UTF-16 without a byte order mark", call{key: "k", body: "{\x00}\x00"}, 400, "invalid_body",
			"the body is UTF-16 or UTF-32 (NUL bytes around its first character)" + useUTF8},
		{"unusable item id", call{item: strings.Repeat("i", 129), key: "k", body: good}, 404, "not_found", "export item not found"},
	}
	for _, op := range []string{"confirm", "cancel"} {
		for _, tt := range tests {
			t.Run(op+"/"+tt.name, func(t *testing.T) {
				c := tt.c
				c.op = op
				if c.item == "" {
					c.item = "coin-1"
				}
				if c.id.RequestID == "" {
					c.id = w
				}
				rec, _ := f.do(t, c)
				if rec.Code != tt.wantStatus {
					t.Errorf("POST %s (%s) status = %d, want %d", op, tt.name, rec.Code, tt.wantStatus)
				}
				wantBody := `{"error":{"code":"` + tt.wantCode + `","message":` + jsonString(t, tt.wantMsg) +
					`},"meta":{"request_id":"` + c.id.RequestID + `"}}`
				if got := rec.Body.String(); got != wantBody {
					t.Errorf("POST %s (%s) body = %s, want %s", op, tt.name, got, wantBody)
				}
				wantHeader := http.Header{
					"Cache-Control": {"no-store"},
					"Content-Type":  {"application/json; charset=utf-8"},
					"X-Error-Code":  {tt.wantCode},
					"X-Request-Id":  {c.id.RequestID},
				}
				if diff := cmp.Diff(wantHeader, rec.Header()); diff != "" {
					t.Errorf("POST %s (%s) headers (-want +got):\n%s", op, tt.name, diff)
				}
			})
		}
	}
}

// jsonString is s as a JSON string.
func jsonString(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writerFunc is a Writer made of a function, for what PostgreSQL cannot be
// made to do on cue.
type writerFunc func(ctx context.Context, req sales.Request) (sales.Result, error)

func (f writerFunc) Execute(ctx context.Context, req sales.Request) (sales.Result, error) {
	return f(ctx, req)
}

// The call's own deadline ran out first (its error says so) and the
// caller hung up in the same instant: the timeout decides the answer, a
// 503 with the advice to retry under the key, not the 500 of a bug that
// an error matching neither the timeout nor a hang-up fell to.
func TestATimeoutRacingAHangUpIsStillATimeout(t *testing.T) {
	t.Parallel()
	signer, err := identity.NewSigner(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Output
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	ctx, hangUp := context.WithCancel(context.Background())
	mux := http.NewServeMux()
	srv := httpserver.New(httpserver.Config{Service: "sales-writer", Log: log, Signer: signer}, mux)
	Routes(mux, writerFunc(func(context.Context, sales.Request) (sales.Result, error) {
		hangUp()
		return sales.Result{}, fmt.Errorf("sales: %w", context.DeadlineExceeded)
	}), log, srv.Registry(), time.Second)
	id := identity.Identity{OwnerID: "00000000-0000-4000-8000-000000000001", PlatformID: "market-a", KeyID: "key-a",
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-race"}

	rec, env := serve(t, srv.Handler(), signer, call{id: id, op: "confirm", item: "coin-1", key: "k-1",
		body: `{"external_order_id":"order-1"}`, ctx: ctx})
	if rec.Code != http.StatusServiceUnavailable || env.Error == nil || env.Error.Code != "unavailable" ||
		!strings.Contains(env.Error.Message, "same Idempotency-Key") {
		t.Errorf("a timeout racing a hang-up = %d %s, want 503 unavailable advising the same Idempotency-Key", rec.Code, rec.Body)
	}
	if strings.Contains(logs.String(), "sale call failed") {
		t.Errorf("logged as a failure of unknown cause:\n%s", logs.String())
	}
}

// TestFailuresOnTheWire pins what the mapper answers for each kind of
// failure the sale logic returns (status, code, whole message, and the
// sale_applied its access line records), so that its shape can change
// without its answers changing. The database tests check that each kind
// comes from the fault it names.
func TestFailuresOnTheWire(t *testing.T) {
	t.Parallel()
	signer, err := identity.NewSigner(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	id := identity.Identity{OwnerID: "00000000-0000-4000-8000-000000000001", PlatformID: "market-a", KeyID: "key-a",
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-failure"}
	waited := &postgres.AcquireError{Err: context.Canceled}
	const retry = ": retry with backoff and the same Idempotency-Key"
	tests := []struct {
		name        string
		err         error
		cause       error // the request context's cancellation cause; nil leaves it live
		wantStatus  int
		wantCode    string
		wantMsg     string
		wantApplied string // "" when the line records none
	}{
		{"deadline waiting for a connection", fmt.Errorf("sales: %w", &postgres.AcquireError{Err: context.DeadlineExceeded}), nil, 503, "unavailable",
			"the sale store did not answer in time; nothing was applied" + retry, "no"},
		{"deadline mid-statement", fmt.Errorf("sales: %w", context.DeadlineExceeded), nil, 503, "unavailable",
			"the sale store did not answer in time; the sale may have been applied" + retry, "maybe"},
		{"an operator's cancel", fmt.Errorf("sales: %w", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014"}), nil, 503, "unavailable",
			"the sale store cannot take this call now; nothing was applied" + retry, "no"},
		{"cut off waiting for a connection", fmt.Errorf("sales: %w", waited), httpserver.ErrCutOff, 503, "unavailable",
			"the sale writer is shutting down; nothing was applied" + retry, "no"},
		{"cut off mid-statement", fmt.Errorf("sales: %w", context.Canceled), httpserver.ErrCutOff, 503, "unavailable",
			"the sale writer is shutting down; the sale may have been applied" + retry, "maybe"},
		{"abandoned waiting for a connection", fmt.Errorf("sales: %w", waited), context.Canceled, 499, "client_closed_request",
			"the caller closed the request; nothing was applied", "no"},
		{"abandoned mid-statement", fmt.Errorf("sales: %w", context.Canceled), context.Canceled, 499, "client_closed_request",
			"the caller closed the request; the sale may have been applied", "maybe"},
		{"connection lost", fmt.Errorf("sales: %w", io.ErrUnexpectedEOF), nil, 503, "unavailable",
			"the sale store is unreachable; the sale may have been applied" + retry, "maybe"},
		{"a deadlock", fmt.Errorf("sales: %w", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40P01"}), nil, 503, "unavailable",
			"the sale store cannot take this call now; nothing was applied" + retry, "no"},
		{"read-only, in a server's own language", fmt.Errorf("sales: %w", &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "25006"}), nil, 503, "unavailable",
			"the sale store cannot take this call now; nothing was applied" + retry, "no"},
		{"a session ended by the server", fmt.Errorf("sales: %w", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P05"}), nil, 503, "unavailable",
			"the sale store cannot take this call now; retry with backoff and the same Idempotency-Key", ""},
		{"a commit group's commit unconfirmed", fmt.Errorf("sales: %w", sales.ErrCommitUnconfirmed), nil, 503, "unavailable",
			"the sale store could not confirm the commit; the sale may have been applied" + retry, "maybe"},
		{"unforeseen", errors.New("sales: stored response: unexpected end of JSON input"), nil, 500, "internal_error", InternalErrorMessage, "maybe"},
	}
	for _, tt := range tests {
		var logs testenv.Output
		log := slog.New(slog.NewJSONHandler(&logs, nil))
		mux := http.NewServeMux()
		srv := httpserver.New(httpserver.Config{Service: "sales-writer", Log: log, Signer: signer}, mux)
		ctx, cancel := context.WithCancelCause(context.Background())
		Routes(mux, writerFunc(func(context.Context, sales.Request) (sales.Result, error) {
			if tt.cause != nil {
				cancel(tt.cause)
			}
			return sales.Result{}, tt.err
		}), log, srv.Registry(), time.Minute)
		rec, env := serve(t, srv.Handler(), signer, call{id: id, op: "confirm", item: "coin-1", key: "k-1",
			body: `{"external_order_id":"order-1"}`, ctx: ctx})
		cancel(nil)
		if rec.Code != tt.wantStatus || env.Error == nil || env.Error.Code != tt.wantCode || env.Error.Message != tt.wantMsg {
			t.Errorf("%s = %d %s, want %d %s %q", tt.name, rec.Code, rec.Body, tt.wantStatus, tt.wantCode, tt.wantMsg)
		}
		// The drill reads the claim from the answer alone: it must read
		// the one the line records.
		if env.Error != nil && rec.Code >= 500 && salescheck.SaysNothingApplied(rec.Code, env.Error.Code, env.Error.Message) != (tt.wantApplied == "no") {
			t.Errorf("%s: salescheck.SaysNothingApplied(%d, %q, %q) = %v, want %v", tt.name, rec.Code, env.Error.Code, env.Error.Message,
				!(tt.wantApplied == "no"), tt.wantApplied == "no")
		}
		note := `"sale_applied":"` + tt.wantApplied + `"`
		if got := strings.Contains(logs.String(), `"sale_applied"`); got != (tt.wantApplied != "") || tt.wantApplied != "" && !strings.Contains(logs.String(), note) {
			t.Errorf("%s: the access line does not record %s (recorded: %v):\n%s", tt.name, note, got, logs.String())
		}
	}
}
