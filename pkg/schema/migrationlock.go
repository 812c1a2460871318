package schema

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3/lock"

	"github.com/coinexport/export/pkg/postgres"
)

// Why neither goose's session lock nor a SET in each session: behind a
// pooler in transaction mode (PgBouncer's pool_mode = transaction) a
// statement outside a transaction runs in whichever server session is free
// and leaves what it set there for the next client. goose's session
// advisory lock was so taken and left on one server connection, and did
// not hold concurrent runs apart (of 6 rounds of 6 runs at once on an
// empty database, 4 had runs fail or hang), and a `SET lock_timeout` meant
// for the migration's session bound some service's session instead. What
// a transaction does stays in its session, whatever the pooler: the lock
// is held by an open transaction of a connection of its own, and each
// migration's transaction sets its own lock_timeout.

// MigrationLockHeldFor bounds how long a migration waits for another run
// of exportctl migrate to end (goose's session lock waited as long): a
// migration Job's restarts, or the administrator, run it again later.
const MigrationLockHeldFor = 5 * time.Minute

// ErrMigrationLockHeld is a migration that waited MigrationLockHeldFor for
// another run to end and gave up, applying nothing.
var ErrMigrationLockHeld = errors.New("another exportctl migrate held the migration lock for over " +
	MigrationLockHeldFor.String() + " and this one gave up, applying nothing")

// ErrNoSessionForMigration is a run that got no second database session
// within sessionWait: behind a pooler with too few server connections, the
// lock's transaction held one while the migrations waited in the pooler's
// queue for another (120 s, PgBouncer's query_wait_timeout, and then a
// message that named no cause).
var ErrNoSessionForMigration = errors.New("the migration got no database session within " + SessionWait.String() +
	" (it needs two at once, its lock's and its migrations': behind a pooler, give exportctl's database " +
	"at least 3 server connections in transaction mode, 2 per run at once in session mode; README, Behind PgBouncer)")

// SessionWait bounds each wait of a migration for a database session:
// its lock's connection and tries, and the migrations' first statement
// once the lock is held.
const SessionWait = 10 * time.Second

// sessionWait is SessionWait, shorter in tests.
var sessionWait = SessionWait

// heldLock is the migration lock: the advisory lock goose's session locker
// takes (lock.DefaultLockID, so that runs of an older exportctl, which
// take it by session, and of this one keep apart), held by a transaction
// that stays open, on a connection of its own, until release. An open
// transaction keeps its server session through any pooler, and its lock
// goes with it when the connection drops, exportctl killed or not. It does
// not count against the pool's connections: migrate still holds two at
// most, the pool's one (the migrations') and this one.
type heldLock struct{ conn *pgx.Conn }

// lockWait is MigrationLockHeldFor, shorter in tests.
var lockWait = MigrationLockHeldFor

// lockKey is the lock's key as SQL.
var lockKey = strconv.FormatInt(lock.DefaultLockID, 10)

// tryLock begins the lock's transaction and tries the lock. No setting of
// the session (a statement_timeout given in DATABASE_URL, an
// idle_in_transaction_session_timeout of the role) may end that
// transaction while the migrations run: SET LOCAL overrides them for it
// alone. A session that holds the lock as the transaction begins holds it
// by session, an older exportctl's, left on a pooler's server connection
// that now serves this run: there pg_try_advisory_xact_lock took it again
// (a session may take its own advisory lock twice), and the run migrated
// beside that lock, so such a session is waited for as any other holder.
var tryLock = "BEGIN; " +
	"SET LOCAL idle_in_transaction_session_timeout = 0; " +
	"SET LOCAL statement_timeout = 0; " +
	"SELECT CASE WHEN EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() " +
	"AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = " + lockKey + ") " +
	"THEN false ELSE pg_try_advisory_xact_lock(" + lockKey + ") END"

// takeMigrationLock takes the lock, trying again until lockWait has
// passed, and then makes sure the migrations can have a session of pool
// beside it.
func takeMigrationLock(ctx context.Context, pool *pgxpool.Pool) (*heldLock, error) {
	var conn *pgx.Conn
	err := withinSessionWait(ctx, func(ctx context.Context) (err error) {
		conn, err = pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("connecting for the migration lock: %w", err)
	}
	if err := waitForLock(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		if errors.Is(err, ErrMigrationLockHeld) {
			named, cancel := context.WithTimeout(ctx, sessionWait)
			defer cancel()
			err = fmt.Errorf("%w: %s", err, lockHolders(named, pool))
		}
		return nil, err
	}
	held := &heldLock{conn}
	if err := withinSessionWait(ctx, pool.Ping); err != nil {
		_ = held.release(ctx)
		return nil, err
	}
	return held, nil
}

// waitForLock tries the lock on conn until it is taken, its transaction
// then left open, or lockWait has passed. A run that waited inside its
// transaction would hold a server connection of a transaction-mode pool
// meanwhile, and a few waiting runs would take every one the running
// migration needs: between tries it holds none.
func waitForLock(ctx context.Context, conn *pgx.Conn) error {
	deadline := time.Now().Add(lockWait)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		var taken bool
		err := withinSessionWait(ctx, func(ctx context.Context) (err error) {
			taken, err = tryOnce(ctx, conn)
			return err
		})
		if taken || err != nil {
			return err
		}
		if time.Now().Add(pause).After(deadline) {
			return ErrMigrationLockHeld
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryOnce takes the lock on conn and keeps its transaction open, or ends
// it. The simple protocol: one round trip, and no prepared statement,
// which a transaction-mode pool may not keep.
func tryOnce(ctx context.Context, conn *pgx.Conn) (bool, error) {
	results, err := conn.PgConn().Exec(ctx, tryLock).ReadAll()
	if err != nil {
		return false, fmt.Errorf("taking the migration lock: %w", err)
	}
	last := results[len(results)-1]
	if len(last.Rows) == 1 && string(last.Rows[0][0]) == "t" {
		return true, nil
	}
	if _, err := conn.PgConn().Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
		return false, fmt.Errorf("waiting for the migration lock: %w", err)
	}
	return false, nil
}

// withinSessionWait runs do, which needs a database session, and answers
// ErrNoSessionForMigration when it got none within sessionWait.
func withinSessionWait(ctx context.Context, do func(context.Context) error) error {
	bounded, cancel := context.WithTimeout(ctx, sessionWait)
	defer cancel()
	err := do(bounded)
	if err != nil && ctx.Err() == nil && bounded.Err() != nil {
		return ErrNoSessionForMigration
	}
	return err
}

// release ends the lock's transaction and its connection, within
// sessionWait even once ctx has ended (a connection cut off would hang the
// run; the server ends the transaction once it finds it gone). Failing,
// the lock may have been lost while the migrations ran (a pooler's
// idle_transaction_timeout ended its transaction).
func (l *heldLock) release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sessionWait)
	defer cancel()
	_, err := l.conn.PgConn().Exec(ctx, "ROLLBACK").ReadAll()
	if closeErr := l.conn.Close(ctx); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("releasing the migration lock (it may have been lost while the migrations ran): %w", err)
	}
	return nil
}

// migrationDB is goose's database over pool: each transaction of it, every
// migration's, has PostgreSQL check that its client is still there, and
// bounds its lock waits to MigrationLockWait, unless DATABASE_URL sets
// lock_timeout for every session itself.
func migrationDB(pool *pgxpool.Pool) *sql.DB {
	setUp := checkClient
	if _, set := pool.Config().ConnConfig.RuntimeParams["lock_timeout"]; !set {
		setUp = boundLockWaits + "; " + checkClient
	}
	db := sql.OpenDB(boundedTx{stdlib.GetPoolConnector(pool), setUp})
	// As stdlib.OpenDBFromPool: an idle connection goes back to the pool.
	db.SetMaxIdleConns(0)
	return db
}

// boundedTx runs setUp first in each transaction of its connections,
// setting what it sets in the transaction alone (SET LOCAL), where no
// pooler can leave it to another client. A migration marked "-- +goose NO
// TRANSACTION" (none so far) would run without it: give it its own SET.
type boundedTx struct {
	driver.Connector
	setUp string
}

func (c boundedTx) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return boundedTxConn{conn.(*stdlib.Conn), c.setUp}, nil
}

// boundedTxConn is pgx's database/sql connection (every other method its
// own) whose BeginTx runs setUp in the transaction.
type boundedTxConn struct {
	*stdlib.Conn
	setUp string
}

// boundLockWaits bounds the transaction's lock waits to MigrationLockWait.
var boundLockWaits = "SET LOCAL lock_timeout = " + strconv.FormatInt(MigrationLockWait.Milliseconds(), 10)

// checkClient has PostgreSQL (14 and later) check every second that the
// migration's client is still there: a run killed mid-statement otherwise
// left its session running that statement, and holding its table's lock,
// until the statement ended (its lock freed with its connection, a run
// started meanwhile gave up behind that session). It is set also when
// DATABASE_URL sets lock_timeout: set with boundLockWaits alone, it was
// not then, and a run killed in a 20 s pg_sleep left its session sleeping
// 19.1 s more (directly), where it ended 1.1 s after the kill.
const checkClient = "SELECT set_config('client_connection_check_interval', '1000', true) " +
	"WHERE current_setting('client_connection_check_interval', true) IS NOT NULL"

func (c boundedTxConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	if _, err := c.Conn.Conn().PgConn().Exec(ctx, c.setUp).ReadAll(); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("schema: bounding the migration's transaction: %w", err)
	}
	return tx, nil
}

// lockHolders names the sessions holding the migration lock, for an
// administrator to find the run that holds it (or a session an older
// exportctl left holding it behind a pooler, which only ending it frees).
func lockHolders(ctx context.Context, db postgres.Querier) string {
	var holders []string
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(format('pid %s (%s, %s for %s)', a.pid,
	        coalesce(nullif(a.application_name, ''), 'no application_name'), a.state,
	        date_trunc('second', now() - a.state_change)) ORDER BY a.pid), '{}')
	    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	      AND ((l.classid::bigint << 32) | l.objid::bigint) = $1`, lock.DefaultLockID).Scan(&holders)
	switch {
	case err != nil:
		return "its holder could not be read: " + err.Error()
	case len(holders) == 0:
		return "no session holds it now: run exportctl migrate again"
	}
	return "held by " + strings.Join(holders, ", ") + "; run exportctl migrate again once that run has ended " +
		"(a session holding it with no migration running, left by an older exportctl behind a pooler, ends only by pg_terminate_backend)"
}
