package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgxpool's Acquire opens a new connection when none is idle and the pool
// is under its MaxConns, and fails when that connect fails. With
// PostgreSQL out of connection slots (max_connections taken by other
// clients, as when a rollout or an autoscaler adds reader pods, or a
// CONNECTION LIMIT of the role or the database reached), every call that
// found the pool's connections busy failed 503 unavailable, though they
// came free a millisecond later. Acquire waits for them instead. A pool at
// its MaxConns asks for no new connection: its calls wait in pgxpool's
// own queue, as they always did.

// NoSlotLeft reports whether err is a new session refused for want of a
// connection slot, which Acquire waits out on the pool's own connections: PostgreSQL's 53300 (max_connections, its reserved
// slots, or a CONNECTION LIMIT of the role or the database), or a pooler
// in front of it (poolerError) that passes that refusal on or quotes it,
// or refuses the client for its own max_client_conn. A session refused
// for any other reason (a password, a role, a database: SessionRefused)
// is not waited for: no connection coming free mends it, and the call
// fails at once, as before.
func NoSlotLeft(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	if pgErr.Code == "53300" {
		return true
	}
	if !poolerError(pgErr) {
		return false
	}
	for _, words := range noSlotWords {
		if strings.Contains(pgErr.Message, words) {
			return true
		}
	}
	return false
}

// noSlotWords are the words of a pooler's refusal for want of a slot:
// PostgreSQL's two messages for 53300 (notThereYet has them too), and
// PgBouncer's own when max_client_conn clients are connected to it
// ("no more connections allowed (max_client_conn)").
var noSlotWords = []string{
	"sorry, too many clients already",
	"remaining connection slots are reserved",
	"no more connections allowed",
}

// waitForOwnConnection is Acquire's answer to a new connection refused
// for want of a slot (refused): it waits, until ctx ends, for one of the
// connections pool holds to come free, and takes it. It asks PostgreSQL
// for no session meanwhile: it tries the pool again only once pool.Stat
// shows an idle connection (each refused session costs the server a
// backend's start and a FATAL line in its log), as schema's poolServes
// does. Another call may take that connection first; the pool then asks
// for a session, refused again, and the wait goes on. A pool that holds
// no connection at all, or none any more, has nothing to wait for: the
// call fails with the refusal, as before, without waiting (the pool's
// first connection is tried once more if the pool's last ended during
// the wait). The wait ends with ctx's error joined to the refusal, so
// that the line of a call that timed out says why it waited. No statement
// of the call is sent meanwhile. pgxpool's own AfterRelease hook does not
// serve to wake the wait: it runs each release of every call in a
// goroutine of its own, and before the connection is back among the idle.
func waitForOwnConnection(ctx context.Context, pool *pgxpool.Pool, refused error) (*pgxpool.Conn, error) {
	if !holdsConnection(pool.Stat()) {
		return nil, refused
	}
	counts := countsOf(pool)
	counts.waits.Add(1)
	defer counts.waited(time.Now())
	delay := slotWaitFirst
	for {
		if err := waitForIdle(ctx, pool, &delay); err != nil {
			return nil, fmt.Errorf("%w (PostgreSQL refused the pool a new connection, and none of its own came free: %w)", err, refused)
		}
		conn, err := pool.Acquire(ctx)
		if err == nil || !NoSlotLeft(err) || !holdsConnection(pool.Stat()) {
			return conn, err
		}
		refused = err
	}
}

// slotWaitFirst and slotWaitLongest bound the pauses between
// waitForIdle's looks at the pool, doubling from the first: a call holds
// its connection a millisecond or so, and a wait of a few milliseconds
// costs a call little while it costs the pool's lock nothing worth
// counting.
const (
	slotWaitFirst   = time.Millisecond
	slotWaitLongest = 10 * time.Millisecond
)

// waitForIdle waits until pool has an idle connection or no connection at
// all, looking after each pause (delay, which it doubles up to
// slotWaitLongest), or returns ctx's error when ctx ends first.
func waitForIdle(ctx context.Context, pool *pgxpool.Pool, delay *time.Duration) error {
	timer := time.NewTimer(*delay)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		if stat := pool.Stat(); stat.IdleConns() > 0 || !holdsConnection(stat) {
			return nil
		}
		*delay = min(2**delay, slotWaitLongest)
		timer.Reset(*delay)
	}
}

// holdsConnection reports whether the pool of stat holds a connection,
// idle or in use: one being opened is not counted, as it is most likely
// refused too.
func holdsConnection(stat *pgxpool.Stat) bool {
	return stat.IdleConns()+stat.AcquiredConns() > 0
}

// tracer is the tracer of a pool this package opens: otelpgx's, whose
// methods it has, and the pool's counts of waits for want of a slot,
// which pgxpool's Stat does not keep. The tracer is the one object of its
// own that pgxpool keeps for each pool and hands back
// (pool.Config().ConnConfig.Tracer), so the counts live and end with
// their pool, in no table of the package's. OpenSide's pool, which copies
// its service pool's configuration, shares them; nothing takes its
// connection through Acquire.
type tracer struct {
	*otelpgx.Tracer
	slotWaits slotWaits
}

// slotWaits counts the calls of Acquire that waited for one of their
// pool's connections after PostgreSQL refused a new one (waitForOwnConnection),
// and their time waiting, in nanoseconds.
type slotWaits struct {
	waits, nanos atomic.Int64
}

// waited adds the time since started to the time waiting.
func (s *slotWaits) waited(started time.Time) { s.nanos.Add(int64(time.Since(started))) }

// countsOf is pool's slotWaits: its tracer's, or, for a pool not opened
// by this package (a test's), counts of its own that nobody reads.
func countsOf(pool *pgxpool.Pool) *slotWaits {
	if t, ok := pool.Config().ConnConfig.Tracer.(*tracer); ok {
		return &t.slotWaits
	}
	return &slotWaits{}
}

// SlotWaits reports how many calls of Acquire on pool were refused a new
// connection for want of a slot on the server and waited for one of the
// pool's own instead (counted when the wait starts), and how long they
// waited in all (counted when it ends): how often the pool could not grow
// when its load asked it to. Both are 0 for a pool this package did not
// open.
func SlotWaits(pool *pgxpool.Pool) (waits int64, waited time.Duration) {
	counts := countsOf(pool)
	return counts.waits.Load(), time.Duration(counts.nanos.Load())
}
