package api_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
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
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT `+catalog.WriterLock("$1::uuid"), owner); err != nil {
		t.Fatal(err)
	}
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
