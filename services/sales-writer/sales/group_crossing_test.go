package sales

import (
	"context"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The crossing that makes a deadlock of two writers: a group that holds an
// item (its first call sold y) and waits for a key (its second call's, on
// z), while another writer's transaction holds that key and waits for the
// item (a copy of a call under that key, on y, sent to the other
// instance; here the test's own transaction). The group's lock_timeout
// (50 ms) rolls the group back and frees the item long before PostgreSQL's
// deadlock_timeout (1 s) would look for the cycle: PostgreSQL detects no
// deadlock, the other transaction gets the item, and the group's calls,
// run again alone, sell once the key is free. Without the lock_timeout
// the two waited for each other until the detector broke the cycle (one
// deadlock counted, a second of waiting for both).
func TestTwoWritersCrossingOnAKeyAndAnItemDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	admin := testenv.Pool(t, url)
	const app = "crossing-group"
	db := testenv.Pool(t, url+" application_name="+app)
	owner := saleFixture(t, admin, "y", "z")
	deadlocksBefore := deadlocksIn(t, admin)

	other := testenv.InTransaction(t, admin, keyLock, owner, "p", "k-z")
	w, seen, release := heldGroupingWriter(t, db)
	reqs := []Request{confirmOf(owner, "k-y", "y", "o-y"), confirmOf(owner, "k-z", "z", "o-z")}
	answers := executeInOrder(t, ctx, w, reqs)
	release()
	testenv.WaitForALockWait(t, admin, app) // the group holds y and waits for k-z
	if _, err := other.Exec(ctx, "SELECT FROM export_items WHERE owner_id = $1 AND id = 'y' FOR UPDATE", owner); err != nil {
		t.Fatalf("the other writer's transaction waiting for y, which the group holds: %v", err)
	}
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for i, a := range answers {
		if got := answered(t, reqs[i].ItemID, a); got.err != nil || got.res.Status != "inactive" {
			t.Errorf("confirm of %s = %+v, %v; want it sold once run again alone", reqs[i].ItemID, got.res, got.err)
		}
	}
	if ran, rolledBack := seen.counts(); len(ran) != 1 || len(rolledBack) != 1 || rolledBack[0] != 2 {
		t.Errorf("groups run %v, rolled back %v; want one group of 2, rolled back", ran, rolledBack)
	}
	db.Close()
	sessionsEnded(t, admin, app)
	if n := deadlocksIn(t, admin) - deadlocksBefore; n != 0 {
		t.Errorf("PostgreSQL detected %d deadlocks; want none: the group's lock_timeout ends its wait first", n)
	}
}

// deadlocksIn is the count of deadlocks PostgreSQL detected in db's
// database. A session adds its own to it at the latest when it exits.
func deadlocksIn(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// sessionsEnded waits until no session of application is left in db's
// database (a closed pool's backends exit a moment after it closes).
func sessionsEnded(t *testing.T, db *pgxpool.Pool, application string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var open int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, application).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions of %s still open 10 s after their pool closed", open, application)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
