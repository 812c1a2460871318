package sales

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The second half of a race on one Idempotency-Key: a request was refused
// (its item sold) by a statement whose snapshot predates another request
// with the same key, which executed and committed meanwhile. Binding the
// refusal then finds that record: the answer is the conflict (spec 4.7
// rule 3), and the key stays bound to the executed request alone.
func TestRefusalLosesTheKeyToARequestThatExecuted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := ownerWithPlatformP(t, db)
	w := NewWriter(db, time.Hour)
	executed := Request{Operation: Confirm, OwnerID: owner, PlatformID: "p", IdempotencyKey: "k", ItemID: "y", ExternalOrderID: "o", Quantity: 1}
	refused := executed
	refused.ItemID = "x"
	if _, err := db.Exec(ctx, `INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
		VALUES ($1, 'p', 'k', $2, '{}', now() + interval '1 hour')`, owner, Fingerprint(executed)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.bindRefused(ctx, refused, Fingerprint(refused), ErrAlreadySold, "item_already_sold", w.warned.call(ctx, refused)); !errors.Is(err, ErrIdempotencyConflict) {
		t.Errorf("binding the refusal after another request executed with the key = %v, want ErrIdempotencyConflict", err)
	}
	var refusals int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM idempotency_refusals").Scan(&refusals); err != nil || refusals != 0 {
		t.Errorf("%d refusals bound (%v), want none: the key is the executed request's", refusals, err)
	}
	// A copy of the executed request refused meanwhile (the item was sold
	// when its statement ran, then sellable again for the copy that
	// executed) gets the executed result, not "refused": one answer per call.
	res, err := w.bindRefused(ctx, executed, Fingerprint(executed), ErrAlreadySold, "item_already_sold", w.warned.call(ctx, executed))
	if err != nil || !res.IdempotentReplay {
		t.Errorf("binding a refusal of the executed request itself = %+v, %v; want the record's replay", res, err)
	}
	if err := db.QueryRow(ctx, "SELECT count(*) FROM idempotency_refusals").Scan(&refusals); err != nil || refusals != 0 {
		t.Errorf("%d refusals bound (%v), want none: the key holds the executed request's result", refusals, err)
	}
}

// The whole race on one Idempotency-Key (spec 4.7 rule 3): request A
// executes and is held before its commit (its item's row is locked by
// another transaction); request B, another request under the same key, is
// refused meanwhile (its item is sold, or it has no sale to cancel). B
// waits for A's key and answers the conflict, binding nothing; before, it
// was answered its refusal and bound the key while A went on to commit,
// both requests then holding the key (a probe: 22 of 30 races).
func TestARefusalRacingAnExecutionUnderItsKeyIsAConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "a")
	if _, err := db.Exec(ctx, `INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
	    VALUES ($1, 'sold', true, 'EUR', '{"ENG":{}}', '{}', '{}', '{}', now())`, owner); err != nil {
		t.Fatal(err)
	}
	w := NewWriter(db, time.Hour)
	if _, err := w.Execute(ctx, Request{Operation: Confirm, OwnerID: owner, PlatformID: "p", IdempotencyKey: "first",
		ItemID: "sold", ExternalOrderID: "o-sold", Quantity: 1}); err != nil {
		t.Fatal(err)
	}
	refusedUnderK := map[string]Request{
		"confirm of a sold item": {Operation: Confirm, ItemID: "sold", ExternalOrderID: "o-2"},
		"cancel of no sale":      {Operation: Cancel, ItemID: "a", ExternalOrderID: "o-none"},
	}
	for name, refused := range refusedUnderK {
		key := "k-" + name
		refused.OwnerID, refused.PlatformID, refused.IdempotencyKey, refused.Quantity = owner, "p", key, 1
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) // after a failure: the pool closes only once the connection is back
		if _, err := tx.Exec(ctx, `SELECT FROM export_items WHERE owner_id = $1 AND id = 'a' FOR UPDATE`, owner); err != nil {
			t.Fatal(err)
		}
		executed := make(chan error, 1)
		go func() {
			_, err := w.Execute(ctx, Request{Operation: Confirm, OwnerID: owner, PlatformID: "p", IdempotencyKey: key,
				ItemID: "a", ExternalOrderID: "o-a", Quantity: 1})
			executed <- err
		}()
		waitForLockWaiters(t, db, 1) // A holds its key and waits for the item's row
		answered := make(chan error, 1)
		go func() { _, err := w.Execute(ctx, refused); answered <- err }()
		// B waits for A's key: a second backend waiting for a lock, which
		// it never is without the key's lock (it answers at once).
		waitForLockWaiters(t, db, 2)
		select {
		case early := <-answered:
			t.Errorf("%s under A's key answered %v while A was executing, want it to wait for A", name, early)
			answered <- early
		default:
		}
		_ = tx.Rollback(ctx)
		if err := <-executed; err != nil {
			t.Fatalf("A: %v", err)
		}
		if err := <-answered; !errors.Is(err, ErrIdempotencyConflict) {
			t.Errorf("%s under A's key, after A committed: %v, want ErrIdempotencyConflict", name, err)
		}
		if _, err := w.Execute(ctx, Request{Operation: Cancel, OwnerID: owner, PlatformID: "p", IdempotencyKey: key + "-undo",
			ItemID: "a", ExternalOrderID: "o-a", Quantity: 1}); err != nil {
			t.Fatal(err)
		}
	}
	var refusals int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM idempotency_refusals").Scan(&refusals); err != nil || refusals != 0 {
		t.Errorf("%d refusals bound (%v), want none: each key is its executed request's", refusals, err)
	}
}

// waitForLockWaiters waits until n backends wait for a lock.
func waitForLockWaiters(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := db.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends wait for a lock after 10 s, want %d", waiting, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The other order of the race: a refused request is binding the key (its
// transaction holds the key's lock) when another request under the key
// starts. That one waits, and its statement, whose snapshot is taken once
// it holds the lock, sees the binding: it answers the conflict and sells
// nothing. (Had its snapshot been taken before the wait, it would have
// sold, and both requests would hold the key.)
func TestAnExecutionStartingDuringABindingIsAConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "a")
	w := NewWriter(db, time.Hour)
	refused := Request{Operation: Confirm, OwnerID: owner, PlatformID: "p", IdempotencyKey: "k", ItemID: "gone", ExternalOrderID: "o", Quantity: 1}
	tx, err := db.Begin(ctx) // the refused request's binding, held before its commit
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // after a failure: the pool closes only once the connection is back
	if _, err := tx.Exec(ctx, keyLock, owner, "p", "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, bindRefusedSQL, owner, "p", "k", Fingerprint(refused), 3600.0, "not_found"); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := w.Execute(ctx, Request{Operation: Confirm, OwnerID: owner, PlatformID: "p", IdempotencyKey: "k",
			ItemID: "a", ExternalOrderID: "o", Quantity: 1})
		answered <- err
	}()
	waitForLockWaiters(t, db, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-answered; !errors.Is(err, ErrIdempotencyConflict) {
		t.Errorf("a confirm under a key being bound to another request = %v, want ErrIdempotencyConflict", err)
	}
	var sold bool
	if err := db.QueryRow(ctx, `SELECT sold FROM export_items WHERE owner_id = $1 AND id = 'a'`, owner).Scan(&sold); err != nil || sold {
		t.Errorf("item a sold = %v (%v), want false: the key was the refused request's", sold, err)
	}
}
