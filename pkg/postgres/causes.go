package postgres

import (
	"errors"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cause says, for an operator reading the log line of an Unavailable
// error, what PostgreSQL refused and what puts it right, or "" when err
// holds no server error Unavailable knows (the error itself then says it
// all: a connection lost, a timeout). The line's error field keeps the
// server's own words and SQLSTATE; a password is in neither.
func Cause(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return warnedCause(err)
	}
	if poolerError(pgErr) {
		return poolerCause
	}
	if cause, ok := causes[pgErr.Code]; ok {
		return cause
	}
	if len(pgErr.Code) == 5 {
		return causes[pgErr.Code[:2]+"*"]
	}
	return ""
}

// warnedCause is Cause for an error that came after a warning
// (WarnedError) and holds no server error: the warning's SQLSTATE says
// what ended the session.
func warnedCause(err error) string {
	var warned *WarnedError
	if !errors.As(err, &warned) {
		return ""
	}
	if cause, ok := warnedCauses[warned.Warning.Code]; ok {
		return cause
	}
	return ""
}

// warnedCauses holds Cause's texts for the warnings a session ends after.
// A session terminated (pg_terminate_backend, a shutdown) while its COMMIT
// waits for a synchronous standby warns 57P01 and closes the connection:
// committed on the primary, perhaps not on the standby. An immediate
// shutdown, or a crash of another backend (57P02), warns so at any point.
var warnedCauses = map[string]string{
	"57P01": "PostgreSQL ended the session after warning (pg_terminate_backend, a shutdown): " +
		"a session ended while its commit waited for a synchronous standby (wait_event SyncRep) committed on the primary, perhaps not on the standby",
	"57P02": "PostgreSQL crashed and is restarting: see the server's log",
}

// CauseAttr is Cause as a log attribute, "cause", or none (an empty Attr,
// which slog leaves out) when Cause has nothing to say.
func CauseAttr(err error) slog.Attr {
	return CauseAttrOf(err, "DATABASE_URL")
}

// CauseOf is Cause for an error of a pool opened from setting, which its
// text names where Cause's names DATABASE_URL: export-reader's pool is
// READ_DATABASE_URL's when that is set (a replica), and a cause that sent
// its operator to DATABASE_URL, the primary's, sent them to a database
// that was fine.
func CauseOf(err error, setting string) string {
	return strings.ReplaceAll(Cause(err), "DATABASE_URL", setting)
}

// CauseAttrOf is CauseOf as a log attribute, as CauseAttr is Cause.
func CauseAttrOf(err error, setting string) slog.Attr {
	if cause := CauseOf(err, setting); cause != "" {
		return slog.String("cause", cause)
	}
	return slog.Attr{}
}

// poolerCause is Cause's text for a pooler's own error (poolerError).
const poolerCause = "the pooler in front of PostgreSQL (PgBouncer) ended or refused the connection, as its message says: " +
	"server login has been failing, PostgreSQL refuses the pooler's login (a password changed) or, from PgBouncer 1.22, is down " +
	"(its cached error, or the pooler's log, says which); password or SASL authentication failed, the pooler itself " +
	"(its auth_file or auth_query) or PostgreSQL behind it refuses DATABASE_URL's password; the database system is starting up, PostgreSQL is starting or recovering; " +
	"query_wait_timeout or cannot connect to server, PostgreSQL is down or every server connection is busy"

// causes holds Cause's texts by SQLSTATE, and by class ("53*") for the
// codes of a class without a text of their own. Each reads true wherever
// it is printed: a running service's log line, or exportctl's error, whose
// operator runs it once and meets the refusal (a mistyped password as
// well as a changed one), with no service under it.
var causes = map[string]string{
	"28P01": "PostgreSQL refused the password of DATABASE_URL's role (a wrong one, or the role's changed since): " +
		"give the role and DATABASE_URL the same password; a running service's new connections then succeed, without a restart",
	"28000": "PostgreSQL refused DATABASE_URL's role (dropped, NOLOGIN, or no pg_hba.conf line lets it in): " +
		"restore the role's login; a running service's new connections then succeed, without a restart",
	"3D000": "DATABASE_URL's database does not exist (dropped, renamed, or misspelt): " +
		"restore or rename it back, or point DATABASE_URL at it",
	"25006": "the database is read-only (a standby after a failover, or default_transaction_read_only): " +
		"point DATABASE_URL at the primary",
	"53100": "PostgreSQL's disk is full: free space on the server (its data or WAL volume)",
	"53200": "PostgreSQL is out of memory: check the server's memory and work_mem",
	"53300": "PostgreSQL has no connection slot left (max_connections, or a CONNECTION LIMIT of the role or the database): " +
		"see pg_stat_activity for what holds them",
	"53*": "PostgreSQL is out of a resource (see the SQLSTATE and the server's log)",
	"54000": "PostgreSQL refuses to write, to avoid transaction-id wraparound (or reached another limit of its own, as its message says): " +
		"autovacuum could not freeze a table; end what holds it back (an old transaction, a stale replication slot or prepared transaction) and VACUUM the database its message names " +
		"(README, \"Disk over months\"); reads go on meanwhile",
	"55P03": "a lock_timeout ran out behind another session's lock: see pg_locks and pg_stat_activity",
	"57014": "the statement was cancelled (statement_timeout, or pg_cancel_backend)",
	"57P01": "PostgreSQL is shutting down or ended the session (pg_terminate_backend, a restart, a failover)",
	"57P02": "PostgreSQL crashed and is restarting: see the server's log",
	"57P03": "PostgreSQL takes no connections now: it is starting up, in recovery or shutting down (its message says which)",
	"57*":   "an operator's intervention ended the statement or the session",
	"58*":   "PostgreSQL failed to read or write its own files (an I/O error, a file missing): check the server's disk and log",
	"XX001": "PostgreSQL found a corrupted data page: see the server's log for the relation; restore it from a backup",
	"XX002": "PostgreSQL found a corrupted index: REINDEX the index the error names",
	"XX*":   "PostgreSQL reports an internal error: see the server's log",
	"40001": "a serialization failure or a conflict with a standby's recovery rolled the statement back",
	"40P01": "a deadlock (or a standby's recovery conflict) rolled the statement back",
}
