package schema_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/schema"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// A new deployment's tables are left never analyzed (reltuples -1), not
// analyzed as empty (0): statements planned on a table recorded as empty
// scan it whole as it fills, until autovacuum analyzes it again.
func TestMigrationsLeaveEmptyTablesUnanalyzed(t *testing.T) {
	pool := testenv.Postgres(t)
	for _, table := range []string{"export_items", "sales", "idempotency_records", "idempotency_refusals"} {
		var reltuples float64
		if err := pool.QueryRow(context.Background(), "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", table).
			Scan(&reltuples); err != nil {
			t.Fatal(err)
		}
		if reltuples != -1 {
			t.Errorf("%s: reltuples = %v after the migrations, want -1 (never analyzed)", table, reltuples)
		}
	}
}

// The down migrations of 00004 and 00005 run on tables with rows, restore
// the table CHECKs, and the up migrations apply again after them.
func TestRecentMigrationsGoDownAndUpAgain(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	insertOneSale(t, pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(pool), os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(ctx, 3); err != nil {
		t.Fatalf("down to 3: %v", err)
	}
	if n := count(t, pool, "SELECT count(*) FROM pg_constraint WHERE conname IN ('sales_check', 'idempotency_records_idempotency_key_check', 'export_items_id_check')"); n != 3 {
		t.Errorf("after down to 3: %d of the 3 table CHECKs back, want 3", n)
	}
	if _, err := provider.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if n := count(t, pool, "SELECT count(*) FROM pg_type WHERE typname IN ('external_order_id', 'idempotency_key', 'item_id')"); n != 3 {
		t.Errorf("after up: %d of the 3 domains, want 3", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM sales JOIN idempotency_records USING (owner_id, platform_id)"); n != 1 {
		t.Errorf("after down and up: %d sale rows with their record, want 1", n)
	}
}

// Migration 00008 has export_items compress its documents with lz4, which
// imports asked for per session before (SET default_toast_compression),
// and its down migration gives them back the server's default.
func TestExportItemsCompressTheirDocumentsWithLZ4(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if count(t, pool, `SELECT count(*) FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)`) == 0 {
		t.Skip("this PostgreSQL was built without lz4: the migration leaves pglz")
	}
	const lz4Columns = `SELECT count(*) FROM pg_attribute WHERE attrelid = 'export_items'::regclass AND attcompression = 'l'`
	if n := count(t, pool, lz4Columns); n != 7 {
		t.Errorf("%d columns of export_items compressed with lz4, want 7 (category, characteristics, images, texts, doc_*)", n)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(pool), os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(ctx, 7); err != nil {
		t.Fatalf("down to 7: %v", err)
	}
	if n := count(t, pool, lz4Columns); n != 0 {
		t.Errorf("after down to 7: %d columns compressed with lz4, want none", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname = 'import_staging'`); n != 0 {
		t.Errorf("after down to 7: the import_staging schema is still there")
	}
}

func insertOneSale(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		WITH o AS (INSERT INTO owners (name) VALUES ('o') RETURNING id),
		     p AS (INSERT INTO platforms (id) VALUES ('p') RETURNING id),
		     i AS (INSERT INTO export_items (owner_id, id, listed_active, sold, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		           SELECT o.id, 'item-1', true, true, 'EUR', '{"ENG":{}}', '{}', '{}', '{}', now() FROM o RETURNING owner_id),
		     s AS (INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
		           SELECT i.owner_id, 'item-1', p.id, 'order-1', now() FROM i, p)
		INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
		SELECT i.owner_id, p.id, 'key-1', '\x00', '{}', now() + interval '1 hour' FROM i, p`)
	if err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// A database behind the build fails the check, and a service's readiness
// with it, until it is migrated; then both pass.
func TestCheckNamesTheMissingVersionsUntilMigrated(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	var ready *schema.Readiness // made while the database is behind: once current, it only pings
	if err := schema.Check(ctx, pool); err != nil {
		t.Fatalf("migrated database: %v", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(pool), os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	latest := provider.ListSources()[len(provider.ListSources())-1].Version
	for _, to := range []int64{latest - 1, 0} {
		if _, err := provider.DownTo(ctx, to); err != nil {
			t.Fatalf("down to %d: %v", to, err)
		}
		want := fmt.Sprintf("the database is at version %d, this build needs %d: run exportctl migrate", to, latest)
		if err := schema.Check(ctx, pool); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("at version %d: Check = %v, want an error saying %q", to, err, want)
		}
		if ready == nil {
			ready = schema.NewReadiness(ctx, sideOf(t, pool), slog.New(slog.DiscardHandler))
		}
		if err := ready.Ready(ctx); err == nil {
			t.Errorf("at version %d: Ready = nil, want the schema's error", to)
		}
	}
	if _, err := schema.Up(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("after the migration: Ready = %v", err)
	}
}

// A database that was never migrated has no version table: the check says
// so and what to run.
func TestCheckOfADatabaseNeverMigrated(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if _, err := pool.Exec(ctx, "DROP TABLE goose_db_version"); err != nil {
		t.Fatal(err)
	}
	// At version 0, as one migrated down to it: not "a table is missing".
	database, build, err := schema.Versions(ctx, pool)
	if err != nil || database != 0 {
		t.Errorf("Versions = %d, %d, %v; want the database at 0", database, build, err)
	}
	want := fmt.Sprintf("the database is at version 0, this build needs %d: run exportctl migrate", build)
	if err := schema.Check(ctx, pool); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Check = %v, want an error saying %q", err, want)
	}
	// A readiness probe writes nothing, even where goose would create its table.
	var table *string
	if err := pool.QueryRow(ctx, "SELECT to_regclass('goose_db_version')::text").Scan(&table); err != nil || table != nil {
		t.Errorf("after Check, goose_db_version = %v (%v), want still missing", table, err)
	}
}

// The check does not queue behind the service's statements: with every
// connection of the service's pool taken, it still answers at once.
func TestReadinessAnswersWhileThePoolIsSaturated(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL(t)+" pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ready := schema.NewReadiness(ctx, sideOf(t, pool), slog.New(slog.DiscardHandler))
	busy, err := pool.Acquire(ctx) // the service's only connection, held by a long statement
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	probeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := ready.Ready(probeCtx); err != nil {
		t.Errorf("Ready with the pool saturated = %v, want nil", err)
	}
}

// After PostgreSQL dropped the check's idle connection (a restart), the
// next check still passes: the first probe after every restart must not
// take a service out that can serve.
func TestReadinessSurvivesADroppedConnection(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	ready := schema.NewReadiness(ctx, sideOf(t, pool), slog.New(slog.DiscardHandler))
	if err := ready.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	var dropped int
	if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&dropped); err != nil || dropped == 0 {
		t.Fatalf("terminated %d backends (%v), want the check's", dropped, err)
	}
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("Ready after its connection was dropped = %v, want nil", err)
	}
}

// A migration that fails after others applied in the same run: Up returns
// the ones that applied with the error, so that exportctl migrate still
// names them (00004 and 00005 ask for a restart of the services).
func TestUpNamesWhatItAppliedBeforeAFailure(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	provider, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(pool), os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(ctx, 4); err != nil {
		t.Fatalf("down to 4: %v", err)
	}
	// 00006 creates this table: it fails, after 00005 applied.
	if _, err := pool.Exec(ctx, "CREATE TABLE idempotency_refusals (x int)"); err != nil {
		t.Fatal(err)
	}
	applied, err := schema.Up(ctx, pool)
	if err == nil {
		t.Fatal("Up with 00006 bound to fail = nil error, want its failure")
	}
	if len(applied) != 1 || applied[0].Version != 5 || !strings.HasPrefix(applied[0].File, "00005_") {
		t.Errorf("Up that failed at 00006 = %+v, want 00005 applied", applied)
	}
}

// sideOf is the connection apart from pool that a service gives its
// readiness (postgres.OpenSide), closed when the test ends.
func sideOf(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	side, err := postgres.OpenSide(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(side.Close)
	return side
}

// A migration that waits for a lock on its table, held by a long report
// query (or a pg_dump), gives up after MigrationLockWait with ErrTablesBusy
// naming the report's session, instead of waiting as long as the report
// runs with every request to the table queued behind it; once the report
// has ended, it applies.
func TestAMigrationGivesUpBehindALongQuery(t *testing.T) {
	pool := testenv.Postgres(t)
	pid, err := upBehindAReport(t, pool, pool, "")
	if !errors.Is(err, schema.ErrTablesBusy) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (", pid)) {
		t.Errorf("Up() behind a report = %v, want ErrTablesBusy naming pid %d", err, pid)
	}
}

// Through PgBouncer, set as the README says
// (postgres.PoolerIgnoredSettings), a migration runs, and still gives up
// behind a long query: the bound is set in each migration's transaction,
// not given in the startup message, which PgBouncer refused ("unsupported
// startup parameter: lock_timeout"), so no migration ran through it; nor
// set in the session, which in transaction mode bounds whichever server
// session the SET ran in.
func TestAMigrationThroughAPoolerGivesUpBehindALongQuery(t *testing.T) {
	for _, mode := range []string{"session", "transaction"} {
		t.Run(mode, func(t *testing.T) {
			dsn := testenv.PostgresURL(t)
			direct := testenv.Pool(t, dsn)
			pooled := testenv.Pool(t, testenv.PgBouncer(t, dsn, mode,
				"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings, "default_pool_size = 10")+
				" default_query_exec_mode=exec")
			if _, err := upBehindAReport(t, direct, pooled, " through PgBouncer"); !errors.Is(err, schema.ErrTablesBusy) {
				t.Errorf("Up() through PgBouncer behind a report = %v, want ErrTablesBusy", err)
			}
		})
	}
}

// upBehindAReport takes the schema down to 00006 (00007 alters
// idempotency_refusals), holds a report's read of that table open on
// direct, and returns the report's pid and what Up on migrating returned
// meanwhile; once the report has ended, Up must apply 00007 (and those
// after it). It fails the
// test if Up still waits 10 s past MigrationLockWait. via names the path
// in its messages.
func upBehindAReport(t *testing.T, direct, migrating *pgxpool.Pool, via string) (int, error) {
	t.Helper()
	ctx := context.Background()
	provider, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(direct), os.DirFS("migrations"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(ctx, 6); err != nil {
		t.Fatalf("down to 6: %v", err)
	}
	report := testenv.InTransaction(t, direct, "SELECT count(*) FROM idempotency_refusals")
	var pid int
	if err := report.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := schema.Up(ctx, migrating)
		done <- err
	}()
	var behind error
	select {
	case behind = <-done:
	case <-time.After(schema.MigrationLockWait + 10*time.Second):
		_ = report.Rollback(ctx)
		<-done
		t.Fatalf("Up()%s still waits for the report's lock 10s past MigrationLockWait", via)
	}
	if err := report.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if applied, err := schema.Up(ctx, migrating); err != nil || len(applied) == 0 || applied[0].Version != 7 {
		t.Errorf("Up()%s after the report = %v, %v; want 00007 applied, and those after it", via, applied, err)
	}
	return pid, behind
}

// A database renamed under a running service: the check's next connection
// is refused (SQLSTATE 3D000), and its error, the WARN not ready's, says
// what the operator must put right, not only the server's words; once the
// database is back the service is ready again, with no restart.
func TestReadinessSaysWhatToPutRight(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	ready := schema.NewReadiness(ctx, sideOf(t, pool), slog.New(slog.DiscardHandler))
	if err := ready.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	restore := testenv.RenameDatabase(t, url)
	err := ready.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "3D000") || !strings.Contains(err.Error(), "DATABASE_URL's database does not exist") {
		t.Errorf("Ready with the database renamed = %v, want the refusal and what to do", err)
	}
	restore()
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("Ready once the database is back = %v, want nil", err)
	}
}

// A role made NOLOGIN (28000; a password changed before the services had
// it, 28P01, is TestReadinessServesOnThroughAPasswordChange) refuses the
// check's next session first. While the service's
// own pool still has a connection that answers, the service serves, so it
// stays ready and warns of the cause (schema.ServingOn); once that
// connection has ended, it is unready, naming the cause.
func TestReadinessServesOnOpenConnectionsWhenNewSessionsAreRefused(t *testing.T) {
	ctx := context.Background()
	pool, refuseNewSessions := serviceRole(t, 1)
	_, ready, logged := readyOnItsConnection(t, pool)
	refuseNewSessions(backendPID(t, pool))
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("Ready while the pool's connection serves = %v, want nil", err)
	}
	if got := logged.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "PostgreSQL refused DATABASE_URL's role") {
		t.Errorf("log = %q, want a WARN naming the cause", got)
	}
	pool.Reset() // the pool's connections end: none left that answers
	err := ready.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL refused DATABASE_URL's role") {
		t.Errorf("Ready with no connection left = %v, want the refusal with its cause", err)
	}
}

// PostgreSQL with no connection slot left (SQLSTATE 53300: max_connections
// taken by other clients, or a CONNECTION LIMIT of the role or the
// database) refuses the check's next session, which its renewal every
// minute asks for, while the service's pool serves on the sessions it
// holds. Unready, a reader of a make run stack left the gateway's
// rotation at its renewal, within a minute of a client filling
// max_connections (the client took the slot the renewal gave back), while
// its pool served; every instance renews within that minute. So the
// service stays ready and warns naming the cause; once its own
// connections have ended too, it is unready, naming it.
func TestReadinessServesOnOpenConnectionsWhenNoSlotIsLeft(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	admin := testenv.Pool(t, url)
	role := fmt.Sprintf("slots_%d", time.Now().UnixNano())
	// Not a superuser: a role's CONNECTION LIMIT does not bind one.
	mustExec(t, admin, "CREATE ROLE "+role+" LOGIN")
	mustExec(t, admin, "GRANT SELECT ON ALL TABLES IN SCHEMA public TO "+role)
	t.Cleanup(func() {
		mustExec(t, admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+role+"'")
		mustExec(t, admin, "REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "+role)
		mustExec(t, admin, "DROP ROLE "+role)
	})
	pool := testenv.Pool(t, url+" user="+role+" pool_max_conns=1")
	side, ready, logged := readyOnItsConnection(t, pool)
	// The pool's session holds the one slot; the check's connection is
	// renewed, as it is every minute.
	mustExec(t, admin, "ALTER ROLE "+role+" CONNECTION LIMIT 1")
	side.Reset()
	wantServingOn(t, ready, logged, "53300", "PostgreSQL has no connection slot left")
	// The calls that waited for the pool's connections, refused one more
	// (postgres.SlotWaits: none of a pool not opened by Open).
	if got := logged.String(); !strings.Contains(got, "calls_waited_for_a_slot=0") {
		t.Errorf("log = %q, want the WARN to count the calls that waited for a slot", got)
	}
	pool.Reset() // the pool's connection ends: none left that answers
	mustExec(t, admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+role+"'")
	mustExec(t, admin, "ALTER ROLE "+role+" CONNECTION LIMIT 0")
	err := ready.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL has no connection slot left") {
		t.Errorf("Ready with no connection left = %v, want the refusal with its cause", err)
	}
	mustExec(t, admin, "ALTER ROLE "+role+" CONNECTION LIMIT -1")
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("Ready once slots are free = %v, want nil", err)
	}
}

// PostgreSQL slow to start the check's session (seconds, as when its
// max_connections are taken and other clients retry theirs) while the
// service's pool serves: the check answers within the prober's second,
// ready, warning of the slowness, where it waited for the session and the
// gateway's prober gave up on it, three times, taking out every instance
// that served (a make run stack, 38 s). Once the pool has no connection
// left, it is unready, naming the slowness; once sessions start again, it
// is ready.
func TestReadinessServesOnOpenConnectionsWhileSessionsAreSlowToStart(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t) + " pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	sessionsStart := make(chan struct{})
	var slow atomic.Bool
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if slow.Load() {
			<-sessionsStart
		}
		return dial(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	defer func() {
		if slow.Load() {
			close(sessionsStart)
		}
	}()
	side, ready, logged := readyOnItsConnection(t, pool)
	slow.Store(true)
	side.Reset() // the check's connection renewed, as every minute: its new session is slow to start

	probeCtx, cancel := context.WithTimeout(ctx, time.Second) // the gateway's prober's wait
	defer cancel()
	if err := ready.Ready(probeCtx); err != nil || probeCtx.Err() != nil {
		t.Errorf("Ready while the pool's connection serves = %v (prober's wait: %v), want nil within the prober's second", err, probeCtx.Err())
	}
	if got := logged.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "slow to start new sessions") {
		t.Errorf("log = %q, want a WARN naming the slowness", got)
	}

	pool.Reset() // the pool's connection ends: none left that answers
	if err := ready.Ready(ctx); err == nil || !strings.Contains(err.Error(), "did not start the readiness check's session") {
		t.Errorf("Ready with no connection left = %v, want the slowness named", err)
	}

	slow.Store(false)
	close(sessionsStart)
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("Ready once sessions start again = %v, want nil", err)
	}
}

// A session slow to start is no answer from PostgreSQL, as a refusal is:
// a hung server (stopped, its disk stalled) starts none either. With the
// service's connections all in use, on statements that may be hung as
// well, nothing shows that it serves: the check is unready, as it was
// before it gave up on the session at 0.5 s, rather than ready within the
// prober's second on connections that may never come back (every request
// sent to it would time out).
func TestReadinessIsUnreadyWhenSessionsAreSlowToStartAndNoConnectionAnswers(t *testing.T) {
	ctx := context.Background()
	pool, hold, release := slowToStart(t)
	defer release() // before the side pool's Close, which waits for its session
	side, ready, _ := readyOnItsConnection(t, pool)
	busy, err := pool.Acquire(ctx) // a request's statement, hung for all the check can tell
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	hold()
	side.Reset() // the check's connection renewed, as every minute: its new session does not start
	if err := ready.Ready(ctx); err == nil {
		t.Error("Ready with the check's session not starting and the pool's one connection in use = nil, want unready")
	}
}

// The check's connection is shared (export-reader's replica lag reading
// takes it every second, and a check outlives a prober that gave up on
// it): one still in use past the wait is no session slow to start, and
// the WARN says so, naming what holds it, rather than sending on-call to
// max_connections.
func TestReadinessSaysItsConnectionWasInUseNotSlowToStart(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t, testenv.PostgresURL(t)+" pool_max_conns=1")
	side, ready, logged := readyOnItsConnection(t, pool)
	held, err := side.Acquire(ctx) // a lag reading, or an earlier check, waiting on PostgreSQL
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("Ready with its connection in use and the pool's idle one answering = %v, want nil", err)
	}
	got := logged.String()
	if strings.Contains(got, "slow to start new sessions") || !strings.Contains(got, "slow to answer on the readiness check's open connection") {
		t.Errorf("log = %q, want a WARN that PostgreSQL was slow to answer on the check's open connection, not that sessions are slow to start", got)
	}
}

// slowToStart is a service's pool of one connection whose new sessions,
// once hold is called, do not start until release is (a dial held).
func slowToStart(t *testing.T) (pool *pgxpool.Pool, hold, release func()) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t) + " pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	var held atomic.Bool
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if held.Load() {
			select {
			case <-released:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return dial(ctx, network, addr)
	}
	pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	t.Cleanup(release)
	return pool, func() { held.Store(true) }, release
}

// readyOnItsConnection is the readiness of a service on pool
// (schema.ServingOn), its check on a side pool of its own and logging to
// logged: ready, with the service's connection open and idle in pool.
func readyOnItsConnection(t *testing.T, pool *pgxpool.Pool) (side *pgxpool.Pool, ready *schema.Readiness, logged *testenv.Output) {
	t.Helper()
	ctx := context.Background()
	side = sideOf(t, pool)
	logged = &testenv.Output{}
	ready = schema.NewReadiness(ctx, side, slog.New(slog.NewTextHandler(logged, nil)), schema.ServingOn(pool))
	if err := ready.Ready(ctx); err != nil {
		t.Fatalf("Ready before = %v, want nil", err)
	}
	if err := pool.Ping(ctx); err != nil { // the service's connection, idle in its pool
		t.Fatal(err)
	}
	return side, ready, logged
}

// wantServingOn checks that ready passes on the pool's open connection
// while the check's new session is refused with sqlstate, and that logged
// holds the WARN naming the refusal and cause.
func wantServingOn(t *testing.T, ready *schema.Readiness, logged *testenv.Output, sqlstate, cause string) {
	t.Helper()
	if err := ready.Ready(context.Background()); err != nil {
		t.Errorf("Ready while the pool's connection serves = %v, want nil", err)
	}
	if got := logged.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, sqlstate) ||
		!strings.Contains(got, cause) {
		t.Errorf("log = %q, want a WARN naming the refusal and its cause", got)
	}
}

// The same through a real password change (28P01, on a cluster that asks
// for a password), as an operator rotates one before DATABASE_URL: the
// sessions open serve on, so the service stays ready on its pool's
// connection and warns naming the password; once that connection has
// ended, it is unready, naming it; once the role's password is
// DATABASE_URL's again, it is ready, with no restart. No password is in
// the log or the check's error.
func TestReadinessServesOnThroughAPasswordChange(t *testing.T) {
	ctx := context.Background()
	role := testenv.PasswordCluster(t)
	pool := testenv.Pool(t, role.DSN+" pool_max_conns=1")
	side, ready, logged := readyOnItsConnection(t, pool)
	restore := role.ChangePassword(t)
	side.Reset() // the check's connection renewed, as it is every minute
	wantServingOn(t, ready, logged, "28P01", "PostgreSQL refused the password of DATABASE_URL's role")
	pool.Reset() // the pool's connection ends: none left that answers
	err := ready.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL refused the password of DATABASE_URL's role") {
		t.Errorf("Ready with no connection left = %v, want the refusal with its cause", err)
	}
	if err != nil && strings.Contains(logged.String()+err.Error(), role.Password) {
		t.Errorf("the log or the check's error holds the password: %v\n%s", err, logged.String())
	}
	restore()
	if err := ready.Ready(ctx); err != nil {
		t.Errorf("Ready once the password is set back = %v, want nil", err)
	}
}

// While new sessions are refused, a service under load serves on its
// open connections all in use: no idle one is left for the check to ping.
// Pinging through the pool there asked it for a connection: one more
// session, refused, where the pool could still grow (the instance taken
// out of rotation at every probe that came while its connections were
// busy), or a wait behind the queued statements where it could not, past
// the gateway's one second. The check reads that the pool's connections
// serve instead, as the side connection exists to keep it off the queue.
func TestReadinessServesOnBusyConnectionsWhenNewSessionsAreRefused(t *testing.T) {
	for _, maxConns := range []int{2, 1} { // room to grow, and saturated
		t.Run(fmt.Sprintf("pool_max_conns=%d", maxConns), func(t *testing.T) {
			ctx := context.Background()
			pool, refuseNewSessions := serviceRole(t, maxConns)
			side := sideOf(t, pool)
			ready := schema.NewReadiness(ctx, side, slog.New(slog.DiscardHandler), schema.ServingOn(pool))
			if err := ready.Ready(ctx); err != nil {
				t.Fatalf("Ready before = %v, want nil", err)
			}
			busy, err := pool.Acquire(ctx) // a request's statement under way
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Release()
			refuseNewSessions(busy.Conn().PgConn().PID())
			if err := ready.Ready(ctx); err != nil {
				t.Errorf("Ready while the pool's one connection serves a request = %v, want nil", err)
			}
		})
	}
}

// The check tries a refused session once: ping's second try is for a
// connection found dead after a restart, and a second login, refused as
// the first, only doubled the FATAL lines each probe left in PostgreSQL's
// log while the role's password did not match (once the instance is out,
// each gateway probes it every 250 ms, and the kubelet too).
func TestReadinessTriesARefusedSessionOnce(t *testing.T) {
	ctx := context.Background()
	pool, refuseNewSessions := serviceRole(t, 1)
	cfg := pool.Config()
	var logins atomic.Int32
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { logins.Add(1); return nil }
	counted, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(counted.Close)
	ready := schema.NewReadiness(ctx, sideOf(t, counted), slog.New(slog.DiscardHandler))
	if err := ready.Ready(ctx); err != nil {
		t.Fatalf("Ready before = %v, want nil", err)
	}
	refuseNewSessions(0)
	// The first check finds its connection ended (by the refusal's
	// terminate here, by its renewal in production), then is refused.
	for range 2 {
		logins.Store(0)
		if err := ready.Ready(ctx); err == nil {
			t.Fatal("Ready with the role NOLOGIN = nil, want the refusal")
		}
	}
	if got := logins.Load(); got != 1 {
		t.Errorf("Ready with the role NOLOGIN tried %d logins, want 1", got)
	}
}

// serviceRole is the pool of a service (pool_max_conns maxConns) that
// connects as a login role of the test's own, and refuseNewSessions, which
// makes that role NOLOGIN (the test clusters trust every login: 28000
// where a changed password gives 28P01) and ends its sessions but the
// service's connection keep, as the side connection's renewal would.
func serviceRole(t *testing.T, maxConns int) (pool *pgxpool.Pool, refuseNewSessions func(keep uint32)) {
	t.Helper()
	url := testenv.PostgresURL(t)
	admin := testenv.Pool(t, url)
	role := fmt.Sprintf("readiness_%d", time.Now().UnixNano())
	mustExec(t, admin, "CREATE ROLE "+role+" LOGIN SUPERUSER")
	t.Cleanup(func() {
		mustExec(t, admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+role+"'")
		mustExec(t, admin, "DROP ROLE "+role)
	})
	pool = testenv.Pool(t, url+" user="+role+" pool_max_conns="+strconv.Itoa(maxConns))
	return pool, func(keep uint32) {
		mustExec(t, admin, "ALTER ROLE "+role+" NOLOGIN")
		mustExec(t, admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+role+"' AND pid <> "+
			strconv.FormatUint(uint64(keep), 10))
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// backendPID is the server process of pool's one idle connection.
func backendPID(t *testing.T, pool *pgxpool.Pool) uint32 {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	return conn.Conn().PgConn().PID()
}
