package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/sales-writer/salescheck"
)

// A long concurrent history of confirms, cancels, identical retries,
// different requests under used keys and reads, on four items shared by
// three platforms through two service instances, while calls are cut off
// by their clients' short timeouts (retried at once, racing the first
// attempt) and the instances' database connections are terminated under
// them: the history must be linearizable against the state machine of
// spec 3 and 4.7 (package salescheck), every call of unknown outcome must
// settle to an answer with its key, no item may be left unsellable, and
// the database must hold exactly the changes and records the answers
// told. The bounded form of the drill of the README ("Checked as a
// history under faults").
func TestHistoryUnderFaultsIsLinearizable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	items := []string{"coin-0", "coin-1", "coin-2", "coin-3"}
	for _, id := range items {
		f.addItem(t, f.owner, id, true)
	}
	platforms := []string{"market-a", "market-b", "market-c"}
	f.addPlatform(t, "market-c")
	hs := make([]http.Handler, 2)
	for i := range hs {
		hs[i] = newHandler(t, testenv.Pool(t, f.url+" pool_max_conns=4 application_name=history-writer"), defaultRetention)
	}
	srv := httptest.NewServer(historyGateway(t, f, hs))
	t.Cleanup(srv.Close)
	keys := map[string]string{}
	for _, p := range platforms {
		keys[p] = "key-" + p
	}
	send := salescheck.HTTPSender(srv.Client(), srv.URL+"/v1", keys, "read-key")

	w := salescheck.Workload{Items: items, Platforms: platforms, Clients: 8, Calls: 120, Seed: 1,
		Timeout: 20 * time.Second, ShortTimeout: 20 * time.Millisecond, ShortShare: 0.15}
	h := salescheck.NewHistory()
	var terminated atomic.Int64
	stopFaults := terminateWriterConnections(t, f, &terminated)
	w.Run(context.Background(), send, h)
	stopFaults()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.Settle(ctx, send, h, 10*time.Millisecond); err != nil {
		t.Error(err)
	}

	calls := h.Calls()
	t.Logf("%d calls, %d writer connections terminated: %s", len(calls), terminated.Load(), salescheck.Counts(calls))
	checkHistory(t, f, h)
}

// checkHistory checks h, the history of the calls made to f's owner, with
// salescheck: every answer one the contract allows, the history
// linearizable, the database consistent with every answer, and every
// "nothing was applied" true.
func checkHistory(t *testing.T, f *fixture, h *salescheck.History) {
	t.Helper()
	calls := h.Calls()
	for _, u := range salescheck.Unexpected(calls) {
		t.Errorf("unexpected answer: %s", u)
	}
	ops := h.Operations()
	start := time.Now()
	_, err := salescheck.Linearizable(ops, 60*time.Second)
	t.Logf("the check of %d calls took %v: at most %d calls of one item in flight", len(ops), time.Since(start).Round(time.Millisecond), salescheck.MostInFlight(ops))
	if err != nil {
		t.Error(err)
	}
	if err := salescheck.Database(context.Background(), f.db, f.owner, calls); err != nil {
		t.Error(err)
	}
	claims, err := salescheck.NothingAppliedHolds(context.Background(), f.db, f.owner, h, defaultRetention)
	t.Log(claims)
	if err != nil {
		t.Error(err)
	}
}

// historyGateway stands in for the gateway: a sale goes to one of hs in
// turn, signed for the platform whose key ("key-<platform>") it carries;
// a read of an item is answered from the database, as export-reader
// derives status and stock.
func historyGateway(t *testing.T, f *fixture, hs []http.Handler) http.Handler {
	var next atomic.Uint64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			item := strings.TrimPrefix(r.URL.Path, "/v1/export/items/")
			var status string
			err := f.db.QueryRow(r.Context(), "SELECT status FROM export_items WHERE owner_id = $1 AND id = $2", f.owner, item).Scan(&status)
			if err != nil {
				envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", err.Error(), "read")
				return
			}
			stock := 0
			if status == "active" {
				stock = 1
			}
			envelope.WriteData(w, http.StatusOK, map[string]any{"status": status, "stock_quantity": stock}, envelope.Meta{RequestID: "read"})
			return
		}
		platform := strings.TrimPrefix(r.Header.Get("X-API-Key"), "key-")
		r.Header.Del("X-API-Key")
		for _, h := range f.signer.Sign(f.writer(platform), identity.RequestOf(r), time.Now()) {
			r.Header.Set(h.Name, h.Value)
		}
		hs[next.Add(1)%uint64(len(hs))].ServeHTTP(w, r)
	})
}

// terminateWriterConnections ends one of the service instances' database
// connections every 100 ms, in whatever it is doing, until stop is called:
// a statement, a commit, or an idle wait. It counts each in n.
func terminateWriterConnections(t *testing.T, f *fixture, n *atomic.Int64) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var ended int64
			err := f.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
				SELECT pid FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'history-writer'
				ORDER BY random() LIMIT 1) AS one`).Scan(&ended)
			if err == nil {
				n.Add(ended)
			} else if ctx.Err() == nil {
				t.Errorf("terminating a writer connection: %v", err)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// The check of the answers that say nothing was applied, on a lie planted
// in a history of the real writer: a confirm that sold, recorded as
// answered 503 "nothing was applied". Its key's record was written within
// that attempt, before any other attempt of the request was sent, so the
// database check names it; and a read that saw the item sold before the
// request's next attempt was sent leaves no order that explains the
// history, so the linearizability check does too. The same history with a
// true claim (an attempt that was never sent) passes both.
func TestNothingAppliedIsHeldToTheHistoryAndTheDatabase(t *testing.T) {
	t.Parallel()
	for _, lie := range []bool{true, false} {
		t.Run(map[bool]string{true: "lie", false: "truth"}[lie], func(t *testing.T) {
			f := newFixture(t)
			f.addItem(t, f.owner, "coin-0", true)
			srv := httptest.NewServer(historyGateway(t, f, []http.Handler{f.handler}))
			t.Cleanup(srv.Close)
			send := salescheck.HTTPSender(srv.Client(), srv.URL+"/v1", map[string]string{"market-a": "key-market-a"}, "read-key")
			ctx := context.Background()
			confirm := salescheck.Input{Op: salescheck.Confirm, Platform: "market-a", Key: "k1", Item: "coin-0", Order: "o1"}
			read := salescheck.Input{Op: salescheck.Read, Item: "coin-0"}
			nothingApplied := salescheck.Output{Unknown: true, Status: http.StatusServiceUnavailable, Code: "unavailable", NothingApplied: true}

			h := salescheck.NewHistory()
			attempt := h.Begin(0, confirm)
			if lie {
				if out := send(ctx, confirm); out.Status != http.StatusOK {
					t.Fatalf("confirm = %s, want 200", out)
				}
			}
			attempt.Done(nothingApplied)
			for _, in := range []salescheck.Input{read, confirm} {
				call := h.Begin(0, in)
				call.Done(send(ctx, in))
			}

			_, linErr := salescheck.Linearizable(h.Operations(), 10*time.Second)
			claims, dbErr := salescheck.NothingAppliedHolds(ctx, f.db, f.owner, h, defaultRetention)
			if claims != (salescheck.Claims{Said: 1, Checked: 1}) {
				t.Errorf("NothingAppliedHolds counted %+v, want 1 said, 1 checked", claims)
			}
			if lie && (!errors.Is(linErr, salescheck.ErrNotLinearizable) || dbErr == nil) {
				t.Errorf("a sale applied by an attempt answered 'nothing was applied': Linearizable = %v, NothingAppliedHolds = %v; want both to name it", linErr, dbErr)
			}
			if !lie && (linErr != nil || dbErr != nil) {
				t.Errorf("a true 'nothing was applied': Linearizable = %v, NothingAppliedHolds = %v; want both nil", linErr, dbErr)
			}
		})
	}
}
