package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestUnreachableClassifiesErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"starting up", fmt.Errorf("read: %w", &pgconn.PgError{Code: "57P03"}), true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"broken pipe", &net.OpError{Op: "write", Net: "unix", Err: syscall.EPIPE}, true},
		{"connection reset", fmt.Errorf("x: %w", syscall.ECONNRESET), true},
		{"cut short", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true},
		{"closed by pgx", pgconn.ErrConnClosed, true},
		{"no connection slot", &pgconn.PgError{Code: "53300"}, true},
		{"protocol violation (a client bug)", &pgconn.PgError{Code: "08P01"}, false},
		{"caller's deadline", context.DeadlineExceeded, false},
		{"caller's deadline, wrapped", fmt.Errorf("read: %w", context.DeadlineExceeded), false},
		{"caller hung up", context.Canceled, false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, false},
		{"query canceled", &pgconn.PgError{Code: "57014"}, false},
		{"a bug", errors.New("scan: wrong number of columns"), false},
		{"nil", nil, false},
	} {
		if got := postgres.Unreachable(tc.err); got != tc.want {
			t.Errorf("Unreachable(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// What pgx returns when the server is not there, and when the server ends
// the session under a pool's feet, is read as unreachable.
func TestUnreachableOnRealFailures(t *testing.T) {
	ctx := context.Background()
	nobody := "postgres://postgres@" + testenv.RefusingAddr(t) + "/postgres?connect_timeout=2"
	conn, err := pgconn.Connect(ctx, nobody)
	if err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a closed port")
	}
	if !postgres.Unreachable(err) {
		t.Errorf("Unreachable(connect to a closed port: %v) = false, want true", err)
	}

	// The server answered the connection: the database does not exist. A
	// configuration error, not an outage.
	unknown := testenv.PostgresURL(t) + " dbname=no_such_database"
	if conn, err := pgconn.Connect(ctx, unknown); err == nil {
		conn.Close(ctx)
		t.Error("connected to a database that does not exist")
	} else if postgres.Unreachable(err) {
		t.Errorf("Unreachable(connect to an unknown database: %v) = true, want false", err)
	}

	pool := testenv.Postgres(t)
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var pid uint32 = c.Conn().PgConn().PID()
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "SELECT 1")
	if err == nil || !postgres.Unreachable(err) {
		t.Errorf("Unreachable(statement on a terminated session: %v) = false, want true", err)
	}
	if _, err := pool.Exec(ctx, "SELECT 1/0"); err == nil || postgres.Unreachable(err) {
		t.Errorf("Unreachable(division by zero: %v) = true, want false", err)
	}
}
