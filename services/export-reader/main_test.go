package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const secret = "0123456789abcdef0123456789abcdef"

// cursorSecret is the tests' CURSOR_SECRET: not secret, which export-reader
// would refuse as both.
const cursorSecret = "cursor-0123456789abcdef0123456789"

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u:pw@db/x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret}))
	if err != nil {
		t.Fatalf("loadConfig(minimal) error = %v", err)
	}
	if cfg.Addr != "127.0.0.1:8081" || cfg.AdminAddr != "127.0.0.1:9081" || cfg.DBMaxConns != 8 || cfg.QueryTimeout != 10*time.Second ||
		cfg.ShutdownDelay != 3*time.Second || cfg.ReadAheadPages != 256 || cfg.ReadAheadTTL != 2*time.Second || cfg.ReadMaxLag != time.Minute {
		t.Errorf("loadConfig(minimal) = %+v, want the documented defaults", cfg)
	}
	cfg, err = loadConfig(env(map[string]string{"DATABASE_URL": "postgres://u:pw@db/x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
		"CURSOR_SECRET_PREVIOUS": " " + secret + "-old1 ,," + secret + "-old2"}))
	if err != nil || len(cfg.CursorPrevious) != 2 || cfg.CursorPrevious[0] != secret+"-old1" {
		t.Errorf("loadConfig(two previous secrets) = %q, %v; want both, trimmed", cfg.CursorPrevious, err)
	}
	logged := cfg.LogValue().String()
	if strings.Contains(logged, "pw") || strings.Contains(logged, secret) {
		t.Errorf("LogValue() = %s, leaks a secret", logged)
	}
	cfg, _ = loadConfig(env(map[string]string{"DATABASE_URL": "postgres://primary/x", "READ_DATABASE_URL": "postgres://replica/x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret}))
	if !strings.Contains(cfg.DatabaseURL, "replica") {
		t.Errorf("loadConfig() database = %s, want READ_DATABASE_URL first", cfg.DatabaseURL)
	}
	if cfg, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://db/x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "READ_MAX_LAG": "0"})); err != nil || cfg.ReadMaxLag != 0 {
		t.Errorf("loadConfig(READ_MAX_LAG=0) = %v, %v; want 0 (off)", cfg.ReadMaxLag, err)
	}
	_, err = loadConfig(env(map[string]string{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "READ_MAX_LAG": "1s"}))
	if err == nil || !strings.Contains(err.Error(), "READ_MAX_LAG must be 0 (off) or at least 2s") {
		t.Errorf("loadConfig(READ_MAX_LAG=1s) error = %v, want it to say the bound", err)
	}
	// Both listeners on one port: named at start, not left to the second
	// bind's "address already in use".
	_, err = loadConfig(env(map[string]string{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
		"EXPORT_READER_ADDR": "0.0.0.0:9081"}))
	if err == nil || !strings.Contains(err.Error(), "EXPORT_READER_ADDR and EXPORT_READER_ADMIN_ADDR must be different listening addresses") {
		t.Errorf("loadConfig(EXPORT_READER_ADDR=0.0.0.0:9081) error = %v, want both settings named", err)
	}
	for _, bad := range []map[string]string{
		{"CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret},
		{"DATABASE_URL": "   ", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "IDENTITY_SECRET_PREVIOUS": "short"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": "short", "IDENTITY_SECRET": secret},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "EXPORT_READER_DB_MAX_CONNS": "0"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "EXPORT_READER_QUERY_TIMEOUT": "soon"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "EXPORT_READER_SHUTDOWN_DELAY": "2m"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "EXPORT_READER_READ_AHEAD_PAGES": "-1"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "EXPORT_READER_READ_AHEAD_TTL": "0s"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "CURSOR_SECRET_PREVIOUS": secret + ",short"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "READ_MAX_LAG": "500ms"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "READ_MAX_LAG": "-1s"},
		{"DATABASE_URL": "x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "READ_MAX_LAG": "60"},
	} {
		if _, err := loadConfig(env(bad)); err == nil {
			t.Errorf("loadConfig(%v) error = nil, want an error", bad)
		}
	}
}

// The runtime applies GOGC and GOMEMLIMIT itself; a value it would misread
// stops the start, as in the gateway and sales-writer.
func TestLoadConfigRefusesGCValuesTheRuntimeMisreads(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{"GOGC": "OFF", "GOMEMLIMIT": "0"} {
		_, err := loadConfig(env(map[string]string{"DATABASE_URL": "postgres://db/x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, name: value}))
		if err == nil || !strings.Contains(err.Error(), name+" must be off") {
			t.Errorf("loadConfig(%s=%s) = %v, want an error naming %s", name, value, err, name)
		}
	}
}

// One secret for cursors and identities is refused, wherever it is listed,
// naming both settings and quoting neither.
func TestLoadConfigRefusesASharedSecret(t *testing.T) {
	t.Parallel()
	for _, shared := range []map[string]string{
		{"CURSOR_SECRET": secret, "IDENTITY_SECRET": secret},
		{"CURSOR_SECRET": cursorSecret, "CURSOR_SECRET_PREVIOUS": secret, "IDENTITY_SECRET": secret},
		{"CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret, "IDENTITY_SECRET_PREVIOUS": cursorSecret},
	} {
		shared["DATABASE_URL"] = "postgres://db/x"
		_, err := loadConfig(env(shared))
		if err == nil || !strings.Contains(err.Error(), "CURSOR_SECRET and IDENTITY_SECRET (and their _PREVIOUS lists) must not share a secret") ||
			strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), cursorSecret) {
			t.Errorf("loadConfig(%v) error = %v, want the shared secret refused, unquoted", shared, err)
		}
	}
}

// A pool too small for read-ahead says so at start, as the start line
// shows the pages asked for: the setting is not silently without effect.
func TestRunSaysReadAheadIsOffForASmallPool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // run reads its settings and logs them, then stops before PostgreSQL
	for conns, wantWarn := range map[string]bool{"3": true, "4": false} {
		var out testenv.Output
		err := run(ctx, env(map[string]string{"DATABASE_URL": "postgres://db/x", "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
			"EXPORT_READER_DB_MAX_CONNS": conns, "EXPORT_READER_ADDR": "127.0.0.1:0", "EXPORT_READER_ADMIN_ADDR": "127.0.0.1:0"}), &out)
		if err != nil {
			t.Fatalf("run(stopped) = %v", err)
		}
		if got := strings.Contains(out.String(), `"msg":"read-ahead off`); got != wantWarn {
			t.Errorf("EXPORT_READER_DB_MAX_CONNS=%s: warned of read-ahead off = %v, want %v; log:\n%s", conns, got, wantWarn, out.String())
		}
	}
}

// TestRun starts the binary's run on loopback and reads through it.
func TestRun(t *testing.T) {
	t.Parallel()
	addr, dsn := testenv.FreeAddr(t), testenv.PostgresURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.Output
	var runErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		// Mid-rotation (README, "Rotating IDENTITY_SECRET"): the request
		// below is signed with the previous secret.
		runErr = run(ctx, env(stopAtOnce(map[string]string{"DATABASE_URL": dsn, "CURSOR_SECRET": cursorSecret,
			"IDENTITY_SECRET": secret + "-rotated", "IDENTITY_SECRET_PREVIOUS": secret,
			"EXPORT_READER_ADDR": addr, "EXPORT_READER_ADMIN_ADDR": testenv.FreeAddr(t)})), &out)
	})
	signer, _ := identity.NewSigner(secret)
	var resp *http.Response
	for range 400 { // until the listener is up
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/export/items", nil)
		for _, h := range signer.Sign(identity.Identity{OwnerID: "7b1f7a8e-5f5b-4c3e-9a55-2b8f1b0c9d10", Scopes: []string{identity.ScopeExportRead}, RequestID: "r1"}, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
		var err error
		if resp, err = http.DefaultClient.Do(req); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if resp == nil {
		cancel()
		wg.Wait()
		t.Fatalf("run never served: %v", runErr)
	}
	var got envelope.Parsed
	_ = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	testenv.WantSessionNamed(t, dsn, "export-reader")
	cancel()
	wg.Wait()
	if resp.StatusCode != 200 || string(got.Data) != "[]" || got.Meta.RequestID != "r1" {
		t.Errorf("GET /v1/export/items = %d %+v, want 200 with an empty list and request id r1", resp.StatusCode, got)
	}
	if runErr != nil {
		t.Errorf("run() = %v after cancel, want nil", runErr)
	}
}

// stopAtOnce sets EXPORT_READER_SHUTDOWN_DELAY to 0s in vars: the test's
// kept-alive connection (waitReady's) made its stop wait out the delay,
// 3 s, in each of three tests that are not about it (drain_test.go's
// TestAConnectionClosedAtTheStopLeavesItsRepeatAListener is).
func stopAtOnce(vars map[string]string) map[string]string {
	vars["EXPORT_READER_SHUTDOWN_DELAY"] = "0s"
	return vars
}

// A reader built for a newer schema than the database's stays unready, and
// says what to run, until the migration is there.
func TestUnreadyWhileTheSchemaIsBehind(t *testing.T) {
	t.Parallel()
	testenv.WantUnreadyUntilMigrated(t, func(dsn, addr string, logs *testenv.Output) func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, env(stopAtOnce(map[string]string{"DATABASE_URL": dsn, "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
				"EXPORT_READER_ADDR": addr, "EXPORT_READER_ADMIN_ADDR": testenv.FreeAddr(t)})), logs)
		}()
		return func() { cancel(); <-done }
	})
}

// The log's causes name the setting the reader's pool came from: with
// READ_DATABASE_URL set (a replica), a database renamed under it said
// "DATABASE_URL's database does not exist ... point DATABASE_URL at it",
// the primary's setting, which is not the one to fix.
func TestCausesNameReadDatabaseURL(t *testing.T) {
	t.Parallel()
	addr, dsn := testenv.FreeAddr(t), testenv.PostgresURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.Output
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = run(ctx, env(stopAtOnce(map[string]string{"DATABASE_URL": "postgres://primary.invalid/x", "READ_DATABASE_URL": dsn,
			"CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
			"EXPORT_READER_ADDR": addr, "EXPORT_READER_ADMIN_ADDR": testenv.FreeAddr(t)})), &out)
	})
	defer wg.Wait()
	defer cancel()
	signer, _ := identity.NewSigner(secret)
	get := func(path string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		for _, h := range signer.Sign(identity.Identity{OwnerID: "7b1f7a8e-5f5b-4c3e-9a55-2b8f1b0c9d10", Scopes: []string{identity.ScopeExportRead}, RequestID: "r1"}, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for try := 0; get("/v1/export/items") != http.StatusOK; try++ { // until the listener is up
		if try == 400 {
			t.Fatalf("run never served:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	testenv.RenameDatabase(t, dsn)
	// Twice: the first may meet a connection the rename ended (a broken
	// pipe), the second opens one, which PostgreSQL refuses (3D000).
	for range 2 {
		if status := get("/v1/export/items"); status != http.StatusServiceUnavailable {
			t.Errorf("GET /v1/export/items with the database renamed = %d, want 503", status)
		}
	}
	get("/healthz") // its WARN not ready names the cause too
	logs := out.String()
	if !strings.Contains(logs, `"cause":"READ_DATABASE_URL's database does not exist`) {
		t.Errorf("the log's cause does not name READ_DATABASE_URL:\n%s", logs)
	}
	if strings.Contains(strings.ReplaceAll(logs, "READ_DATABASE_URL", ""), "DATABASE_URL") {
		t.Errorf("the log names DATABASE_URL, which the reader does not read with READ_DATABASE_URL set:\n%s", logs)
	}
}

// A stop that comes while PostgreSQL is still awaited (the database not
// up yet when the pod starts) is a clean stop: run returns nil, so the
// process exits 0, and the log says why nothing was served.
func TestAStopWhilePostgreSQLIsAwaitedIsClean(t *testing.T) {
	t.Parallel()
	testenv.WantCleanStopWhilePostgreSQLIsAwaited(t, func(ctx context.Context, dsn string, logs *testenv.Output) error {
		return run(ctx, env(map[string]string{"DATABASE_URL": dsn, "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
			"EXPORT_READER_ADDR": testenv.FreeAddr(t), "EXPORT_READER_ADMIN_ADDR": testenv.FreeAddr(t)}), logs)
	})
}
