package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

// Behind a PgBouncer whose one server connection is held, a connection
// queued for it does not hold up Close past its bound, while the pool's
// idle connection is closed before Close returns. pool.Close waited 15 s
// for a statement cancelled in the queue, and for a liveness ping still
// queued after a cancel (a Ctrl-C) until the server connection came free,
// a minute at most, then 15 s more.
func TestCloseDoesNotWaitForConnectionsQueuedInAPooler(t *testing.T) {
	for _, tc := range []struct {
		name  string
		queue func(t *testing.T, pool *pgxpool.Pool, conn *pgxpool.Conn)
	}{
		{"a statement cancelled in the queue", func(t *testing.T, _ *pgxpool.Pool, conn *pgxpool.Conn) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
				t.Fatal("Exec with no server connection free succeeded")
			}
			conn.Release()
		}},
		{"a liveness ping in the queue after a cancel", func(t *testing.T, pool *pgxpool.Pool, conn *pgxpool.Conn) {
			conn.Release()
			time.Sleep(1100 * time.Millisecond) // pgxpool pings a connection idle for over a second
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			if _, err := pool.Exec(ctx, "SELECT 1"); err == nil {
				t.Fatal("Exec with no server connection free succeeded")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, queued, idle := poolBehindABusyPooler(t)
			tc.queue(t, pool, queued)
			took, returned := timeClose(pool, 5*time.Second)
			if !returned || took > postgres.CloseWait+time.Second {
				t.Fatalf("Close with a connection queued in the pooler took %s (returned: %t), want about %s at most",
					took.Round(10*time.Millisecond), returned, postgres.CloseWait)
			}
			select {
			case <-idle.PgConn().CleanupDone():
			default:
				t.Error("Close returned before the pool's idle connection was closed")
			}
		})
	}
}

// poolBehindABusyPooler opens a pool through a PgBouncer of one server
// connection with two connections of its own, and then holds that server
// connection for the test's length. It returns the pool, one connection
// acquired and the other, released (idle, unless the pool hands it out).
func poolBehindABusyPooler(t *testing.T) (*pgxpool.Pool, *pgxpool.Conn, *pgx.Conn) {
	t.Helper()
	pooled := testenv.PgBouncer(t, testenv.PostgresURL(t), "transaction", "default_pool_size = 1",
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings) + " default_query_exec_mode=exec"
	ctx := context.Background()
	pool, err := postgres.Open(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	queued, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idle := other.Conn()
	other.Release()
	testenv.InTransaction(t, testenv.Pool(t, pooled), "SELECT 1") // the one server connection
	return pool, queued, idle
}

// timeClose runs postgres.Close on pool and returns how long it took, or
// limit and false when it had not returned by then.
func timeClose(pool *pgxpool.Pool, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		postgres.Close(pool)
		close(closed)
	}()
	select {
	case <-closed:
		return time.Since(start), true
	case <-time.After(limit):
		return limit, false
	}
}
