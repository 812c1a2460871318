package api_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/jackc/pgx/v5"
)

// The contract's sync recipe (spec 4.8: record the start time, read every
// page, pass that time as updated_after next run) loses nothing when a
// change is stamped before a run starts and committed after: the run's
// first page waits for that commit and carries the change. Without the
// wait the page would not see the change, and the next run, asking for
// changes after this run's start, would skip it for good. A page with a
// cursor does not wait.
func TestASyncStartingDuringAWriteSeesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"), itemLine("b", "active", "B"))
	var previousRun time.Time
	if err := e.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&previousRun); err != nil {
		t.Fatal(err)
	}
	firstOfAll := e.get(t, owner, "/v1/export/items?limit=1")
	cursor := firstOfAll.env.Meta.NextCursor

	// A writer, as every writer of export_items does (catalog.WriterLock):
	// the lock, the stamp, and the commit later.
	tx := writerInFlight(t, e, owner)
	if _, err := tx.Exec(ctx, `UPDATE export_items SET listed_active = false, updated_at = clock_timestamp()
	    WHERE owner_id = $1 AND id = 'a'`, owner); err != nil {
		t.Fatal(err)
	}

	// Not a sync's start: answered at once.
	if cursor == nil {
		t.Fatal("the first page of one item has no next cursor")
	}
	next := make(chan response, 1)
	go func() { next <- e.get(t, owner, "/v1/export/items?limit=1&cursor="+url.QueryEscape(*cursor)) }()
	select {
	case r := <-next:
		if r.status != 200 {
			t.Errorf("page with a cursor = %d %s", r.status, r.body)
		}
	case <-time.After(5 * time.Second):
		t.Error("a page with a cursor waited for a writer")
	}

	// The next run starts now, after the stamp.
	page := make(chan response, 1)
	go func() {
		page <- e.get(t, owner, "/v1/export/items?updated_after="+url.QueryEscape(previousRun.Format(time.RFC3339Nano)))
	}()
	select {
	case r := <-page:
		t.Fatalf("a sync's first page was answered (%d) while a write stamped before it was uncommitted", r.status)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var r response
	select {
	case r = <-page:
	case <-time.After(10 * time.Second):
		t.Fatal("the first page still waits 10 s after the write committed")
	}
	items := r.items(t)
	if r.status != 200 || len(items) != 1 || items[0]["id"] != "a" || items[0]["status"] != "inactive" {
		t.Errorf("first page of the next run = %d %s, want item a, inactive", r.status, r.body)
	}
}

// A writer stuck in flight (one waiting for a row another transaction
// holds locked) does not hold up the owner's syncs and other writers for
// as long as it is stuck: the first page answers 503 unavailable after
// catalog.SyncBarrierWait, with Retry-After, and asked again once the
// writer is done, it is served.
func TestASyncStartingBehindAStuckWriteIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"))
	stuck := writerInFlight(t, e, owner)

	start := time.Now()
	r := e.get(t, owner, "/v1/export/items")
	if r.status != 503 || r.env.Error == nil || r.env.Error.Code != "unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("first page behind a stuck write = %d %s (Retry-After %q), want 503 unavailable with Retry-After",
			r.status, r.body, r.header.Get("Retry-After"))
	}
	if took := time.Since(start); took < catalog.SyncBarrierWait || took > catalog.SyncBarrierWait+5*time.Second {
		t.Errorf("answered after %v, want about catalog.SyncBarrierWait (%v)", took, catalog.SyncBarrierWait)
	}
	if err := stuck.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := e.get(t, owner, "/v1/export/items"); r.status != 200 || len(r.items(t)) != 1 {
		t.Errorf("first page once the write ended = %d %s, want 200 with the item", r.status, r.body)
	}
}

// A HEAD of a first page starts no sync (it gets no items): it takes no
// barrier, so a writer in flight neither holds it up nor is held up by it.
func TestAHeadOfAFirstPageTakesNoBarrier(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"))
	writerInFlight(t, e, owner)
	req, err := http.NewRequest(http.MethodHead, e.srv.URL+"/v1/export/items", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.sign(owner)(req)
	start := time.Now()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != http.StatusOK || took > time.Second {
		t.Errorf("HEAD of a first page with a writer in flight = %d after %v, want 200 at once", resp.StatusCode, took)
	}
}

// writerInFlight begins a transaction that writes owner's items, as every
// writer does (catalog.WriterLock first), and leaves it open; it is rolled
// back at the test's end unless ended before.
func writerInFlight(t *testing.T, e *env, owner string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT `+catalog.WriterLock("$1::uuid"), owner); err != nil {
		t.Fatal(err)
	}
	return tx
}
