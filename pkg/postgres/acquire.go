package postgres

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AcquireError is a pool's failure to give a connection: every one in
// use until the caller's deadline or hang-up (the pool at its size, or
// refused a new one for want of a slot: the error then holds that
// refusal too), or a new one that could not be opened. No statement of the caller's was sent (NothingSent). pgxpool
// returns a bare context error for a wait that ran out, the same error a
// statement cut off by the deadline ends in, after which it may have been
// done.
type AcquireError struct{ Err error }

func (e *AcquireError) Error() string { return "waiting for a pool connection: " + e.Err.Error() }
func (e *AcquireError) Unwrap() error { return e.Err }

// Acquire is pool.Acquire whose error is an AcquireError, and which, when
// PostgreSQL refuses the pool a new connection for want of a slot
// (NoSlotLeft), waits for one of the connections the pool holds
// (waitForOwnConnection) rather than failing, in the pool's line of calls
// waiting so, first come first served: while that line holds a call and
// the pool is held below its size, a call of the pool joins it at the
// back. A connection it gives under a context of TrackSent's marks that
// call's Sent.
func Acquire(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	return acquire(ctx, pool, true)
}

// AcquireUnlessNoSlot is Acquire without its wait for want of a slot:
// refused a new connection for want of one (NoSlotLeft), or finding calls
// of the pool waiting in line for one while the pool is held below its
// size, it fails at once with that refusal, an AcquireError. It is for a
// call no request waits on alone (a read ahead of its request, which
// reads the page itself when the read fails): waiting, it would take
// turns with the requests on the few connections a pool that cannot grow
// holds.
func AcquireUnlessNoSlot(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	return acquire(ctx, pool, false)
}

func acquire(ctx context.Context, pool *pgxpool.Pool, waitForSlot bool) (*pgxpool.Conn, error) {
	conn, err := acquireInTurn(ctx, pool, waitForSlot)
	if err != nil {
		return nil, &AcquireError{Err: err}
	}
	MarkSent(ctx)
	return conn, nil
}

// MarkSent marks the Sent of ctx's call (TrackSent), if it has one: for a
// statement of the call sent on a connection acquired under another
// context (the sales writer's commit groups send several calls' statements
// on one).
func MarkSent(ctx context.Context) {
	if sent, ok := ctx.Value(sentKey{}).(*Sent); ok {
		sent.maybe.Store(true)
	}
}

// acquireInTurn is pool.Acquire, unless calls of pool wait in its line
// for want of a slot (slotLine) and the pool is held below its size: the
// connections that come free are theirs, first come first served, and the
// call joins the line behind them, or, not to wait for a slot, fails at
// once with the refusal that made them wait. A pool back at its size asks
// PostgreSQL for no session, and the call waits in pgxpool's queue.
// Refused a new connection for want of a slot itself, it joins the line
// too, if it is to wait. A pool left with no connection (its last broken,
// or cut by a deadline mid-statement) has none to come free: a call then
// asks it for a session, as every call of a pool with no connection does,
// and fails if PostgreSQL refuses it. Failing at once
// without asking, 32 callers looping on a pool of one connection met
// 16,000 failures in half a second, while the line's own asks were
// refused behind the session that connection had held.
func acquireInTurn(ctx context.Context, pool *pgxpool.Pool, waitForSlot bool) (*pgxpool.Conn, error) {
	if line := waitingLine(pool); line != nil && heldBelowSize(pool.Stat()) {
		if !waitForSlot {
			return nil, line.refusal()
		}
		return waitForOwnConnection(ctx, pool, line.refusal())
	}
	conn, err := pool.Acquire(ctx)
	if err != nil && waitForSlot && NoSlotLeft(err) {
		return waitForOwnConnection(ctx, pool, err)
	}
	return conn, err
}

// Sent tells whether a call may have sent PostgreSQL a statement, where
// no error says so: a panic of the call has none to read NothingSent
// from. It counts a statement as sent once Acquire (AcquireFunc) has
// given the call a connection, before any statement is written, so it
// errs only towards "may have been": a call that reaches PostgreSQL
// otherwise than through Acquire (a query straight on the pool) is not
// seen, and must not be made under it.
type Sent struct{ maybe atomic.Bool }

type sentKey struct{}

// TrackSent returns ctx carrying a new Sent, which Acquire marks when it
// gives a connection under ctx or a context derived from it.
func TrackSent(ctx context.Context) (context.Context, *Sent) {
	sent := &Sent{}
	return context.WithValue(ctx, sentKey{}, sent), sent
}

// Nothing reports whether the call has not been given a connection yet:
// none of its statements can have reached PostgreSQL.
func (s *Sent) Nothing() bool { return !s.maybe.Load() }

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
