package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether err says that PostgreSQL could not be reached,
// had no connection to give, or that the connection was lost (the server is
// down, restarting, full or out of reach), rather than an answer of the
// server to the statement. The
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
		return unreachableCode(pgErr.Code)
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
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

// Unavailable reports whether err says that PostgreSQL cannot do the work
// now, for a reason of the server's that passes without any change to the
// request: Unreachable, or an answer that the statement was not done and a
// retry may be (the server read-only, overloaded, cancelling, or in
// conflict with another session or with a standby's replay). The services
// answer it 503 unavailable with Retry-After, as an outage: none of these
// is a bug of theirs, nor a fault of the client's. What it leaves out is a
// 500: a statement the server refuses (a constraint, a syntax or type
// error), an internal error or corruption (XX), or an I/O error (58),
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
//   - class 57, operator intervention: a cancelled statement (57014, an
//     operator's pg_cancel_backend or a statement_timeout), the server
//     shutting down or starting (57P01-57P03), the database dropped or
//     its connection ended by a standby's replay (57P04), an idle session
//     ended (57P05).
func unavailableCode(code string) bool {
	switch code {
	case "40001", "40P01", "25006", "55P03":
		return true
	}
	return strings.HasPrefix(code, "53") || strings.HasPrefix(code, "57")
}
