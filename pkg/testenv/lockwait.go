package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WaitForALockWait waits until a session of application (its
// application_name) in db's database waits for a lock: a call of the
// binary under test has then reached the statement a test's transaction
// holds up. It fails the test after 10 s.
func WaitForALockWait(t testing.TB, db *pgxpool.Pool, application string) {
	t.Helper()
	for range 500 {
		var waiting bool
		err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock')`, application).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("testenv: no session of %s came to wait for a lock", application)
}

// WaitUntilTrue waits until query, which returns one boolean, is true in
// db, checking every 10 ms; it fails the test after 10 s.
func WaitUntilTrue(t testing.TB, db *pgxpool.Pool, query string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ok bool
		if err := db.QueryRow(context.Background(), query).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %s: not true after 10 s", query)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
