package schema_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3/lock"

	"github.com/coinexport/export/pkg/schema"
	"github.com/coinexport/export/pkg/testenv"
)

// Runs of migrate at once on an empty database, through PgBouncer in
// transaction mode (two server connections, as testenv's), take turns:
// each ends without error, the migrations are applied once in all, and no
// session is left holding the lock. goose's session lock was taken and
// left on whichever server connection was free: of 6 rounds of 6 such runs
// 4 had runs fail ("relation \"owners\" already exists") or hang.
func TestMigrationsAtOnceThroughATransactionPoolTakeTurns(t *testing.T) {
	files, err := os.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		direct, dsn := emptyDatabase(t)
		pooled := testenv.PgBouncer(t, dsn, "transaction") + " default_query_exec_mode=exec"
		applied, errs := upAtOnce(t, pooled, 6)
		for _, err := range errs {
			t.Errorf("round %d: a run through the transaction pool: %v", round, err)
		}
		if applied != len(files) {
			t.Errorf("round %d: the runs applied %d migrations in all, want %d, once each", round, applied, len(files))
		}
		if n := count(t, direct, advisoryLocksHere); n != 0 {
			t.Errorf("round %d: %d advisory locks still held after every run ended, want none", round, n)
		}
	}
}

// advisoryLocksHere counts the advisory locks held in the test's database
// alone: another database of the cluster (TEST_DATABASE_URL's may be
// shared) may hold some that are none of the migrations'.
const advisoryLocksHere = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' " +
	"AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"

// upAtOnce runs schema.Up from n pools on dsn at once and returns how many
// migrations they applied in all and their errors; it fails the test if a
// run still waits after a minute.
func upAtOnce(t *testing.T, dsn string, n int) (int, []error) {
	t.Helper()
	type result struct {
		applied int
		err     error
	}
	results := make(chan result, n)
	for range n {
		pool := testenv.Pool(t, dsn)
		go func() {
			applied, err := schema.Up(context.Background(), pool)
			results <- result{len(applied), err}
		}()
	}
	var (
		applied int
		errs    []error
	)
	for range n {
		select {
		case r := <-results:
			applied += r.applied
			if r.err != nil {
				errs = append(errs, r.err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("a run of %d at once still waits a minute after they began", n)
		}
	}
	return applied, errs
}

// emptyDatabase creates a database with nothing migrated, dropped at the
// test's end, and returns a pool on it and its DSN.
func emptyDatabase(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := testenv.PostgresURL(t)
	admin := testenv.Pool(t, dsn)
	name := fmt.Sprintf("empty_%d", time.Now().UnixNano())
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	empty := dsn + " dbname=" + name
	pool := testenv.Pool(t, empty)
	t.Cleanup(func() {
		pool.Close()
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	return pool, empty
}

// A migration through a transaction pool leaves none of its settings in
// the server sessions that then serve other clients: its lock_timeout
// bounded some service's statements until the pooler closed that server
// connection.
func TestAMigrationThroughATransactionPoolLeavesNoSettingBehind(t *testing.T) {
	direct, dsn := emptyDatabase(t)
	pooled := testenv.PgBouncer(t, dsn, "transaction") + " default_query_exec_mode=exec"
	if _, err := schema.Up(context.Background(), testenv.Pool(t, pooled)); err != nil {
		t.Fatal(err)
	}
	// Both server connections at once, each in a transaction of a client
	// of its own.
	client := testenv.Pool(t, pooled)
	for i := range 2 {
		tx := testenv.InTransaction(t, client, "SELECT 1")
		var pid int
		var timeout string
		if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid(), current_setting('lock_timeout')").Scan(&pid, &timeout); err != nil {
			t.Fatal(err)
		}
		if timeout != "0" {
			t.Errorf("server session %d (pid %d) after a migration through the pool: lock_timeout = %s, want 0", i+1, pid, timeout)
		}
	}
	if n := count(t, direct, advisoryLocksHere); n != 0 {
		t.Errorf("%d advisory locks held after the migration, want none", n)
	}
}

// Through a transaction pool, a run waits for a lock an older exportctl
// took by session and left on a server connection, also when its tries
// come to that very connection: pg_try_advisory_xact_lock took the lock
// again there (a session may take its own advisory lock twice), and the
// run applied every migration beside it, 3 runs of 3 in 0.24 s.
func TestAMigrationThroughATransactionPoolWaitsForALockLeftOnItsServerConnection(t *testing.T) {
	ctx := context.Background()
	direct, dsn := emptyDatabase(t)
	pooled := testenv.PgBouncer(t, dsn, "transaction") + " default_query_exec_mode=exec"
	client := testenv.Pool(t, pooled)
	// One of the two server connections held, so that the lock is left on
	// the other, which then serves every statement of the run.
	held := testenv.InTransaction(t, client, "SELECT 1")
	var holder int
	if err := client.QueryRow(ctx, "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock($1)) l", lock.DefaultLockID).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	// A run that took the lock waits for the held connection for its
	// migrations: freed after 3 s, or once the run has ended.
	ended, freed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(freed)
		select {
		case <-ended:
		case <-time.After(3 * time.Second):
		}
		_ = held.Rollback(ctx)
	}()

	schema.SetLockWait(t, time.Second)
	applied, err := schema.Up(ctx, testenv.Pool(t, pooled))
	close(ended)
	<-freed
	if !errors.Is(err, schema.ErrMigrationLockHeld) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (", holder)) || len(applied) != 0 {
		t.Errorf("Up() with the lock left on its server connection = %d applied, %v; want ErrMigrationLockHeld naming pid %d, nothing applied",
			len(applied), err, holder)
	}
	if n := count(t, direct, "SELECT count(*) FROM pg_tables WHERE tablename = 'owners'"); n != 0 {
		t.Error("a migration ran while an older exportctl's session held the lock")
	}
}

// A run waits for a session holding the lock by session, as an older
// exportctl takes it (the same key as goose's session lock), applies once
// it is freed; and one that waited past its bound gives up naming the
// holder.
func TestAMigrationWaitsForAnotherRunsLock(t *testing.T) {
	ctx := context.Background()
	direct, dsn := emptyDatabase(t)
	holder, err := direct.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", lock.DefaultLockID); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}

	schema.SetLockWait(t, time.Second)
	applied, err := schema.Up(ctx, testenv.Pool(t, dsn))
	if !errors.Is(err, schema.ErrMigrationLockHeld) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (", pid)) || len(applied) != 0 {
		t.Errorf("Up() while another session held the lock = %v, %v; want ErrMigrationLockHeld naming pid %d, nothing applied", applied, err, pid)
	}
	if n := count(t, direct, "SELECT count(*) FROM pg_tables WHERE tablename = 'owners'"); n != 0 {
		t.Fatal("a migration ran while another session held the lock")
	}

	schema.SetLockWait(t, time.Minute)
	done := make(chan error, 1)
	waiting := testenv.Pool(t, dsn)
	go func() {
		_, err := schema.Up(ctx, waiting)
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // to find it held at least once; the outcome does not depend on it
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", lock.DefaultLockID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Up() once the lock was freed = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Up() still waits 30 s after the lock was freed")
	}
	if n := count(t, direct, "SELECT count(*) FROM pg_tables WHERE tablename = 'owners'"); n != 1 {
		t.Error("the migration waiting for the lock did not apply once it was freed")
	}
}

// Behind a pooler with one server connection, a run says at once that it
// needs two sessions, and frees the lock: in transaction mode the lock's
// transaction held the one while the migrations waited in PgBouncer's
// queue, and the run failed after 120 s with `failed to list migrations:
// FATAL: query_wait_timeout`, naming no cause.
func TestAMigrationBehindAPoolerOfOneServerConnectionSaysItNeedsTwo(t *testing.T) {
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			direct, dsn := emptyDatabase(t)
			pooled := testenv.PgBouncer(t, dsn, mode, "default_pool_size = 1") + " default_query_exec_mode=exec"
			schema.SetSessionWait(t, 2*time.Second)
			done := make(chan error, 1)
			pool := testenv.Pool(t, pooled)
			go func() {
				_, err := schema.Up(context.Background(), pool)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, schema.ErrNoSessionForMigration) {
					t.Errorf("Up() behind one server connection = %v, want ErrNoSessionForMigration", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Up() behind one server connection still waits after 30 s")
			}
			if n := count(t, direct, "SELECT count(*) FROM pg_tables WHERE tablename = 'owners'"); n != 0 {
				t.Error("a migration ran")
			}
			if n := count(t, direct, advisoryLocksHere); n != 0 {
				t.Errorf("%d advisory locks held after the run gave up, want none", n)
			}
		})
	}
}

// Each migration's transaction bounds its lock waits (to
// MigrationLockWait, or DATABASE_URL's lock_timeout) and has PostgreSQL
// check that its client is still there, in the transaction alone: a run
// killed mid-statement left its session running that statement, its table
// locked, until the statement ended. With a lock_timeout in DATABASE_URL it
// was not checked: a killed run's session slept on 19.1 s, 1.1 s without.
func TestEachMigrationTransactionBoundsItself(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	for _, tc := range []struct {
		name, dsn, wantLockTimeout, wantAfter string
	}{
		{"lock_timeout of its own", dsn, "5s", "0"},
		{"lock_timeout in DATABASE_URL", dsn + " lock_timeout=2000", "2s", "2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := schema.MigrationDB(testenv.Pool(t, tc.dsn))
			defer db.Close()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var lockTimeout, checkInterval string
			if err := tx.QueryRowContext(ctx, "SELECT current_setting('lock_timeout'), current_setting('client_connection_check_interval')").
				Scan(&lockTimeout, &checkInterval); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if lockTimeout != tc.wantLockTimeout || checkInterval != "1s" {
				t.Errorf("in a migration's transaction lock_timeout = %s, client_connection_check_interval = %s; want %s and 1s",
					lockTimeout, checkInterval, tc.wantLockTimeout)
			}
			if err := db.QueryRowContext(ctx, "SELECT current_setting('lock_timeout'), current_setting('client_connection_check_interval')").
				Scan(&lockTimeout, &checkInterval); err != nil {
				t.Fatal(err)
			}
			if lockTimeout != tc.wantAfter || checkInterval != "0" {
				t.Errorf("after it, lock_timeout = %s, client_connection_check_interval = %s; want %s and 0", lockTimeout, checkInterval, tc.wantAfter)
			}
		})
	}
}
