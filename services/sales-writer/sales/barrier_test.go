package sales

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
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
		// Waited for: on a loaded machine the goroutine's statement may not
		// have reached PostgreSQL after any fixed delay, and a stamp taken
		// after the release then passed whatever the statement stamps.
		if err := waitBlockedOnAdvisoryLock(ctx, db, done); err != nil {
			_ = tx.Rollback(ctx) // or the test's pool waits for its connection at cleanup, for ever
			t.Fatalf("%s: %v", op, err)
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

// waitBlockedOnAdvisoryLock waits (up to 10 s) until a session of this
// test's database waits for an advisory lock, the owner's writer lock the
// barrier holds, and says so if the operation (done) completes first.
func waitBlockedOnAdvisoryLock(ctx context.Context, db *pgxpool.Pool, done <-chan error) error {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			return fmt.Errorf("completed (err %v) while the owner's sync barrier held the lock", err)
		default:
		}
		var waiting bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database())`).Scan(&waiting); err != nil {
			return err
		}
		if waiting {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("did not wait for the owner's writer lock within 10 s")
		}
	}
}
