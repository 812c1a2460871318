package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether err says that PostgreSQL could not be reached,
// had no connection to give, or that the connection was lost (the server is
// down, restarting, full or out of reach; or a pooler in front of it says
// so, poolerError), rather than an answer of the server to the statement. The
// services answer it 503 unavailable, a condition to retry, not the 500 of
// a bug.
func Unreachable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// The caller's deadline or hang-up, whatever the connection's state
		// (a context error is a net.Error too): the caller tells those apart.
		return false
	}
	// A server error first: a connection refused by the server itself
	// (unknown database, wrong password) is a ConnectError holding one.
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return unreachableCode(pgErr.Code) || poolerError(pgErr)
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
}

// NothingSent reports whether err came before any statement reached
// PostgreSQL, so that nothing the call asked for was done: no connection
// was opened (refused by the system, or by the server for want of a slot,
// a password, a role or a database: a pgconn.ConnectError), none came free
// in the pool before the caller's deadline (Acquire's AcquireError),
// pgx failed before sending a byte (pgconn.SafeToRetry, which a
// ConnectError does not answer true: pgx v5.13 gives it no SafeToRetry),
// or a pooler kept the statement waiting for a server connection until it
// gave up (poolerWaitedOut). A connection lost, or a deadline met, once a
// statement was sent is not: that statement may have been done.
func NothingSent(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) || acquireFailed(err) || pgconn.SafeToRetry(err) || poolerWaitedOut(err)
}

// NothingDone reports whether err left every statement of the call
// undone: none was sent (NothingSent), or its batch failed while
// PostgreSQL prepared the batch's new statements (pgx's
// ErrPreprocessingBatch, step "prepare"). pgx sends those statements to
// be prepared, with a Sync of their own, and sends none to run before
// PostgreSQL has answered: a prepare refused (a table renamed under the
// writer) or cut short (the connection lost, the deadline met, the
// caller gone) ran nothing, whatever the batch holds. The other step,
// "build" (an argument pgx cannot encode), is not NothingDone: pgx ends
// the connection then, and the Terminate it sends carries the statements
// queued before that argument, which PostgreSQL runs; a COMMIT among them
// commits (TestNothingDoneReadsABatchThatFailedBeforeItRan). pgx names
// the step only in the error's text: a wording it changes reads as
// "may", never "nothing".
func NothingDone(err error) bool {
	var preprocessing pgx.ErrPreprocessingBatch
	return NothingSent(err) ||
		errors.As(err, &preprocessing) && strings.HasPrefix(preprocessing.Error(), "error preprocessing batch (prepare)")
}

// poolerWaitedOut reports whether err is PgBouncer ending a client that
// waited for a server connection past its query_wait_timeout. PgBouncer
// (transaction pooling) forwards nothing of a client's transaction before
// it links the client to a server connection, and it gives this one word
// only to a client still waiting for one (its janitor's round of the
// waiting clients: "query_wait_timeout", the whole message, in the
// sources read, 1.18's, which the tests run, and today's; FATAL in both,
// ERROR in older ones), so no statement of it reached PostgreSQL. Its other errors of the same kind
// may come after a statement was sent: query_timeout ends waiting and
// running clients alike (TestSaleThePoolerEndedMayHaveBeenApplied), and
// "server conn crashed?" a linked one. The message is matched whole: a
// pooler's words are all that tell these apart (08P01, without a routine).
func poolerWaitedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && poolerError(pgErr) && pgErr.Message == "query_wait_timeout"
}

// unreachableCode: SQLSTATE class 08 (connection exception) but 08P01
// (protocol_violation: what the server says of a client's malformed
// message, a bug), the server shutting down (57P01 admin_shutdown, 57P02
// crash_shutdown) or not yet accepting connections (57P03
// cannot_connect_now), and no connection slot left (53300
// too_many_connections).
func unreachableCode(code string) bool {
	return strings.HasPrefix(code, "08") && code != "08P01" ||
		code == "57P01" || code == "57P02" || code == "57P03" || code == "53300"
}

// poolerError reports whether pgErr is a pooler's own error, not
// PostgreSQL's: PgBouncer (README, "Behind PgBouncer") sends each of its
// own as 08P01 and without the routine that PostgreSQL names in every
// error it raises. They are its connection exceptions: PostgreSQL refuses
// its logins ("server login has been failing", as after a password
// changed), is down ("pgbouncer cannot connect to server"), no server
// connection came free in time ("query_wait_timeout"), or the one in use
// was lost ("server conn crashed?", a commit's outcome unknown). Read as
// PostgreSQL's 08P01, a client's malformed message, each was a 500
// internal_error.
func poolerError(pgErr *pgconn.PgError) bool {
	return pgErr.Code == "08P01" && pgErr.Routine == ""
}

// poolerWaiting reports whether err is a pooler's word that PostgreSQL is
// not there behind it yet: down, starting up, or full. A stack started together
// starts PgBouncer before PostgreSQL is up, and a binary stopped there at
// once, as for a wrong setting, where without the pooler it waits for the
// same PostgreSQL. PostgreSQL refusing PgBouncer's login (a password, a
// role, a database) is left out: without a pooler, that is not waited for
// either (notThereYet lists what is).
func poolerWaiting(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !poolerError(pgErr) {
		return false
	}
	for _, words := range notThereYet {
		if strings.Contains(pgErr.Message, words) {
			return true
		}
	}
	return false
}

// notThereYet are the words of PgBouncer's errors that say PostgreSQL is
// down, starting up or full behind it: what Unreachable reads in
// PostgreSQL's own errors, and OpenWhenReached waits on without a pooler.
// Each release words it its own way, and sends it as 08P01 like every
// error of its own:
//   - query_wait_timeout: no server connection within it (1.18 waits so
//     while PostgreSQL refuses its connections; with the default 120 s,
//     Open's ping times out first);
//   - PostgreSQL's own refusal of a connection while it starts, recovers
//     or shuts down (SQLSTATE 57P03, "the database system is starting up",
//     "... is not yet accepting connections", "... is in recovery mode"),
//     which 1.18 passes on with 08P01 in place of 57P03, and 1.24 and
//     later quote after "server login has been failing, cached error: ";
//   - PostgreSQL's refusal for want of a connection slot (53300, "sorry,
//     too many clients already", "remaining connection slots are
//     reserved ...", and a role's or database's CONNECTION LIMIT reached,
//     "too many connections for role ..." or "... for database ..."),
//     passed on or quoted alike;
//   - 1.24 and later's "cached error" of a server it could not connect to
//     (connect failed, connect timeout, server DNS lookup failed);
//   - releases before 1.18's "pgbouncer cannot connect to server".
//
// 1.22 and 1.23 say "server login has been failing, try again later"
// whether PostgreSQL is down or refuses the login, so it is not waited for.
var notThereYet = []string{
	"query_wait_timeout",
	"the database system is ",
	"sorry, too many clients already",
	"remaining connection slots are reserved",
	"too many connections for ",
	"cached error: connect failed",
	"cached error: connect timeout",
	"cached error: server DNS lookup failed",
	"cannot connect to server",
}

// fromPooler is poolerError for any error that holds a server error.
func fromPooler(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && poolerError(pgErr)
}

// Unavailable reports whether err says that PostgreSQL cannot do the work
// now, for a reason of the server's that passes without any change to the
// request: Unreachable, or an answer that the statement was not done and a
// retry may be (the server read-only, overloaded, cancelling, or in
// conflict with another session or with a standby's replay), or that the
// server refuses the service's connections or fails in its own storage
// for a reason its operator puts right while the service runs (a password
// changed, the database renamed, a disk failing). The services answer it
// 503 unavailable with Retry-After, as an outage: none of these is a bug
// of theirs, nor a fault of the client's, and Cause names for the log
// what the operator has to do. What it leaves out is a 500: a statement
// the server refuses (a constraint, a syntax or type error, a permission),
// which no retry mends.
func Unavailable(err error) bool {
	if Unreachable(err) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && unavailableCode(pgErr.Code)
}

// unavailableCode: the SQLSTATEs of a statement the server did not do for
// a reason that passes.
//   - 40001 serialization_failure and 40P01 deadlock_detected: rolled back
//     to let another transaction through; on a hot standby they are also
//     the codes of a query cancelled by a conflict with recovery ("canceling
//     statement due to conflict with recovery": the replay of a VACUUM or
//     of a lock taken on the primary).
//   - 25006 read_only_sql_transaction: a writer sent to a standby or to a
//     primary fenced read-only (default_transaction_read_only) during a
//     failover.
//   - class 53, insufficient resources: disk full (53100), out of memory
//     (53200), too many connections (53300), a limit such as
//     max_locks_per_transaction (53400).
//   - 55P03 lock_not_available: a lock_timeout ran out behind another
//     session's lock.
//   - 54000 program_limit_exceeded: PostgreSQL's guard against
//     transaction-id (or MultiXact) wraparound, which refuses every
//     statement that would write once autovacuum has not frozen a table
//     for some 2 billion transactions (a year of sales at 70 calls a
//     second; something held it back: a transaction left open, a stale
//     replication slot or prepared transaction), until an operator's
//     VACUUM has. Reads go on. The code's other uses are statements past
//     a limit of the server (an index row over 2.7 kB, say), which the
//     services' bounded values never reach: a sale refused so was
//     answered 500, "the sale may have been applied", where nothing was,
//     and its line named no cause.
//   - class 57, operator intervention: a cancelled statement (57014, an
//     operator's pg_cancel_backend or a statement_timeout), the server
//     shutting down or starting (57P01-57P03), the database dropped or
//     its connection ended by a standby's replay (57P04), an idle session
//     ended (57P05).
//   - a new connection refused: 28P01 invalid_password (the role's
//     password changed under the running service), 28000
//     invalid_authorization_specification (the role dropped or made
//     NOLOGIN, no pg_hba.conf line for it), 3D000 invalid_catalog_name
//     (the database dropped or renamed). At start they stop the binary
//     (OpenWhenReached: a configuration to fix); under a running service
//     they come with each connection its pool opens, and pass once the
//     operator puts the role or the database back, with no restart: a 500
//     told the client to report a bug, and the log named no cause.
//   - class 58, system error (58030 io_error, 58P01 undefined_file: a
//     file of the cluster unreadable or missing), and class XX, internal
//     error (XX000; XX001 data_corrupted, XX002 index_corrupted): the
//     server's storage or the server itself fails; the operator acts
//     (Cause says where to look), the client's retry passes once it has.
func unavailableCode(code string) bool {
	switch code {
	case "40001", "40P01", "25006", "55P03", "28P01", "28000", "3D000", "54000":
		return true
	}
	for _, class := range []string{"53", "57", "58", "XX"} {
		if strings.HasPrefix(code, class) {
			return true
		}
	}
	return false
}

// SessionRefused reports whether err is PostgreSQL refusing a new session
// (28P01 a password that no longer matches, 28000 a role dropped or made
// NOLOGIN, 3D000 a database that is not there, 53300 no connection slot
// left: max_connections taken by other clients, or a CONNECTION LIMIT of
// the role or the database): the sessions opened before it may still
// serve.
func SessionRefused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "28P01", "28000", "3D000", "53300":
		return true
	}
	return false
}
