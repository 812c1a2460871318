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
	"github.com/jackc/pgx/v5/pgxpool"
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

// Every SQLSTATE a production PostgreSQL sends for work it cannot do now
// is Unavailable (the services' 503 with Retry-After), and what no retry
// mends is not (their 500, or a refusal the caller gets).
func TestUnavailableClassifiesErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection failure (unreachable)", &pgconn.PgError{Code: "08006"}, true},
		{"connection refused (unreachable)", fmt.Errorf("x: %w", syscall.ECONNREFUSED), true},
		{"recovery conflict: snapshot, lock, tablespace", fmt.Errorf("read: %w", &pgconn.PgError{Code: "40001", Message: "canceling statement due to conflict with recovery"}), true},
		{"recovery conflict: buffer pin deadlock; deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"read-only transaction (a standby, a fenced primary)", &pgconn.PgError{Code: "25006"}, true},
		{"insufficient resources", &pgconn.PgError{Code: "53000"}, true},
		{"disk full", &pgconn.PgError{Code: "53100"}, true},
		{"out of memory", &pgconn.PgError{Code: "53200"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"configuration limit exceeded", &pgconn.PgError{Code: "53400"}, true},
		{"lock_timeout", &pgconn.PgError{Code: "55P03"}, true},
		{"operator intervention", &pgconn.PgError{Code: "57000"}, true},
		{"query canceled", &pgconn.PgError{Code: "57014"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"database dropped (a standby's database conflict)", &pgconn.PgError{Code: "57P04"}, true},
		{"idle session timeout", &pgconn.PgError{Code: "57P05"}, true},
		{"protocol violation (a client bug)", &pgconn.PgError{Code: "08P01"}, false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"deferred constraint at commit", &pgconn.PgError{Code: "40002"}, false},
		{"in failed transaction (a bug)", &pgconn.PgError{Code: "25P02"}, false},
		{"object in use", &pgconn.PgError{Code: "55006"}, false},
		{"undefined column (a schema behind)", &pgconn.PgError{Code: "42703"}, false},
		{"I/O error", &pgconn.PgError{Code: "58030"}, false},
		{"data corrupted", &pgconn.PgError{Code: "XX001"}, false},
		{"caller's deadline", context.DeadlineExceeded, false},
		{"caller hung up", context.Canceled, false},
		{"a bug", errors.New("scan: wrong number of columns"), false},
		{"nil", nil, false},
	} {
		if got := postgres.Unavailable(tc.err); got != tc.want {
			t.Errorf("Unavailable(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// What a real server answers a write on a read-only session, a statement
// and a statement behind another session's lock past lock_timeout or
// statement_timeout, is Unavailable.
func TestUnavailableOnRealRefusals(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	readOnly, err := pgconn.Connect(ctx, url+" default_transaction_read_only=on")
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close(ctx)
	_, err = readOnly.Exec(ctx, "INSERT INTO t VALUES (1)").ReadAll()
	if !postgres.Unavailable(err) {
		t.Errorf("Unavailable(insert on a read-only session: %v) = false, want true", err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE t IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	for _, setting := range []string{"lock_timeout=50", "statement_timeout=50"} {
		blocked, err := pgconn.Connect(ctx, url+" "+setting)
		if err != nil {
			t.Fatal(err)
		}
		_, err = blocked.Exec(ctx, "SELECT * FROM t").ReadAll()
		blocked.Close(ctx)
		if !postgres.Unavailable(err) {
			t.Errorf("Unavailable(read behind a lock with %s: %v) = false, want true", setting, err)
		}
	}
}
