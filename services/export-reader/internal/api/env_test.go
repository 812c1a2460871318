package api_test

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

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/export-reader/internal/api"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/coinexport/export/services/export-reader/internal/export"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

func TestMain(m *testing.M) {
	// The binary reads the gateway's traceparent (pkg/telemetry), whose
	// trace id, the request id, names each line of the request.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	os.Exit(testenv.Run(m))
}

const (
	identitySecret = "identity-secret-0123456789abcdef0123"
	cursorSecret   = "cursor-secret-0123456789abcdef012345"
)

// env is the reader behind a loopback HTTP server, on a fresh database.
type env struct {
	pool   *pgxpool.Pool
	srv    *httptest.Server
	signer *identity.Signer
	logs   *testenv.Output // the service's log lines
}

func newEnv(t testing.TB) *env {
	t.Helper()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, testenv.Postgres(t), signer)
}

// serve starts the service's handler over pool on a loopback server.
func serve(t testing.TB, pool *pgxpool.Pool, signer *identity.Signer) *env {
	t.Helper()
	return serveWith(t, pool, signer, testReadAhead)
}

// serveWith is serve with the read-ahead ahead.
func serveWith(t testing.TB, pool *pgxpool.Pool, signer *identity.Signer, ahead export.ReadAhead) *env {
	t.Helper()
	return serveTimed(t, pool, signer, ahead, 10*time.Second)
}

// serveTimed is serveWith bounding each request's reads by queryTimeout
// (EXPORT_READER_QUERY_TIMEOUT).
func serveTimed(t testing.TB, pool *pgxpool.Pool, signer *identity.Signer, ahead export.ReadAhead, queryTimeout time.Duration) *env {
	t.Helper()
	cursors, err := cursor.New(cursorSecret)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Output{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	mux := http.NewServeMux()
	api.New(export.NewReader(pool, cursors, ahead), log, queryTimeout, "DATABASE_URL").Register(mux)
	srv := httptest.NewServer(httpserver.New(httpserver.Config{Service: "export-reader", Log: log, Signer: signer}, mux).Handler())
	t.Cleanup(srv.Close)
	return &env{pool: pool, srv: srv, signer: signer, logs: logs}
}

func (e *env) owner(t testing.TB) string {
	t.Helper()
	var id string
	if err := e.pool.QueryRow(context.Background(), `INSERT INTO owners (name) VALUES ('test') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatalf("insert owner: %v", err)
	}
	return id
}

// sign sets the identity the gateway would send for a read key of owner,
// with a request id of each call's own: with one per owner, a test had no
// way to find a call's own access line.
func (e *env) sign(owner string, scopes ...string) func(*http.Request) {
	if scopes == nil {
		scopes = []string{identity.ScopeExportRead}
	}
	return func(r *http.Request) {
		e.signAs(identity.Identity{OwnerID: owner, KeyID: "k1", Scopes: scopes, RequestID: httpserver.RandomRequestID()})(r)
	}
}

// signAs sets id as the gateway sends it: signed, and its request id as
// the trace id of its traceparent.
func (e *env) signAs(id identity.Identity) func(*http.Request) {
	return func(r *http.Request) {
		r.Header.Set("traceparent", "00-"+id.RequestID+"-00f067aa0ba902b7-01")
		for _, h := range e.signer.Sign(id, identity.RequestOf(r), time.Now()) {
			r.Header.Set(h.Name, h.Value)
		}
	}
}

type response struct {
	status int
	header http.Header
	body   []byte
	env    envelope.Parsed
}

// get requests path (starting /v1/...) as owner with a read key.
func (e *env) get(t testing.TB, owner, path string) response {
	t.Helper()
	return e.do(t, path, e.sign(owner))
}

func (e *env) do(t testing.TB, path string, prepare func(*http.Request)) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(req)
	}
	req.Header.Set("Accept-Encoding", "identity") // the transport would gunzip silently
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read: %v", path, err)
	}
	r := response{status: resp.StatusCode, header: resp.Header, body: body}
	if err := json.Unmarshal(body, &r.env); err != nil {
		t.Fatalf("GET %s = %d %s: not an envelope: %v", path, resp.StatusCode, body, err)
	}
	if r.env.Meta.RequestID == "" || resp.Header.Get("X-Request-Id") != r.env.Meta.RequestID {
		t.Fatalf("GET %s: request id %q, header %q, want both set and equal", path, r.env.Meta.RequestID, resp.Header.Get("X-Request-Id"))
	}
	return r
}

// items decodes data as a list of items.
func (r response) items(t testing.TB) []map[string]any {
	t.Helper()
	var items []map[string]any
	if err := json.Unmarshal(r.env.Data, &items); err != nil {
		t.Fatalf("data %s: %v", r.env.Data, err)
	}
	return items
}

// importLines imports items for owner from JSON Lines.
func (e *env) importLines(t testing.TB, owner string, lines ...string) {
	t.Helper()
	items, err := catalog.ParseJSONL(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatalf("ParseJSONL: %v", err)
	}
	if _, err := catalog.Import(context.Background(), e.pool, owner, items); err != nil {
		t.Fatalf("Import: %v", err)
	}
}

// itemLine is a minimal import line.
func itemLine(id, status, title string) string {
	return fmt.Sprintf(`{"id":%q,"status":%q,"currency":"EUR","texts":{"ENG":{"title":%q}}}`, id, status, title)
}

// testReadAhead is the production read-ahead with a TTL no test run
// outlives, so every list test also exercises pages read ahead.
var testReadAhead = export.ReadAhead{Pages: 64, TTL: time.Minute, Reads: 2, Timeout: 10 * time.Second}
