package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const testSecret = "sales-writer-test-secret-0123456789abcdef"

const defaultRetention = 24 * time.Hour

// fixture is one fresh database and the service's real handler on it.
type fixture struct {
	url     string // of the database, for more service instances
	db      *pgxpool.Pool
	handler http.Handler
	signer  *identity.Signer
	owner   string // an owner with a sales:write key for platform "market-a"
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureOn(t, testenv.PostgresURL(t))
}

// newFixtureOn is newFixture on the migrated database of url.
func newFixtureOn(t testing.TB, url string) *fixture {
	t.Helper()
	db := testenv.Pool(t, url)
	f := &fixture{url: url, db: db, handler: newHandler(t, db, defaultRetention)}
	f.signer, _ = identity.NewSigner(testSecret)
	f.owner = f.addOwner(t, "owner")
	for _, p := range []string{"market-a", "market-b"} {
		f.addPlatform(t, p)
	}
	return f
}

// newHandler builds the service as run does, without the listeners.
func newHandler(t testing.TB, db *pgxpool.Pool, retention time.Duration) http.Handler {
	t.Helper()
	return newLoggedHandler(t, db, retention, io.Discard)
}

// newLoggedHandler is newHandler logging to logs, at info.
func newLoggedHandler(t testing.TB, db *pgxpool.Pool, retention time.Duration, logs io.Writer) http.Handler {
	t.Helper()
	return newTimedHandler(t, db, retention, logs, 10*time.Second)
}

// newTimedHandler is newLoggedHandler giving each call queryTimeout.
func newTimedHandler(t testing.TB, db *pgxpool.Pool, retention time.Duration, logs io.Writer, queryTimeout time.Duration) http.Handler {
	t.Helper()
	return newServer(t, db, retention, logs, queryTimeout).Handler()
}

// newServer is the server whose handler newTimedHandler returns, for a
// test that reads its metrics too.
func newServer(t testing.TB, db *pgxpool.Pool, retention time.Duration, logs io.Writer, queryTimeout time.Duration) *httpserver.Server {
	t.Helper()
	return newServerOf(t, sales.NewWriter(db, retention), logs, queryTimeout)
}

// newServerOf is newServer around writer, built as run builds it.
func newServerOf(t testing.TB, writer Writer, logs io.Writer, queryTimeout time.Duration) *httpserver.Server {
	t.Helper()
	signer, err := identity.NewSigner(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	mux := http.NewServeMux()
	srv := httpserver.New(httpserver.Config{Service: "sales-writer", Log: log, Signer: signer, PanicMessage: InternalErrorMessage, PanicNotes: PanicNotes}, mux)
	Routes(mux, writer, log, srv.Registry(), queryTimeout)
	return srv
}

func (f *fixture) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := f.db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

func (f *fixture) addOwner(t testing.TB, name string) string {
	t.Helper()
	var id string
	if err := f.db.QueryRow(context.Background(), "INSERT INTO owners (name) VALUES ($1) RETURNING id::text", name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func (f *fixture) addPlatform(t testing.TB, id string) {
	t.Helper()
	f.exec(t, "INSERT INTO platforms (id) VALUES ($1)", id)
}

// addItem stores an item updated an hour ago, listed or not.
func (f *fixture) addItem(t testing.TB, owner, id string, listed bool) {
	t.Helper()
	doc := fmt.Sprintf(`"id":%q,"title":"Coin %s","currency":"EUR"`, id, id)
	f.exec(t, `INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		VALUES ($1, $2, $3, 'EUR', '{"ENG": {"title": "Coin"}}', $4, $4, $4, now() - interval '1 hour')`, owner, id, listed, doc)
}

// writer is the identity of a sales:write key of platform for f.owner.
func (f *fixture) writer(platform string) identity.Identity {
	return identity.Identity{OwnerID: f.owner, PlatformID: platform, KeyID: "key-" + platform,
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-" + platform}
}

// call is one request: op "confirm" or "cancel"; key "" sends no header.
type call struct {
	id          identity.Identity
	op          string
	item        string
	query       string // after "?" in the URL; none when empty
	key         string
	body        string
	bodyReader  io.Reader       // read instead of body when set
	contentType string          // application/json when empty; "-" sends none
	header      http.Header     // extra headers, set last
	ctx         context.Context // the request's; nil for a live one
}

func (f *fixture) do(t testing.TB, c call) (*httptest.ResponseRecorder, envelope.Parsed) {
	t.Helper()
	return serve(t, f.handler, f.signer, c)
}

func serve(t testing.TB, h http.Handler, signer *identity.Signer, c call) (*httptest.ResponseRecorder, envelope.Parsed) {
	t.Helper()
	target := "/v1/export/items/" + c.item + "/sales/" + c.op
	if c.query != "" {
		target += "?" + c.query
	}
	var body io.Reader = strings.NewReader(c.body)
	if c.bodyReader != nil {
		body = c.bodyReader
	}
	req := httptest.NewRequest(http.MethodPost, target, body)
	switch c.contentType {
	case "":
		req.Header.Set("Content-Type", "application/json")
	case "-":
	default:
		req.Header.Set("Content-Type", c.contentType)
	}
	if c.key != "" {
		req.Header.Set("Idempotency-Key", c.key)
	}
	for name, values := range c.header {
		req.Header[name] = values
	}
	// Signed as the gateway signs what it forwards (the first Idempotency-Key).
	for _, h := range signer.Sign(c.id, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	if c.ctx != nil {
		req = req.WithContext(c.ctx)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var env envelope.Parsed
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
		t.Fatalf("response is not an envelope: %v: %s", err, rec.Body.String())
	}
	if env.Meta.RequestID == "" || rec.Header().Get(envelope.RequestIDHeader) != env.Meta.RequestID {
		t.Errorf("meta.request_id = %q, X-Request-Id = %q, want equal and non-empty", env.Meta.RequestID, rec.Header().Get(envelope.RequestIDHeader))
	}
	return rec, env
}

// result decodes a SaleWriteResult.
func result(t testing.TB, env envelope.Parsed) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(env.Data, &m); err != nil {
		t.Fatalf("data is not a SaleWriteResult: %v: %s", err, env.Data)
	}
	return m
}

func errorCode(env envelope.Parsed) string {
	if env.Error == nil {
		return ""
	}
	return env.Error.Code
}

// itemState is what the export routes derive an item's status and stock from.
type itemState struct {
	Status    string
	Sold      bool
	UpdatedAt time.Time
}

func (f *fixture) item(t testing.TB, owner, id string) itemState {
	t.Helper()
	var s itemState
	err := f.db.QueryRow(context.Background(), "SELECT status, sold, updated_at FROM export_items WHERE owner_id = $1 AND id = $2", owner, id).
		Scan(&s.Status, &s.Sold, &s.UpdatedAt)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *fixture) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
