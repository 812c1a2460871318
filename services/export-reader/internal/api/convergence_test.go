package api_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog/catalogtest"
	"github.com/coinexport/export/services/export-reader/syncclient"
)

// TestSyncConverges runs a writer (sales confirmed and canceled the way
// sales-writer does it, items re-imported) against a client following spec
// 4.8 (a full sync, then incremental syncs into a mirror). After the writes
// stop and one last incremental sync, the mirror must equal the database.
// The client's overlap (500 ms) is far shorter than the run, so the
// incremental syncs really depend on updated_after; it only has to cover the
// gap between a write's updated_at and its COMMIT, which every writer keeps
// server-side (one statement, committed as it ends). On a loaded two-core
// machine that gap has been seen above 50 ms when a client round trip sat
// inside it; see the README's sync guide.
func TestSyncConverges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	owner := e.owner(t)
	const items = 200
	lines := make([]string, items)
	for i := range lines {
		lines[i] = itemLine(fmt.Sprintf("item-%03d", i), "active", fmt.Sprintf("Item %d v0", i))
	}
	e.importLines(t, owner, lines...)
	if _, err := e.pool.Exec(ctx, `INSERT INTO platforms (id) VALUES ('market')`); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes int
	wg.Go(func() { writes = writeLocked(t, e.pool, owner, items, 1, stop, new(atomic.Int64)) })
	stopWrites := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWrites() // before the pool closes, also when a sync fails

	client := &syncclient.Client{BaseURL: e.srv.URL + "/v1", HTTP: e.srv.Client(), Prepare: e.sign(owner),
		Limit: 10, Overlap: 500 * time.Millisecond}
	mirror := syncclient.Mirror{}
	checkpoint, syncs, incrementalItems := time.Time{}, 0, 0
	deadline := time.After(3 * time.Second)
loop:
	for {
		select {
		case <-deadline:
			break loop
		default:
		}
		next, n, err := client.Sync(ctx, checkpoint, mirror.Upsert)
		if err != nil {
			t.Fatalf("sync %d: %v", syncs, err)
		}
		if !checkpoint.IsZero() {
			incrementalItems += n
		}
		checkpoint = next
		syncs++
	}
	stopWrites()
	if _, _, err := client.Sync(ctx, checkpoint, mirror.Upsert); err != nil {
		t.Fatalf("final sync: %v", err)
	}
	t.Logf("%d writes, %d syncs, %d items read by incremental syncs", writes, syncs, incrementalItems)
	if writes < 20 || syncs < 3 {
		t.Fatalf("only %d writes and %d syncs ran; the test proves nothing", writes, syncs)
	}
	if incrementalItems >= (syncs-1)*items {
		t.Errorf("incremental syncs read %d items, as many as full syncs would; updated_after is not being exercised", incrementalItems)
	}

	want := catalogtest.ComposedItems(t, e.pool, owner, "ENG")
	if len(mirror) != len(want) {
		t.Errorf("mirror holds %d items, database %d", len(mirror), len(want))
	}
	for id, doc := range want {
		if got := string(mirror[id].Raw); got != doc {
			t.Errorf("mirror[%s] = %s\nwant %s", id, got, doc)
		}
	}
}
