package postgres

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Close closes pool as a binary stops: its idle connections are closed
// cleanly (a Terminate, then the socket), as pool.Close closes them, but
// it waits CloseWait at most for the others. pool.Close waits for every
// connection to close, and behind PgBouncer with every server connection
// in use two of them took long:
//   - a statement cancelled while it was queued for a server connection
//     (a call's deadline, the drain's end): pgx sends a cancel request,
//     which PgBouncer drops ("cancel request for idle client"), then a
//     Terminate, and reads the connection until the other end closes it,
//     for up to 15 s; PgBouncer reads nothing from a client it queues;
//   - pgxpool's liveness ping of a connection idle for over a second, sent
//     as a connection is handed out: it runs on the caller's context
//     without its cancel (a Ctrl-C), its deadline only, so without one it
//     waits for the queue up to a minute, then the 15 s above.
//
// Measured on the binaries, a call queued: export-reader and sales-writer
// exited 14.7-14.8 s after their "stopped" line with pool.Close, 1.1 s
// with Close; the gateway (a key lookup queued) 16.2 s after SIGTERM,
// 1.8 s; exportctl, Ctrl-C while its query waited after a prompt, 75 s,
// 0.5 s. What is still open as the process exits the kernel closes:
// PgBouncer drops a queued client, which PostgreSQL never saw.
func Close(pool *pgxpool.Pool) {
	closed := make(chan struct{})
	go func() {
		pool.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(CloseWait):
	}
}

// CloseWait bounds Close's wait, counted in each binary's stop (a
// service closes two pools, its own and OpenSide's). Closing an idle
// connection takes no round trip, and a statement cancelled on
// PostgreSQL itself ends in milliseconds: the bound is reached by
// connections a pooler still queues, or one still in use (a call past
// the drain), which the process's exit then cuts.
const CloseWait = 500 * time.Millisecond

// closeUnwaited closes a pool whose check failed without waiting for it.
// The check's connection may be one a pooler still queues (every server
// connection of PgBouncer's in use), which pool.Close waits for (Close).
// exportctl started during another run's migration behind a transaction
// pool of 2 failed `ping: timeout` after 25 s, not 10, and Ctrl-C ended it
// after 15 s.
func closeUnwaited(pool *pgxpool.Pool) { go pool.Close() }
