package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A stopping writer closes the gateway's kept-alive connections while its
// listener still serves (SALES_WRITER_SHUTDOWN_DELAY): a keyed sale the
// gateway had just sent on one, which the writer never read, is sent again
// on a new connection (upstream.Do's repeat) and served, and a sale already
// applied is replayed. Closed by the drain, the connection's repeat found
// the listener closed too, and the gateway answered 502 "the sale may have
// been applied" for a sale never read (20 of about 35,000 calls over 10
// restarts of a lone writer). Meanwhile /healthz answers 503, so that the
// gateways stop sending here before the listener closes.
func TestAConnectionClosedAtTheStopLeavesItsRepeatAListener(t *testing.T) {
	dsn, setup, owner := ownerWithItems(t, "coin-1", "coin-2")
	ctx := context.Background()
	addr := testenv.FreeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var out testenv.Output
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, env(map[string]string{"DATABASE_URL": dsn, "IDENTITY_SECRET": secret,
			"SALES_WRITER_ADDR": addr, "SALES_WRITER_ADMIN_ADDR": testenv.FreeAddr(t)}), &out, nil)
	}()
	waitReady(t, "http://"+addr+"/healthz", &out)

	// The gateway's kept-alive connection, idle after a sale.
	kept, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	if status, replay := confirmOn(t, kept, owner, "coin-1", "k-1"); status != http.StatusOK || replay {
		t.Fatalf("the first sale = %d (replay %v), want 200", status, replay)
	}

	stop() // SIGTERM
	// The writer closes the idle connection (the gateway's sale sent on it
	// that moment goes unread), whose end the gateway reads.
	kept.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := kept.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("the kept-alive connection, after the stop: read %d bytes, %v; want it closed", n, err)
	}

	// The gateway's repeats, each on a new connection.
	for _, sale := range []struct {
		item, key  string
		wantReplay bool
	}{
		{"coin-2", "k-2", false}, // never read on the closed connection: applied now
		{"coin-1", "k-1", true},  // applied before: replayed
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("the repeat of %s found the writer's listener closed (the gateway's 502 \"the sale may have been applied\"): %v\n%s", sale.key, err, out.String())
		}
		if status, replay := confirmOn(t, conn, owner, sale.item, sale.key); status != http.StatusOK || replay != sale.wantReplay {
			t.Errorf("the repeat of %s = %d (replay %v), want 200 (replay %v)", sale.key, status, replay, sale.wantReplay)
		}
		conn.Close()
	}
	if status := healthStatus(t, "http://"+addr+"/healthz"); status != http.StatusServiceUnavailable {
		t.Errorf("/healthz while stopping = %d, want 503: the gateways would go on sending here", status)
	}
	if err := <-done; err != nil {
		t.Errorf("run() = %v, want nil after a clean stop", err)
	}
	var sales, open int
	if err := setup.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE canceled_at IS NULL) FROM sales WHERE owner_id = $1", owner).Scan(&sales, &open); err != nil {
		t.Fatal(err)
	}
	if sales != 2 || open != 2 {
		t.Errorf("the database holds %d sales (%d open), want 2 (one per item, each applied once)", sales, open)
	}
}

// ownerWithItems is a database with an owner, platform market-a and the
// owner's items, for sale: its DSN, a pool on it and the owner's id.
func ownerWithItems(t *testing.T, items ...string) (dsn string, setup *pgxpool.Pool, owner string) {
	t.Helper()
	dsn = testenv.PostgresURL(t)
	setup = testenv.Pool(t, dsn)
	ctx := context.Background()
	if err := setup.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, "INSERT INTO platforms (id) VALUES ('market-a') ON CONFLICT DO NOTHING"); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, `INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		SELECT $1, i, true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"' || i || '"', '"id":"' || i || '"', '"id":"' || i || '"', now()
		FROM unnest($2::text[]) AS i`, owner, items); err != nil {
		t.Fatal(err)
	}
	return dsn, setup, owner
}

// confirmOn sends a signed confirm of owner's item with Idempotency-Key key on
// conn, as the gateway does, and reads its answer: the status and whether
// it was a replay. The connection is kept alive unless the writer closes it.
func confirmOn(t *testing.T, conn net.Conn, owner, item, key string) (status int, replay bool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+conn.RemoteAddr().String()+"/v1/export/items/"+item+"/sales/confirm",
		strings.NewReader(`{"external_order_id":"o-`+item+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	signer, _ := identity.NewSigner(secret)
	id := identity.Identity{OwnerID: owner, PlatformID: "market-a", KeyID: "k",
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-" + key}
	for _, h := range signer.Sign(id, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	resp := testenv.SendOn(t, conn, req)
	defer resp.Body.Close()
	var body struct {
		Data struct {
			IdempotentReplay bool `json:"idempotent_replay"`
		}
	}
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Data.IdempotentReplay
}
