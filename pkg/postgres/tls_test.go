package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

// A pool's sessions over TLS, as a production database asks, work on the
// sockets read and written with raw system calls (rawio, under pgx's TLS):
// the session is encrypted and its certificate checked (verify-full), an
// answer of many TLS records and socket reads arrives whole, a batch (how
// a sale is sent) returns each statement's row, a statement whose context
// ends is cut (pgconn's deadline, through tls.Conn, on the raw socket's
// wait in the poller), and a cancel request (how a commit group is
// cancelled: pgconn sends it over TLS too, on a connection of its own,
// dialled as the pool's) cancels the statement it aims at. The pool serves
// on after each. The shared cluster takes no TCP logins, so nothing else
// tests this path.
func TestSessionsOverTLSWorkOnRawSockets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := postgres.Open(ctx, testenv.TLSCluster(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var encrypted bool
	if err := pool.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&encrypted); err != nil || !encrypted {
		t.Fatalf("the session's TLS = %v, %v; want an encrypted session", encrypted, err)
	}

	// 4 MB in 2,000 rows of 2,000 bytes each: a sync's 40 pages.
	var rows, bytes int
	if err := pool.QueryRow(ctx, "SELECT count(*), sum(length(doc)) FROM (SELECT repeat(md5(i::text), 62) || 'abcdefghijklmnop' AS doc FROM generate_series(1, 2000) i) d").Scan(&rows, &bytes); err != nil {
		t.Fatal(err)
	}
	got, err := largeAnswer(ctx, pool)
	if err != nil || got != bytes || rows != 2000 || bytes != 4_000_000 {
		t.Fatalf("a 4 MB answer over TLS: %d bytes read, %v; want %d in %d rows (4,000,000)", got, err, bytes, rows)
	}

	batch := &pgx.Batch{}
	sums := make([]int, 3)
	for i := range sums {
		batch.Queue("SELECT $1::int + 1", i).QueryRow(func(r pgx.Row) error { return r.Scan(&sums[i]) })
	}
	if err := pool.SendBatch(ctx, batch).Close(); err != nil || sums[0] != 1 || sums[1] != 2 || sums[2] != 3 {
		t.Fatalf("a batch over TLS = %v, %v; want [1 2 3]", sums, err)
	}

	cut, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = pool.Exec(cut, "SELECT pg_sleep(30)")
	if !errors.Is(err, context.DeadlineExceeded) && !postgres.QueryCanceled(err) {
		t.Fatalf("a statement whose context ended = %v; want it cancelled", err)
	}
	wantServing(t, pool)

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	slept := make(chan error, 1)
	go func() { _, err := conn.Exec(ctx, "SELECT pg_sleep(30) /* to cancel */"); slept <- err }()
	testenv.WaitUntilTrue(t, pool, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%/* to cancel */%' AND pid <> pg_backend_pid())")
	if err := conn.Conn().PgConn().CancelRequest(ctx); err != nil {
		t.Fatalf("a cancel request over TLS: %v", err)
	}
	select {
	case err := <-slept:
		if !postgres.QueryCanceled(err) {
			t.Fatalf("a statement sent a cancel request = %v; want it cancelled (57014)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a statement sent a cancel request still runs after 20 s")
	}
	wantServing(t, pool)
}

// wantServing fails the test unless pool answers a statement.
func wantServing(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var one int
	if err := pool.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the pool = %d, %v; want it serving", one, err)
	}
}

// largeAnswer reads the 2,000 rows of the test's large answer and returns
// the bytes they held.
func largeAnswer(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	rows, err := pool.Query(ctx, "SELECT repeat(md5(i::text), 62) || 'abcdefghijklmnop' FROM generate_series(1, 2000) i")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var doc []byte
		if err := rows.Scan(&doc); err != nil {
			return n, err
		}
		n += len(doc)
	}
	return n, rows.Err()
}
