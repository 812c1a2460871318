package api_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/services/export-reader/syncclient"
	"github.com/jackc/pgx/v5/pgxpool"
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
	wg.Go(func() { writes = write(t, e.pool, owner, items, stop) })
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

	want := dbItems(t, e.pool, owner)
	if len(mirror) != len(want) {
		t.Errorf("mirror holds %d items, database %d", len(mirror), len(want))
	}
	for id, doc := range want {
		if got := string(mirror[id].Raw); got != doc {
			t.Errorf("mirror[%s] = %s\nwant %s", id, got, doc)
		}
	}
}

// write changes random items until stop: sales confirmed and canceled as
// sales-writer does (sale row first, updated_at stamped last), and
// re-imports with new titles and statuses. It returns the number of writes.
func write(t *testing.T, pool *pgxpool.Pool, owner string, items int, stop <-chan struct{}) int {
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(1, 2))
	n := 0
	for {
		select {
		case <-stop:
			return n
		default:
		}
		id := fmt.Sprintf("item-%03d", rnd.IntN(items))
		var err error
		switch rnd.IntN(3) {
		case 0:
			err = confirm(ctx, pool, owner, id, fmt.Sprintf("order-%d", n))
		case 1:
			err = cancel(ctx, pool, owner, id)
		default:
			status := []string{"active", "inactive"}[rnd.IntN(2)]
			parsed, perr := catalog.ParseJSONL(strings.NewReader(itemLine(id, status, fmt.Sprintf("%s v%d", id, n))))
			if perr != nil {
				t.Error(perr)
				return n
			}
			_, err = catalog.Import(ctx, pool, owner, parsed)
		}
		if err != nil {
			t.Errorf("write %d: %v", n, err)
			return n
		}
		n++
	}
}

// confirm sells id the way sales-writer does: the sale row and the item's
// state change in one statement, committed as it ends, updated_at stamped
// last.
func confirm(ctx context.Context, pool *pgxpool.Pool, owner, id, order string) error {
	_, err := pool.Exec(ctx, `WITH sale AS (
		INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
		SELECT $1, $2, 'market', $3, clock_timestamp() WHERE NOT EXISTS
			(SELECT 1 FROM sales WHERE owner_id = $1 AND item_id = $2 AND canceled_at IS NULL)
		RETURNING item_id)
		UPDATE export_items SET sold = true, updated_at = clock_timestamp()
		WHERE owner_id = $1 AND id IN (SELECT item_id FROM sale)`, owner, id, order)
	return err
}

// cancel restores id the same way.
func cancel(ctx context.Context, pool *pgxpool.Pool, owner, id string) error {
	_, err := pool.Exec(ctx, `WITH sale AS (
		UPDATE sales SET canceled_at = clock_timestamp()
		WHERE owner_id = $1 AND item_id = $2 AND canceled_at IS NULL RETURNING item_id)
		UPDATE export_items SET sold = false, updated_at = clock_timestamp()
		WHERE owner_id = $1 AND id IN (SELECT item_id FROM sale)`, owner, id)
	return err
}

// dbItems composes every item of owner from the database, in ENG.
func dbItems(t *testing.T, pool *pgxpool.Pool, owner string) map[string]string {
	t.Helper()
	return dbItemsIn(t, pool, owner, "ENG")
}
