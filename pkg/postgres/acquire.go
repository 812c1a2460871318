package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AcquireError is a pool's failure to give a connection: every one in
// use until the caller's deadline or hang-up, or a new one that could not
// be opened. No statement of the caller's was sent (NothingSent). pgxpool
// returns a bare context error for a wait that ran out, the same error a
// statement cut off by the deadline ends in, after which it may have been
// done.
type AcquireError struct{ Err error }

func (e *AcquireError) Error() string { return "waiting for a pool connection: " + e.Err.Error() }
func (e *AcquireError) Unwrap() error { return e.Err }

// Acquire is pool.Acquire whose error is an AcquireError.
func Acquire(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, &AcquireError{Err: err}
	}
	return conn, nil
}

// AcquireFunc is pool.AcquireFunc whose failure to get a connection is an
// AcquireError: f runs on a connection of pool, given back when f returns.
func AcquireFunc(ctx context.Context, pool *pgxpool.Pool, f func(*pgxpool.Conn) error) error {
	conn, err := Acquire(ctx, pool)
	if err != nil {
		return err
	}
	defer conn.Release()
	return f(conn)
}

// acquireFailed reports whether err is Acquire's.
func acquireFailed(err error) bool {
	var acquireErr *AcquireError
	return errors.As(err, &acquireErr)
}
