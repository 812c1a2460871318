package edge_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// keys are the API keys of one seeded database.
type keys struct {
	read, write, readB, noPlatform, revoked string
	unknown                                 string // well formed, never stored
	readID, writeID, revokedID, ownerA      string
	ownerB                                  string
}

// seed creates two owners, a platform and keys of every kind in a fresh
// database, and returns its URL, a pool on it and the keys.
func seed(t *testing.T) (string, *pgxpool.Pool, keys) {
	t.Helper()
	dsn := testenv.PostgresURL(t)
	pool := testenv.Pool(t, dsn)
	ctx := context.Background()
	var k keys
	mustExec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := pool.QueryRow(ctx, `INSERT INTO owners (name) VALUES ('a') RETURNING id`).Scan(&k.ownerA); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO owners (name) VALUES ('b') RETURNING id`).Scan(&k.ownerB); err != nil {
		t.Fatal(err)
	}
	mustExec(`INSERT INTO platforms (id, name) VALUES ('shop-1', 'Shop')`)
	// The schema forbids a sales:write key without a platform; drop the
	// check in this test's own database to show the gateway refuses one too.
	mustExec(`ALTER TABLE api_keys DROP CONSTRAINT sales_write_needs_platform`)
	insert := func(owner string, platform *string, scopes []string, revoked bool) (secret, id string) {
		t.Helper()
		secret, prefix, err := apikey.Generate(scopes)
		if err != nil {
			t.Fatal(err)
		}
		h := apikey.HashOf(secret)
		var revokedAt *time.Time
		if revoked {
			now := time.Now()
			revokedAt = &now
		}
		err = pool.QueryRow(ctx, `INSERT INTO api_keys (owner_id, platform_id, prefix, hash, scopes, revoked_at)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`, owner, platform, prefix, h[:], scopes, revokedAt).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return secret, id
	}
	shop := "shop-1"
	k.read, k.readID = insert(k.ownerA, nil, []string{identity.ScopeExportRead}, false)
	k.readB, _ = insert(k.ownerB, nil, []string{identity.ScopeExportRead}, false)
	k.write, k.writeID = insert(k.ownerA, &shop, []string{identity.ScopeSalesWrite}, false)
	k.noPlatform, _ = insert(k.ownerA, nil, []string{identity.ScopeSalesWrite}, false)
	k.revoked, k.revokedID = insert(k.ownerA, nil, []string{identity.ScopeExportRead}, true)
	var err error
	if k.unknown, _, err = apikey.Generate([]string{identity.ScopeExportRead}); err != nil {
		t.Fatal(err)
	}
	return dsn, pool, k
}

// insertKey stores one more key of owner (bound to platform, if given) and
// returns its secret.
func insertKey(t *testing.T, pool *pgxpool.Pool, owner string, platform *string, scopes ...string) string {
	t.Helper()
	secret, prefix, err := apikey.Generate(scopes)
	if err != nil {
		t.Fatal(err)
	}
	h := apikey.HashOf(secret)
	if _, err := pool.Exec(context.Background(), `INSERT INTO api_keys (owner_id, platform_id, prefix, hash, scopes)
		VALUES ($1, $2, $3, $4, $5)`, owner, platform, prefix, h[:], scopes); err != nil {
		t.Fatal(err)
	}
	return secret
}

// seen is what a fake upstream echoes back: the verified identity and the
// headers and path it received.
type seen struct {
	Identity identity.Identity   `json:"identity"`
	Headers  map[string][]string `json:"headers"`
	Path     string              `json:"path"`
	Instance string              `json:"instance"`
}

// echoUpstream is a fake service: it verifies the gateway's signature (401
// otherwise, as the real services do) and echoes what it saw.
func echoUpstream(t *testing.T, name string, hits *atomic.Int64) *httptest.Server {
	t.Helper()
	return signedUpstream(t, func(w http.ResponseWriter, r *http.Request, id identity.Identity) {
		if hits != nil {
			hits.Add(1)
		}
		if r.URL.Query().Get("gzip") == "1" {
			w.Header().Set("Content-Encoding", "gzip")
		}
		envelope.WriteData(w, http.StatusOK, seen{Identity: id, Headers: r.Header, Path: r.URL.RequestURI(), Instance: name},
			envelope.Meta{RequestID: id.RequestID})
	})
}

// signedUpstream is a fake service that answers the gateway's health
// probe and, as the real services do, refuses 401 a call under /v1/ the
// gateway did not sign; serve answers the others, given the identity
// signed.
func signedUpstream(t *testing.T, serve func(w http.ResponseWriter, r *http.Request, id identity.Identity)) *httptest.Server {
	t.Helper()
	signer, err := identity.NewSigner(gatewaytest.IdentitySecret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteData(w, http.StatusOK, map[string]string{"status": "ok"}, envelope.Meta{})
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		id, err := signer.Verify(r.Header.Get, identity.RequestOf(r), time.Now())
		if err != nil {
			envelope.WriteError(w, http.StatusUnauthorized, "unauthenticated",
				"the request did not come through the gateway", httpserver.RandomRequestID())
			return
		}
		serve(w, r, id)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// probed wraps h so that the returned channel is closed once the gateway's
// prober has asked for /healthz: a test that then takes the server away
// knows the first probe found it up, and only a request can notice.
func probed(h http.Handler) (http.Handler, <-chan struct{}) {
	seen := make(chan struct{})
	var once sync.Once
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			once.Do(func() { close(seen) })
		}
		h.ServeHTTP(w, r)
	}), seen
}

// closed reports whether ch is closed, for waitFor.
func closed(ch <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

// brokenUpstream answers /healthz but drops every API request after
// reading it, so the request may have been acted on.
func brokenUpstream(t *testing.T, hits *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		hits.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// slowUpstream answers /healthz but takes delay over API requests.
func slowUpstream(t *testing.T, delay time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// closedURL is an http URL nothing listens on, nor can until the test ends.
func closedURL(t *testing.T) string { return "http://" + testenv.RefusingAddr(t) }

// response is a decoded gateway answer.
type response struct {
	Status int
	Header http.Header
	Body   []byte
	Env    envelope.Parsed
}

// client writes a request's head in one write (WriteBufferSize): the
// gateway answers an oversized head (431) and closes once it has read its
// buffer's worth, and a head written in 4 KiB pieces, as by default, could
// still be writing then and get a reset instead of the answer (seen once
// in a loaded run). Real clients (curl, browsers) send a head in one write.
var client = &http.Client{Timeout: 10 * time.Second,
	Transport: &http.Transport{DisableCompression: true, WriteBufferSize: 64 << 10}}

func do(t *testing.T, method, url string, headers map[string]string, body io.Reader) response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	if sized, ok := body.(interface{ Size() int64 }); ok && req.ContentLength == 0 {
		req.ContentLength = sized.Size()
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := response{Status: resp.StatusCode, Header: resp.Header, Body: b}
	if resp.Header.Get("Content-Encoding") == "" {
		if err := json.Unmarshal(b, &r.Env); err != nil {
			t.Fatalf("%s %s: body is not an envelope: %q", method, url, b)
		}
	}
	return r
}

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkEnvelope asserts the request id rules of spec 2.1 on r.
func checkEnvelope(t *testing.T, r response) {
	t.Helper()
	id := r.Header.Get("X-Request-Id")
	if !hex32.MatchString(id) {
		t.Errorf("X-Request-Id = %q, want 32 lowercase hex", id)
	}
	if r.Env.Meta.RequestID != id {
		t.Errorf("meta.request_id = %q, want X-Request-Id %q", r.Env.Meta.RequestID, id)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if r.Env.Error != nil && r.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("error %d: Cache-Control = %q, want no-store", r.Status, r.Header.Get("Cache-Control"))
	}
	if r.Status == http.StatusUnauthorized && !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "APIKey ") {
		t.Errorf("401: WWW-Authenticate = %q, want an APIKey challenge", r.Header.Get("WWW-Authenticate"))
	}
}

func decodeSeen(t *testing.T, r response) seen {
	t.Helper()
	var s seen
	if err := json.Unmarshal(r.Env.Data, &s); err != nil {
		t.Fatalf("data = %s: %v", r.Env.Data, err)
	}
	return s
}

// stalledBody declares a length but yields no byte until it is closed (the
// transport closes it once the answer has come).
type stalledBody struct {
	size   int64
	closed chan struct{}
	once   sync.Once
}

func newStalledBody(size int64) *stalledBody {
	return &stalledBody{size: size, closed: make(chan struct{})}
}

func (b *stalledBody) Size() int64 { return b.size }

func (b *stalledBody) Read([]byte) (int, error) {
	<-b.closed
	return 0, io.EOF
}

func (b *stalledBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// dial opens a TCP connection to the server at baseURL (http://host:port),
// closed at the end of the test, for a request written by hand.
func dial(t *testing.T, baseURL string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(baseURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
