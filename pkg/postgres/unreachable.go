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
