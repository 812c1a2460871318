package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
)

// A list page in flight at SIGTERM, waiting on export_items' table lock (a
// migration's) past the services' usual 10 s drain but within its
// EXPORT_READER_QUERY_TIMEOUT, is answered once the lock goes: 200 with its
// items. Drained for 10 s, the reader cut it off there: its connection was
// closed or it was answered 503 "the reader is shutting down", although
// its own bound would have let it be answered.
func TestAPageInFlightAtTheStopIsAnsweredWithinItsOwnTimeout(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	setup := testenv.Pool(t, dsn)
	ctx := context.Background()
	var owner string
	if err := setup.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, `INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		VALUES ($1, 'coin-1', true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"coin-1"', '"id":"coin-1"', '"id":"coin-1"', now())`, owner); err != nil {
		t.Fatal(err)
	}

	addr := testenv.FreeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var out testenv.Output
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, env(map[string]string{"DATABASE_URL": dsn, "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
			"EXPORT_READER_ADDR": addr, "EXPORT_READER_ADMIN_ADDR": testenv.FreeAddr(t),
			"EXPORT_READER_QUERY_TIMEOUT": "13s"}), &out)
	}()
	waitReady(t, "http://"+addr+"/healthz", &out)

	lock, err := setup.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, "LOCK TABLE export_items IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	answered := testenv.AnswerLater(func() (*http.Response, error) { return signedGet(addr, "/v1/export/items", owner) })
	testenv.WaitForALockWait(t, setup, serviceName)
	stop() // SIGTERM, while the page waits for the table
	out.WaitFor(t, `"msg":"draining"`)
	time.Sleep(httpserver.DefaultShutdownTimeout + time.Second)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	a := <-answered
	if a.Err != nil {
		t.Fatalf("the page in flight at the stop got no answer: %v\n%s", a.Err, out.String())
	}
	if a.Status != http.StatusOK || !strings.Contains(string(a.Body.Data), `"id":"coin-1"`) {
		t.Errorf("the page in flight at the stop = %d %s %+v, want 200 with coin-1", a.Status, a.Body.Data, a.Body.Error)
	}
	if err := <-done; err != nil {
		t.Errorf("run() = %v, want nil after a clean stop", err)
	}
	if strings.Contains(out.String(), "export read cut off") {
		t.Errorf("the drain cut the page off:\n%s", out.String())
	}
}

// signedGet sends a GET of path to the reader at addr with the identity
// of a key of owner that may read the export.
func signedGet(addr, path, owner string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	signer, err := identity.NewSigner(secret)
	if err != nil {
		return nil, err
	}
	id := identity.Identity{OwnerID: owner, KeyID: "k", Scopes: []string{identity.ScopeExportRead}, RequestID: "req-stop"}
	for _, h := range signer.Sign(id, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	return http.DefaultClient.Do(req)
}

// waitReady waits until the reader's health check answers 200.
func waitReady(t *testing.T, url string, out *testenv.Output) {
	t.Helper()
	for range 400 {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the reader never became ready:\n%s", out.String())
}
