package catalog_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
)

// Restamp under the owner's sales stamps every item anew: a sale that
// changes an item between a chunk's snapshot and its row lock neither
// makes the chunk skip that item nor ends the restamp early (a chunk that
// stamps fewer than RestampChunk items is the last), so no marketplace
// keeps an item that a restore took back.
func TestRestampStampsEveryItemUnderSales(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	const items = 2*catalog.RestampChunk + 500
	if n, err := catalog.Seed(ctx, pool, owner, items, 11); err != nil || n != items {
		t.Fatalf("Seed = %d, %v", n, err)
	}
	rows, _ := pool.Query(ctx, "SELECT id FROM export_items WHERE owner_id = $1", owner)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// A sale or a cancel, as the sales-writer's statements write one.
	sale := fmt.Sprintf(`WITH barrier AS (SELECT %s)
		UPDATE export_items SET sold = NOT sold, updated_at = %s
		WHERE owner_id = $1 AND id = $2 AND EXISTS (SELECT FROM barrier)`,
		catalog.WriterLock("$1::uuid"), catalog.NextUpdatedAt("export_items"))
	var start time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	selling, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var sales [4]int
	for w := range sales {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for selling.Err() == nil {
				if _, err := pool.Exec(selling, sale, owner, ids[rand.IntN(len(ids))]); err == nil {
					sales[w]++
				}
			}
		}()
	}
	stamped, err := catalog.Restamp(ctx, pool, ownerUUID(t, owner))
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	var stale int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM export_items WHERE owner_id = $1 AND updated_at < $2", owner, start).Scan(&stale); err != nil {
		t.Fatal(err)
	}
	if stamped != items || stale != 0 {
		t.Errorf("Restamp under %v sales stamped %d of %d items; %d keep a stamp from before it", sales, stamped, items, stale)
	}
}
