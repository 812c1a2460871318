package postgres

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable reports whether err says that PostgreSQL could not be reached
// or that the connection was lost (the server is down, restarting, or out
// of reach), rather than an answer of the server to the statement. The
// services answer it 503 unavailable, a condition to retry, not the 500 of
// a bug.
func Unreachable(err error) bool {
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

// unreachableCode: SQLSTATE class 08 (connection exception), and the
// server shutting down (57P01 admin_shutdown, 57P02 crash_shutdown) or
// not yet accepting connections (57P03 cannot_connect_now).
func unreachableCode(code string) bool {
	return strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03"
}
