package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LockTimedOut reports whether err is a statement PostgreSQL cancelled
// after waiting lock_timeout for a lock (55P03 lock_not_available).
func LockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// Querier runs a query (a pool or a connection).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// OldTransactions names the sessions of db's database, other than db's
// own, whose transactions began more than age ago: after a lock_timeout
// of age, the likely holders of the lock given up on (nothing waits for
// it any more, so pg_blocking_pids can no longer tell), for an
// administrator to end. For example "sessions in a transaction that long:
// pid 4516 (psql, idle in transaction for 00:03:12)". Autovacuum workers
// are left out: one is in a transaction as long as its VACUUM runs
// (minutes on a big table, throttled), yet it yields its lock to whoever
// waits for it, and ending it only postpones it; named, it sent the
// operator to end the wrong process. But an anti-wraparound one ("(to
// prevent wraparound)" in its query), which does not yield, is named, as
// are other background workers (pg_cron's jobs, logical replication's
// table sync), which hold their locks as a client does.
//
// PostgreSQL shows a role without pg_read_all_stats (pg_monitor has it)
// nothing of another role's sessions but that they exist (backend_type,
// xact_start and query are null): for such a role the holder may be among
// them, a superuser's psql or any autovacuum worker, and the text counts
// them rather than say that no session is that old.
func OldTransactions(ctx context.Context, db Querier, age time.Duration) string {
	var (
		sessions []string
		hidden   int
	)
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(format('pid %s (%s, %s for %s)', pid,
	        coalesce(nullif(application_name, ''), 'no application_name'), state, date_trunc('second', now() - xact_start))
	        ORDER BY xact_start) FILTER (WHERE
	          NOT (backend_type = 'autovacuum worker' AND query NOT LIKE '%(to prevent wraparound)%')
	          AND xact_start < now() - $1::interval), '{}'),
	      count(*) FILTER (WHERE backend_type IS NULL)
	    FROM pg_stat_activity
	    WHERE datname = current_database() AND pid <> pg_backend_pid()`, age.String()).Scan(&sessions, &hidden)
	if err != nil {
		return "the sessions holding it could not be read: " + err.Error()
	}
	text := "no session is in a transaction that old now"
	if len(sessions) > 0 {
		text = "sessions in a transaction that long: " + strings.Join(sessions, ", ")
	}
	if hidden > 0 {
		text += fmt.Sprintf("; %d session(s) of other roles are hidden from this role, the holder maybe among them "+
			"(grant it pg_read_all_stats to have them named)", hidden)
	}
	return text
}
