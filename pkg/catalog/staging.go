package catalog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// An import's staging table is an UNLOGGED table of its own in the
// import_staging schema (migration 00008), not a TEMP table: behind a
// pooler in transaction mode (PgBouncer pool_mode=transaction) an import's
// statements run in whichever server session is free, and a TEMP table is
// seen by the session that made it alone, so a COPY or a chunk run
// elsewhere stopped the import, and the table stayed in the session that
// made it (20 tables, 85 MB, after 32 imports through PgBouncer). Every
// statement of an import is now whole in itself: its table is seen from
// every session, and nothing is set on a session.
//
// Such a table outlives its import when exportctl is killed, so each
// import registers its table in import_staging.runs in the transaction
// that creates it, marks the run seen every stagingSeenEvery while it runs
// (while it waits for its file too), and drops its table when it ends; an
// import starting drops first the tables of runs not seen for
// stagingStaleAfter.
const (
	stagingSeenEvery  = time.Minute
	stagingStaleAfter = 15 * time.Minute
	// stagingDropWait bounds the drop of a table at an import's end, which
	// runs after the import's own context may have ended.
	stagingDropWait = 10 * time.Second
)

// stagingRun is an import's staging table and its registration.
type stagingRun struct {
	name   string    // the table's name in import_staging
	seenAt time.Time // when the run was last marked seen
}

// table is the run's table, schema-qualified and quoted, for SQL text.
func (r *stagingRun) table() string { return pgx.Identifier{"import_staging", r.name}.Sanitize() }

// newStagingName names an import's staging table, apart from any other
// import's: with one name for every import, a concurrent import for another
// owner dropped this one's table and staged its own under that name, and
// this import's chunks wrote that owner's items as this owner's (3,000 of
// 3,000, measured through a PgBouncer of one server connection).
func newStagingName() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "items_" + hex.EncodeToString(b)
}

// openStaging drops the staging tables of stopped runs, then creates this
// import's table and registers it, in one transaction, so that no table is
// ever without its run.
func openStaging(ctx context.Context, conn *pgx.Conn, owner pgtype.UUID) (*stagingRun, error) {
	if err := dropStaleStagings(ctx, conn); err != nil {
		return nil, err
	}
	run := &stagingRun{name: newStagingName()}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var lz4 bool
		if err := tx.QueryRow(ctx, lz4Available).Scan(&lz4); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, createStaging(run.table(), lz4)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO import_staging.runs (staging, owner_id) VALUES ($1, $2)`, run.name, owner)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("catalog: staging table: %w", err)
	}
	run.seenAt = time.Now()
	return run, nil
}

// lz4Available is whether the server was built with lz4 (what migration
// 00008 asks too).
const lz4Available = `SELECT coalesce(bool_or('lz4' = ANY (enumvals)), false) FROM pg_settings WHERE name = 'default_toast_compression'`

// createStaging is the statement that creates the staging table named
// table. Its rows are written once and read once: lz4 (where the server
// has it) compresses them several times faster than pglz, and autovacuum,
// which would analyze the table while the import fills it, is kept off.
func createStaging(table string, lz4 bool) string {
	compression := ""
	if lz4 {
		compression = " COMPRESSION lz4"
	}
	return `CREATE UNLOGGED TABLE ` + table + ` (
    id text PRIMARY KEY, coin_id text, listed_active boolean NOT NULL, price numeric(18,4),
    currency text NOT NULL, category jsonb, characteristics jsonb` + compression + ` NOT NULL,
    images jsonb` + compression + ` NOT NULL, texts jsonb` + compression + ` NOT NULL,
    doc_eng text` + compression + ` NOT NULL, doc_rus text` + compression + ` NOT NULL,
    doc_ukr text` + compression + ` NOT NULL
) WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)`
}

// markSeenIfDue marks the run seen when stagingSeenEvery has passed since
// it last was.
func (r *stagingRun) markSeenIfDue(ctx context.Context, conn *pgx.Conn) error {
	if time.Since(r.seenAt) < stagingSeenEvery {
		return nil
	}
	return r.markSeen(ctx, conn)
}

// markSeen marks the run seen. A run no longer registered was taken for a
// stopped one by another import, which dropped its table: ErrStagingLost.
func (r *stagingRun) markSeen(ctx context.Context, conn *pgx.Conn) error {
	tag, err := conn.Exec(ctx, `UPDATE import_staging.runs SET seen_at = now() WHERE staging = $1`, r.name)
	if err != nil {
		return fmt.Errorf("catalog: staging table: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrStagingLost
	}
	r.seenAt = time.Now()
	return nil
}

// drop drops the run's table and its registration. It runs as the import
// ends, its context perhaps cancelled (a Ctrl-C), so it has a bound of its
// own. A table it could not drop is dropped by a later import, and said
// (StagingLeft): left without a word, a copy of the catalog stayed in the
// database for at least stagingStaleAfter, and nobody knew why.
func (r *stagingRun) drop(ctx context.Context, db txBeginner) *StagingLeft {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stagingDropWait)
	defer cancel()
	if err := dropStaging(ctx, db, r.name); err != nil {
		return &StagingLeft{Name: r.name, Err: err}
	}
	return nil
}

// StagingLeft is an import's staging table that it could not drop as it
// ended: another session held a lock on it for longer than
// stagingLockWait (a pg_dump holds one for as long as it runs), or the
// database did not answer within stagingDropWait. The table, a copy of the
// imported items, stays registered in import_staging.runs, and the first
// import started stagingStaleAfter after this one ended drops it.
type StagingLeft struct {
	Name string // the table's name in the schema import_staging
	Err  error  // why the drop failed
}

// Table is the table's schema-qualified name.
func (l *StagingLeft) Table() string { return "import_staging." + l.Name }

// DropStatement is the SQL that drops the table and its registration now.
// It waits 5 s at most for the table's lock: pasted while a pg_dump still
// holds it, a DROP without that bound would wait for the dump's end, and
// hold up every session that asks for the table after it.
func (l *StagingLeft) DropStatement() string {
	return "BEGIN; SET LOCAL lock_timeout = '5s'; DROP TABLE IF EXISTS " + pgx.Identifier{"import_staging", l.Name}.Sanitize() +
		"; DELETE FROM import_staging.runs WHERE staging = '" + strings.ReplaceAll(l.Name, "'", "''") + "'; COMMIT;"
}

// StaleAfter is how long after the import a later import drops the table.
func (l *StagingLeft) StaleAfter() time.Duration { return stagingStaleAfter }

// txBeginner is a connection or a pool.
type txBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// dropStaging drops the staging table name and its run in one
// transaction, waiting at most stagingLockWait for the table's lock.
func dropStaging(ctx context.Context, db txBeginner, name string) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := setLockWait(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{"import_staging", name}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM import_staging.runs WHERE staging = $1`, name)
		return err
	})
}

// dropStaleStagings drops the tables of runs not seen for
// stagingStaleAfter: their imports were killed, or lost their database
// before they could drop them. It is this import's clean-up of others'
// tables, so a table it cannot drop (dropStale) is left for a later import
// rather than stopping this one: one left behind by another role, which
// this one may not drop, stopped every import. Only a table of a name
// newStagingName makes is dropped: a row of runs naming runs (written by
// hand) had the clean-up drop the table of runs itself, and every import
// fail after.
func dropStaleStagings(ctx context.Context, conn *pgx.Conn) error {
	rows, _ := conn.Query(ctx, `SELECT staging FROM import_staging.runs WHERE seen_at < now() - make_interval(secs => $1)
  AND staging ~ '^items_[0-9a-f]{16}$'`, stagingStaleAfter.Seconds())
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("catalog: staging tables of stopped imports: %w", err)
	}
	for _, name := range stale {
		if err := dropStale(ctx, conn, name); err != nil && ctx.Err() != nil {
			return fmt.Errorf("catalog: staging table %s of a stopped import: %w", name, err)
		}
	}
	return nil
}

// stagingLockWait bounds the wait for the lock on a staging table to drop
// it. A pg_dump holds a lock on it for as long as it runs, and a run
// stopped in the middle of a COPY (kill -STOP) holds its own: a stopped
// run's drop waited behind them with no bound, and the import with it.
// Waiting in line for that lock, the drop would also hold up every session
// that asks for one after it (a pg_dump starting).
const stagingLockWait = "1s"

// setLockWait sets stagingLockWait as the lock_timeout of tx alone.
func setLockWait(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, stagingLockWait)
	return err
}

// dropStale drops the table of the run name if that run is still not seen
// for stagingStaleAfter when its row is taken: a run marked seen since it
// was read as stopped keeps its table (its row is locked by that UPDATE
// until it commits, and read again then). Read once and dropped after,
// such a run lost its table while it ran.
func dropStale(ctx context.Context, conn *pgx.Conn, name string) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := setLockWait(ctx, tx); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM import_staging.runs WHERE staging = $1 AND seen_at < now() - make_interval(secs => $2)`,
			name, stagingStaleAfter.Seconds())
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		_, err = tx.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{"import_staging", name}.Sanitize())
		return err
	})
}

// ErrStagingLost is an import's error when its staging table is gone: the
// import was not seen for stagingStaleAfter (its process stopped, or its
// database connection held up that long), and another import took it for
// stopped and dropped its table. The chunks before are written
// (ImportResult); running it again completes it.
var ErrStagingLost = errors.New("catalog: the import's staging table was dropped: the import was not seen for " +
	stagingStaleAfter.String() + " and another import took it for stopped; run it again")

// stagingError is err, or ErrStagingLost with it when it says the staging
// table is not there (42P01 undefined_table, naming it).
func stagingError(err error, run *stagingRun) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" && strings.Contains(pgErr.Message, run.name) {
		return fmt.Errorf("%w (%w)", ErrStagingLost, err)
	}
	return err
}
