package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// TestRunServesAndStops starts the binary's run on loopback, sells an item
// through a real HTTP connection, and stops it.
func TestRunServesAndStops(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	setup := testenv.Pool(t, dsn)
	var owner string
	err := setup.QueryRow(context.Background(), "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&owner)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"INSERT INTO platforms (id) VALUES ('market-a')",
		`INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		 VALUES ('` + owner + `', 'coin-1', true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"coin-1"', '"id":"coin-1"', '"id":"coin-1"', now())`,
		`INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		 VALUES ('` + owner + `', 'coin-2', true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"coin-2"', '"id":"coin-2"', '"id":"coin-2"', now())`,
	} {
		if _, err := setup.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}

	addr, admin := testenv.FreeAddr(t), testenv.FreeAddr(t)
	// Mid-rotation (README, "Rotating IDENTITY_SECRET"): the requests below
	// are signed with the previous secret, as a gateway not yet replaced
	// signs them.
	newSecret := secret + "-rotated"
	vars := map[string]string{
		"DATABASE_URL": dsn + " password=not-a-real-password", "IDENTITY_SECRET": newSecret,
		"IDENTITY_SECRET_PREVIOUS": secret, "SALES_WRITER_ADDR": addr, "SALES_WRITER_ADMIN_ADDR": admin,
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.Output
	done := make(chan error, 1)
	go func() { done <- run(ctx, env(stopAtOnce(vars)), &out, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run() = %v, want nil after a clean stop", err)
		}
		if strings.Contains(out.String(), "not-a-real-password") || strings.Contains(out.String(), secret) ||
			strings.Contains(out.String(), newSecret) {
			t.Errorf("logs contain a secret:\n%s", out.String())
		}
	}()
	waitReady(t, "http://"+addr+"/healthz", &out)

	signer, _ := identity.NewSigner(secret)
	tests := []struct {
		name, owner string
		wantStatus  int
		wantCode    string
	}{
		{"sale", owner, 200, ""},
		{"owner unknown to the database", "00000000-0000-0000-0000-000000000001", 404, "not_found"},
	}
	for _, tt := range tests {
		id := identity.Identity{OwnerID: tt.owner, PlatformID: "market-a", KeyID: "k",
			Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-1"}
		status, body := post(t, signer, "http://"+addr+"/v1/export/items/coin-1/sales/confirm", id)
		code := ""
		if body.Error != nil {
			code = body.Error.Code
		}
		if status != tt.wantStatus || code != tt.wantCode || body.Meta.RequestID != "req-1" {
			t.Errorf("%s: confirm = %d %q %+v, want %d %q with request id req-1", tt.name, status, code, body.Meta, tt.wantStatus, tt.wantCode)
		}
	}

	// Only what the gateway signed reaches the sale (issue 3: the services
	// answer 401 to anything unsigned): a call carrying no identity, or an
	// identity signed with a secret the writer does not hold (as a client
	// reaching the writer's port could forge one), is refused before the
	// sale is looked at (a forged identity let through met k-1's record: 409)
	// and coin-2, for sale, stays unsold.
	stranger, err := identity.NewSigner(strings.Repeat("s", 32))
	if err != nil {
		t.Fatal(err)
	}
	for name, signer := range map[string]*identity.Signer{"unsigned": nil, "signed with another secret": stranger} {
		id := identity.Identity{OwnerID: owner, PlatformID: "market-a", KeyID: "k",
			Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-2"}
		status, body := post(t, signer, "http://"+addr+"/v1/export/items/coin-2/sales/confirm", id)
		if status != 401 || body.Error == nil || body.Error.Code != "unauthenticated" {
			t.Errorf("%s: confirm = %d %+v, want 401 unauthenticated", name, status, body.Error)
		}
	}
	var sold bool
	if err := setup.QueryRow(context.Background(), "SELECT sold FROM export_items WHERE id = 'coin-2'").Scan(&sold); err != nil || sold {
		t.Errorf("coin-2 sold = %v (%v) after calls the gateway did not sign, want false", sold, err)
	}

	// The access lines name the order and the key of each sale call, so
	// that a request id quoted by a platform leads to its order.
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), `"item_id":"coin-1","idempotency_key":"k-1","external_order_id":"o-1"`) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("access lines lack the order and the key of both calls:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`sales_writer_outcomes_total{operation="confirm",outcome="executed"} 1`,
		`sales_writer_outcomes_total{operation="confirm",outcome="not_found"} 1`,
		`pgxpool_max_conns{pool="postgres"} 8`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	testenv.WantSessionNamed(t, dsn, "sales-writer")
}

func waitReady(t *testing.T, url string, out *testenv.Output) {
	t.Helper()
	var err error
	for range 100 {
		var resp *http.Response
		if resp, err = http.Get(url); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("service did not start: %v\n%s", err, out.String())
}

func post(t *testing.T, signer *identity.Signer, url string, id identity.Identity) (int, envelope.Parsed) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"external_order_id":"o-1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-1")
	if signer != nil { // nil: sent unsigned
		for _, h := range signer.Sign(id, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// A writer built for a newer schema than the database's stays unready, and
// says what to run, until the migration is there.
func TestUnreadyWhileTheSchemaIsBehind(t *testing.T) {
	testenv.WantUnreadyUntilMigrated(t, func(dsn, addr string, logs *testenv.Output) func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, env(stopAtOnce(map[string]string{"DATABASE_URL": dsn, "IDENTITY_SECRET": secret,
				"SALES_WRITER_ADDR": addr, "SALES_WRITER_ADMIN_ADDR": testenv.FreeAddr(t)})), logs, nil)
		}()
		return func() { cancel(); <-done }
	})
}

// A writer sent to a read-only database (the old primary turned standby
// after a failover, or a primary fenced with default_transaction_read_only)
// is unready, so that the gateway and Kubernetes send it no sale, and a
// sale that reaches it anyway is 503 unavailable, not 500; once the
// database takes writes again (here its sessions start anew, as a
// promotion's restart makes them) it is ready.
func TestUnreadyOnAReadOnlyDatabase(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	admin := testenv.Pool(t, dsn)
	setReadOnly := func(on bool) {
		t.Helper()
		sql := "ALTER DATABASE " + admin.Config().ConnConfig.Database + " RESET default_transaction_read_only"
		if on {
			sql = "ALTER DATABASE " + admin.Config().ConnConfig.Database + " SET default_transaction_read_only = on"
		}
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(true)

	addr, out := startRun(t, ctx, dsn, secret)

	if status := healthStatus(t, "http://"+addr+"/healthz"); status != http.StatusServiceUnavailable {
		t.Errorf("/healthz on a read-only database = %d, want 503", status)
	}
	if !strings.Contains(out.String(), "read-only") {
		t.Errorf("the log does not say the database is read-only:\n%s", out.String())
	}
	signer, _ := identity.NewSigner(secret)
	id := identity.Identity{OwnerID: "00000000-0000-0000-0000-000000000001", PlatformID: "market-a", KeyID: "k",
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-1"}
	if status, body := post(t, signer, "http://"+addr+"/v1/export/items/coin-1/sales/confirm", id); status != http.StatusServiceUnavailable ||
		body.Error == nil || body.Error.Code != "unavailable" {
		t.Errorf("confirm on a read-only database = %d %+v, want 503 unavailable", status, body.Error)
	}

	setReadOnly(false)
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	if status := healthStatus(t, "http://"+addr+"/healthz"); status != http.StatusOK {
		t.Errorf("/healthz once the database takes writes = %d, want 200", status)
	}
}

// startRun runs the binary on dsn with the identity secret, until the
// test ends, and returns its address once it listens, with its log.
func startRun(t *testing.T, ctx context.Context, dsn, secret string) (string, *testenv.Output) {
	addr := testenv.FreeAddr(t)
	runCtx, cancel := context.WithCancel(ctx)
	out := &testenv.Output{}
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, env(stopAtOnce(map[string]string{"DATABASE_URL": dsn, "IDENTITY_SECRET": secret,
			"SALES_WRITER_ADDR": addr, "SALES_WRITER_ADMIN_ADDR": testenv.FreeAddr(t)})), out, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitReady(t, "http://"+addr+"/healthz", out)
	return addr, out
}

// stopAtOnce sets SALES_WRITER_SHUTDOWN_DELAY to 0s in vars: the test's
// kept-alive connection (waitReady's) made its stop wait out the delay,
// 3 s, in each of four tests that are not about it (stop_test.go is).
func stopAtOnce(vars map[string]string) map[string]string {
	vars["SALES_WRITER_SHUTDOWN_DELAY"] = "0s"
	return vars
}

// healthStatus is the status of one GET of url.
func healthStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The writer's sessions run at READ COMMITTED whatever the database's
// default says (an operator's ALTER DATABASE or ALTER ROLE … SET
// default_transaction_isolation): its key lock decides requests under one
// key one after the other only if the sale's statement takes its snapshot
// once the lock is held (sales/queries.go, keyLock). At REPEATABLE READ the
// snapshot was the lock statement's, taken before the wait: a confirm that
// waited for a transaction binding its key to another request did not see
// the binding, and sold (200), both requests then holding the key.
func TestSalesRunAtReadCommittedWhateverTheDatabaseDefault(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	setup := testenv.Pool(t, dsn)
	var owner string
	if err := setup.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"INSERT INTO platforms (id) VALUES ('market-a')",
		`INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		 VALUES ('` + owner + `', 'coin-1', true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"coin-1"', '"id":"coin-1"', '"id":"coin-1"', now())`,
		"ALTER DATABASE " + setup.Config().ConnConfig.Database + " SET default_transaction_isolation = 'repeatable read'",
	} {
		if _, err := setup.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	addr, _ := startRun(t, ctx, dsn, secret)

	// Another request binds the key "k-1" (post's) under the key's lock
	// (sales.keyLock), and holds the lock while the confirm waits for it.
	tx, err := setup.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1801812339, hashtext($1::text || '/' || $2::text || '/' || $3::text))`,
		owner, "market-a", "k-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_refusals (owner_id, platform_id, idempotency_key, fingerprint, refusal, expires_at)
		VALUES ($1, 'market-a', 'k-1', '\x00', 'not_found', now() + interval '1 hour')`, owner); err != nil {
		t.Fatal(err)
	}
	signer, _ := identity.NewSigner(secret)
	id := identity.Identity{OwnerID: owner, PlatformID: "market-a", KeyID: "k",
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-1"}
	type answer struct {
		status int
		body   envelope.Parsed
	}
	answered := make(chan answer, 1)
	go func() {
		status, body := post(t, signer, "http://"+addr+"/v1/export/items/coin-1/sales/confirm", id)
		answered <- answer{status, body}
	}()
	for waiting := 0; waiting == 0; {
		if err := setup.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'sales-writer' AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case a := <-answered: // it did not wait for the key's lock: it would be waited for until go test's timeout
			t.Fatalf("the confirm was answered %d %+v without waiting for its key's lock", a.status, a.body.Error)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-answered
	if a.status != http.StatusConflict || a.body.Error == nil || a.body.Error.Code != "idempotency_conflict" {
		t.Errorf("a confirm under a key bound meanwhile to another request = %d %+v %s, want 409 idempotency_conflict",
			a.status, a.body.Error, a.body.Data)
	}
	var sold bool
	if err := setup.QueryRow(ctx, "SELECT sold FROM export_items WHERE id = 'coin-1'").Scan(&sold); err != nil || sold {
		t.Errorf("coin-1 sold = %v (%v), want false: its key belonged to another request", sold, err)
	}
}

// A stop that comes while PostgreSQL is still awaited (the database not
// up yet when the pod starts) is a clean stop: run returns nil, so the
// process exits 0, and the log says why nothing was served.
func TestAStopWhilePostgreSQLIsAwaitedIsClean(t *testing.T) {
	testenv.WantCleanStopWhilePostgreSQLIsAwaited(t, func(ctx context.Context, dsn string, logs *testenv.Output) error {
		return run(ctx, env(map[string]string{"DATABASE_URL": dsn, "IDENTITY_SECRET": secret,
			"SALES_WRITER_ADDR": testenv.FreeAddr(t), "SALES_WRITER_ADMIN_ADDR": testenv.FreeAddr(t)}), logs, nil)
	})
}

// A sale call in flight when the writer is stopped ends by its own bound,
// not by the drain: here one waits on its item's row, locked by another
// session, through a SALES_WRITER_QUERY_TIMEOUT just over the services'
// usual 10 s drain. PostgreSQL's statement_timeout rolls it back, and it is
// answered so (503, "nothing was applied"). Drained for 10 s, the writer
// cancelled it first: its connection was closed, or it was answered that
// the sale may have been applied.
func TestASaleInFlightAtTheStopEndsByItsOwnTimeout(t *testing.T) {
	dsn, setup, owner := ownerWithItems(t, "coin-1")
	ctx := context.Background()
	lock, err := setup.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, "SELECT FROM export_items WHERE owner_id = $1 AND id = 'coin-1' FOR UPDATE", owner); err != nil {
		t.Fatal(err)
	}

	addr, admin := testenv.FreeAddr(t), testenv.FreeAddr(t)
	vars := map[string]string{
		"DATABASE_URL": dsn, "IDENTITY_SECRET": secret, "SALES_WRITER_ADDR": addr, "SALES_WRITER_ADMIN_ADDR": admin,
		"SALES_WRITER_QUERY_TIMEOUT": "11s",
		// No delay before the drain: the sale's bound runs from before
		// SIGTERM, and 3 s of delay let a drain of the usual 10 s outlast
		// it too, so the test passed with the drain not fitted to the call.
		"SALES_WRITER_SHUTDOWN_DELAY": "0s",
	}
	stop, done, out := startWriter(t, ctx, vars)

	answered := testenv.AnswerLater(func() (*http.Response, error) {
		signer, _ := identity.NewSigner(secret)
		id := identity.Identity{OwnerID: owner, PlatformID: "market-a", KeyID: "k",
			Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-stop"}
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/export/items/coin-1/sales/confirm",
			strings.NewReader(`{"external_order_id":"o-1"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-stop")
		for _, h := range signer.Sign(id, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
		return http.DefaultClient.Do(req)
	})
	testenv.WaitForALockWait(t, setup, serviceName)
	stop() // SIGTERM, while the call waits for the row

	a := <-answered
	if a.Err != nil {
		t.Fatalf("the sale in flight at the stop got no answer: %v\n%s", a.Err, out.String())
	}
	if a.Status != http.StatusServiceUnavailable || a.Body.Error == nil || a.Body.Error.Code != "unavailable" ||
		!strings.Contains(a.Body.Error.Message, "nothing was applied") {
		t.Errorf("the sale in flight at the stop = %d %+v, want 503 unavailable saying nothing was applied (its statement_timeout)", a.Status, a.Body.Error)
	}
	if err := <-done; err != nil {
		t.Errorf("run() = %v, want nil after a clean stop", err)
	}
	if strings.Contains(out.String(), "sale call cut off") {
		t.Errorf("the drain cut the call off:\n%s", out.String())
	}
}

// startWriter runs the writer on vars (its SALES_WRITER_ADDR included)
// until the test ends or calls stop, as SIGTERM does, and returns once it
// is ready; done gives run's result, out its logs.
func startWriter(t *testing.T, ctx context.Context, vars map[string]string) (stop func(), done <-chan error, out *testenv.Output) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	out = &testenv.Output{}
	result := make(chan error, 1)
	go func() { result <- run(runCtx, env(vars), out, nil) }()
	waitReady(t, "http://"+vars["SALES_WRITER_ADDR"]+"/healthz", out)
	return stop, result, out
}
