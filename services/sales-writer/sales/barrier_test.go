package sales

import (
	"context"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
)

// A confirm and a cancel each take their owner's shared sync lock before
// they stamp the item: while a sync's barrier holds the lock they wait,
// and they complete once it is released, stamping the item after that. Without the lock a sync starting
// between the stamp and the commit would miss the sale for good
// (catalog's barrier.go).
func TestSalesTakeTheWriterLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "item-1")
	ownerID, err := catalog.ParseOwnerID(owner)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(db, time.Hour)
	for _, op := range []Operation{Confirm, Cancel} {
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := catalog.SyncBarrier(ctx, tx, ownerID); err != nil { // held until the rollback
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := w.Execute(ctx, Request{Operation: op, OwnerID: owner, PlatformID: "p",
				IdempotencyKey: "k-" + string(op), ItemID: "item-1", ExternalOrderID: "order-1"})
			done <- err
		}()
		select {
		case err := <-done:
			t.Errorf("%s completed (err %v) while the owner's sync barrier held the lock", op, err)
		case <-time.After(300 * time.Millisecond):
		}
		// The database's clock as the barrier is released: the sale's stamp
		// must come after it, not from before its wait (a statement's now()),
		// or a sync whose first page the barrier served would skip it
		// (issue 4: stamp updated_at as late as possible).
		var released time.Time
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&released); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s after the barrier: %v", op, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still waiting 10 s after the barrier was released", op)
		}
		var stamped time.Time
		if err := db.QueryRow(ctx, `SELECT updated_at FROM export_items WHERE owner_id = $1 AND id = 'item-1'`, owner).Scan(&stamped); err != nil {
			t.Fatal(err)
		}
		if !stamped.After(released) {
			t.Errorf("%s stamped the item %v, not after the barrier's release at %v", op, stamped, released)
		}
	}
	var sold bool
	if err := db.QueryRow(ctx, `SELECT sold FROM export_items WHERE owner_id = $1 AND id = 'item-1'`, owner).Scan(&sold); err != nil || sold {
		t.Errorf("after confirm and cancel the item reads sold = %v (%v), want false", sold, err)
	}
}
