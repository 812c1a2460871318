package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

// OldTransactions names the client sessions in an old transaction, the
// ones an administrator may end, and not an autovacuum worker, which is
// in a transaction for as long as its VACUUM runs: it yields its lock to
// a waiter, and ending it only postpones it. The worker is made real on a
// cluster of the test's own (autovacuum_naptime is server-wide), its VACUUM
// throttled so that it lasts.
func TestOldTransactionsNamesNoAutovacuum(t *testing.T) {
	ctx := context.Background()
	pair := testenv.StandbyPair(t)
	pool := testenv.Pool(t, pair.Primary)
	for _, stmt := range []string{
		"ALTER SYSTEM SET autovacuum_naptime = 1",
		"SELECT pg_reload_conf()",
		`CREATE TABLE slow_vacuum (id int, pad text) WITH (autovacuum_vacuum_cost_delay = 100,
		    autovacuum_vacuum_cost_limit = 1, autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0)`,
		"INSERT INTO slow_vacuum SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g",
		"DELETE FROM slow_vacuum WHERE id % 2 = 0",
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	holder := testenv.Pool(t, pair.Primary+" application_name=holder")
	tx := testenv.InTransaction(t, holder, "SELECT 1")
	var holderPID uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	var worker int
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := pool.QueryRow(ctx, `SELECT coalesce(min(pid), 0) FROM pg_stat_activity
		    WHERE backend_type = 'autovacuum worker' AND datname = current_database() AND xact_start < now() - interval '200 ms'`).Scan(&worker)
		if err != nil {
			t.Fatal(err)
		}
		if worker != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no autovacuum worker ran on slow_vacuum within 60 s")
		}
	}
	got := postgres.OldTransactions(ctx, pool, 100*time.Millisecond)
	if strings.Contains(got, fmt.Sprintf("pid %d ", worker)) {
		t.Errorf("OldTransactions = %q, names the autovacuum worker (pid %d)", got, worker)
	}
	if !strings.Contains(got, fmt.Sprintf("pid %d (holder, idle in transaction", holderPID)) {
		t.Errorf("OldTransactions = %q, want the client session idle in a transaction (pid %d) named", got, holderPID)
	}
}

// A role without pg_read_all_stats sees nothing of another role's sessions
// but that they exist: OldTransactions, asked through such a role while a
// superuser's session holds a transaction open, said "no session is in a
// transaction that old now", sending the operator away from the holder.
// It counts the sessions it cannot see instead.
func TestOldTransactionsCountsSessionsHiddenFromTheRole(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	admin := testenv.Pool(t, url)
	role := fmt.Sprintf("unprivileged_%d", time.Now().UnixNano()) // roles are the cluster's
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+role+"'")
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	holder := testenv.Pool(t, url+" application_name=holder")
	testenv.InTransaction(t, holder, "SELECT 1")
	time.Sleep(150 * time.Millisecond) // older than the age asked about

	got := postgres.OldTransactions(ctx, admin, 100*time.Millisecond)
	if !strings.Contains(got, "(holder, idle in transaction") || strings.Contains(got, "hidden") {
		t.Fatalf("OldTransactions as the superuser = %q, want the holder named and nothing hidden", got)
	}
	unprivileged := testenv.Pool(t, url+" user="+role)
	got = postgres.OldTransactions(ctx, unprivileged, 100*time.Millisecond)
	if !strings.Contains(got, "session(s) of other roles are hidden from this role") || !strings.Contains(got, "pg_read_all_stats") {
		t.Errorf("OldTransactions as a role without pg_read_all_stats = %q, want the sessions it cannot see counted", got)
	}
}
