package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
// came free a millisecond later. Acquire waits for them instead, in a line
// per pool, first come first served (slotLine), which a release of the
// pool's wakes. A pool at its MaxConns asks for no new connection: its
// calls wait in pgxpool's own queue, as they always did.

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
// PostgreSQL's messages for 53300 (notThereYet has them too), and
// PgBouncer's own when max_client_conn clients are connected to it
// ("no more connections allowed (max_client_conn)").
var noSlotWords = []string{
	"sorry, too many clients already",
	"remaining connection slots are reserved",
	"too many connections for ",
	"no more connections allowed",
}

// waitForOwnConnection is Acquire's answer to a new connection refused
// for want of a slot (refused), and to a call that finds calls of its
// pool already waiting so: it joins the pool's line of waiting calls
// (slotLine), first come first served, and waits until ctx ends for its
// turn and then for one of the connections pool holds to come free, and
// takes it. A pool that holds no connection at all has nothing to wait
// for: the call fails with the refusal, as before, without waiting. The
// wait ends with ctx's error joined to the refusal, so that the line of a
// call that timed out says why it waited. No statement of the call is
// sent meanwhile.
func waitForOwnConnection(ctx context.Context, pool *pgxpool.Pool, refused error) (*pgxpool.Conn, error) {
	if !holdsConnection(pool.Stat()) {
		return nil, refused
	}
	line := lineOf(pool)
	turn := line.join(refused)
	defer line.leave(turn, time.Now())
	conn, err := waitInLine(ctx, pool, line, turn)
	if ended := ctx.Err(); ended != nil && errors.Is(err, ended) {
		return nil, fmt.Errorf("%w (PostgreSQL refused the pool a new connection, and none of its own came free: %w)", ended, line.refusal())
	}
	return conn, err
}

// waitInLine waits for turn, then, at the head of line, takes one of
// pool's connections as it comes free (headOfLine).
func waitInLine(ctx context.Context, pool *pgxpool.Pool, line *slotLine, turn <-chan struct{}) (*pgxpool.Conn, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-turn:
	}
	return headOfLine(ctx, pool, line)
}

// headOfLine is the wait of the call at the head of line: the one call of
// the pool that takes a connection while calls wait, so that each is
// served in its turn. It looks at the pool whenever one of its
// connections is given back (the release wakes it, slotLine.released) and
// otherwise every slotLookFirst to slotLookLongest, and takes a connection
// from the pool only once pool.Stat shows one idle: it asks PostgreSQL for
// no session then (each refused session costs the server a backend's
// start and a FATAL line in its log). The pool grows back meanwhile by the
// line's probes (slotLine.probe); once back at its size, it asks for no
// session either, and the head waits in pgxpool's own queue. A pool left
// with no connection (its last ended meanwhile) is asked for its first
// once more, and the call fails if PostgreSQL refuses it too.
func headOfLine(ctx context.Context, pool *pgxpool.Pool, line *slotLine) (*pgxpool.Conn, error) {
	look := slotLookFirst
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-line.released:
			look = slotLookFirst
		case <-timer.C:
		}
		line.looks.Add(1)
		stat := pool.Stat()
		if stat.IdleConns() > 0 || !heldBelowSize(stat) {
			// A connection idle may still be taken by a query straight on
			// the pool, not in line, and the pool then asks PostgreSQL for
			// a session: the wait goes on if refused. A pool back at its
			// size asks for none: the head waits in pgxpool's own queue,
			// first come first served, with the calls that come meanwhile.
			conn, err := pool.Acquire(ctx)
			if err == nil || !NoSlotLeft(err) || !holdsConnection(pool.Stat()) {
				return conn, err
			}
			line.refusedAgain(err)
		}
		timer.Reset(min(look, line.probeWhenDue(pool, stat)))
		look = min(2*look, slotLookLongest)
	}
}

// slotLookFirst and slotLookLongest bound the pauses between the head of
// the line's looks at the pool when no release woke it, doubling from
// the first after each look: a release wakes it at once, so the looks
// catch only what no release announces, a connection given back just
// after the release woke it, or one that pgxpool's health check or an
// abandoned connect puts among the idle.
const (
	slotLookFirst   = time.Millisecond
	slotLookLongest = 10 * time.Millisecond
)

// slotProbeFirst and slotProbeLongest bound the pauses between a line's
// probes for a new connection, doubling from the first while PostgreSQL
// refuses them: a second at most, and one refused session a second per
// pool, between a slot freeing and the pool growing into it while its
// calls keep waiting. slotProbeTimeout bounds a probe's connect.
const (
	slotProbeFirst   = 50 * time.Millisecond
	slotProbeLongest = time.Second
	slotProbeTimeout = 10 * time.Second
)

// holdsConnection reports whether the pool of stat holds a connection,
// idle or in use: one being opened is not counted, as it is most likely
// refused too.
func holdsConnection(stat *pgxpool.Stat) bool {
	return stat.IdleConns()+stat.AcquiredConns() > 0
}

// heldBelowSize reports whether the pool of stat holds a connection, and
// fewer than its size: a pool whose line serves its calls in turn on the
// connections it holds while PostgreSQL refuses it more. A pool at its
// size asks PostgreSQL for no session, and pgxpool's own queue serves its
// calls first come first served.
func heldBelowSize(stat *pgxpool.Stat) bool {
	held := stat.IdleConns() + stat.AcquiredConns()
	return held > 0 && held < stat.MaxConns()
}

// slotLine is a pool's line of calls waiting for one of its connections
// because PostgreSQL refused the pool a new one for want of a slot, first
// come first served: while it holds a call, and the pool is held below its
// size, a new call of the pool joins it at the back (acquire) rather than
// take a connection ahead of it, and only the call at its head takes one.
// Once the pool is back at its size, new calls wait in pgxpool's own
// queue, where the calls of the line join them, each at its turn, so that
// the line ends though the load keeps a call waiting. Its counts of
// waits are SlotWaits'. The zero slotLine is a line that no release wakes, whose
// head looks every slotLookLongest at most (a pool this package did not
// open).
type slotLine struct {
	// waiting is the number of calls in the line, read without the lock
	// on each acquire and each release of the pool.
	waiting atomic.Int64
	// released wakes the head of the line when one of the pool's
	// connections is given back (tracer.TraceRelease).
	released chan struct{}

	mu         sync.Mutex
	turns      []chan struct{} // of the calls in line, first come first; each closed when its call heads the line
	refused    error           // the latest refusal for want of a slot, which the waits' errors hold
	probing    bool            // a probe is asking the pool for a new connection
	probeDelay time.Duration
	probeAt    time.Time // when the next probe is due

	waits, nanos atomic.Int64 // SlotWaits'
	looks        atomic.Int64 // the heads' looks at the pool (headOfLine), which the tests count
}

// newSlotLine is a line woken by its pool's releases.
func newSlotLine() *slotLine {
	return &slotLine{released: make(chan struct{}, 1), probeDelay: slotProbeFirst}
}

// join puts a call at the back of the line and returns the channel closed
// when its turn comes (at once if the line was empty), counting it in
// SlotWaits. refused, if not nil, is the refusal that made it wait.
func (l *slotLine) join(refused error) <-chan struct{} {
	turn := make(chan struct{})
	l.mu.Lock()
	defer l.mu.Unlock()
	if refused != nil {
		l.refused = refused
	}
	if len(l.turns) == 0 {
		close(turn)
		// The pause after the last probe holds: a line that forms again
		// and again while PostgreSQL refuses its probes probes once a
		// second at most.
		l.probeDelay = max(l.probeDelay, slotProbeFirst)
		l.probeAt = time.Now().Add(l.probeDelay)
	}
	l.turns = append(l.turns, turn)
	l.waits.Add(1)
	l.waiting.Add(1)
	callsInLines.Add(1)
	return turn
}

// leave takes the call of turn out of the line, served or not, passing
// the head to the next call, and adds its time since started to SlotWaits.
// A connection its call did not take stays in the pool, where the next
// head takes it.
func (l *slotLine) leave(turn <-chan struct{}, started time.Time) {
	l.nanos.Add(int64(time.Since(started)))
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.IndexFunc(l.turns, func(t chan struct{}) bool { return t == turn })
	l.turns = slices.Delete(l.turns, i, i+1)
	l.waiting.Add(-1)
	callsInLines.Add(-1)
	if i == 0 && len(l.turns) > 0 {
		close(l.turns[0])
	}
}

// connectionReleased wakes the head of the line, if a call waits, as one
// of the pool's connections is being given back.
func (l *slotLine) connectionReleased() {
	if l.waiting.Load() == 0 {
		return
	}
	select {
	case l.released <- struct{}{}:
	default: // the head is woken already
	}
}

// refusal is the latest refusal for want of a slot of the line's pool.
func (l *slotLine) refusal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

// probeWhenDue starts the line's probe (probe) if one is due, none is
// under way and the pool, of stat, is under its size, and returns the
// time until the next one is due: slotLookLongest while one is under way
// or the pool is at its size, when none can start (the head's looks, not
// this pause, then see the pool change).
func (l *slotLine) probeWhenDue(pool *pgxpool.Pool, stat *pgxpool.Stat) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.probing || stat.TotalConns() >= stat.MaxConns() {
		return slotLookLongest
	}
	if due := time.Until(l.probeAt); due > 0 {
		return due
	}
	l.probing = true
	go l.probe(pool)
	return slotLookLongest
}

// probe asks pool for a new connection while the line's calls wait for
// one of its own, and gives the connection back to the pool, where the
// head of the line takes it: PostgreSQL refuses it while it has no slot,
// and the probe tells when it has one again, so that the pool grows back
// into it though its calls wait in line and ask for none. It runs apart
// from the head of the line, which takes the connections coming free
// meanwhile: a refused connect takes 10-45 ms on a loaded machine, a
// stall of the whole line. The next probe comes slotProbeFirst after one
// served, and twice the last pause after one refused, up to
// slotProbeLongest.
func (l *slotLine) probe(pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), slotProbeTimeout)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	if err == nil {
		conn.Release()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probing = false
	switch {
	case err == nil:
		l.probeDelay = slotProbeFirst
	case NoSlotLeft(err):
		l.refused = err
		fallthrough
	default:
		l.probeDelay = min(2*l.probeDelay, slotProbeLongest)
	}
	l.probeAt = time.Now().Add(l.probeDelay)
}

// refusedAgain records a refusal for want of a slot met by the head of
// the line.
func (l *slotLine) refusedAgain(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused = err
}

// tracer is the tracer of a pool this package opens: otelpgx's, whose
// methods it has, and the pool's line of calls waiting for want of a slot
// (slotLine), which its releases wake and which keeps the counts of
// SlotWaits, which pgxpool's Stat does not keep. The tracer is the one
// object of its own that pgxpool keeps for each pool and hands back
// (pool.Config().ConnConfig.Tracer), so the line lives and ends with its
// pool, in no table of the package's.
type tracer struct {
	*otelpgx.Tracer
	line *slotLine
}

// newTracer is the tracer of a new pool, with a line of its own.
func newTracer() *tracer {
	// No span per pool acquire: it cost the sales writer 6 % of its CPU
	// (a span and connection attributes for every statement), and a wait
	// for a connection still shows, as the gap before the statement's span
	// in a trace and in pgxpool_acquire_wait_seconds_total and
	// pgxpool_empty_acquire_total on /metrics.
	return &tracer{Tracer: otelpgx.NewTracer(otelpgx.WithDisableAcquireTracer()), line: newSlotLine()}
}

// TraceRelease is pgxpool's call at the start of each release of one of
// the pool's connections, in the caller's goroutine: it wakes the head of
// the pool's line, if a call waits there. pgxpool's AfterRelease hook
// would not serve: it runs each release in a goroutine of its own, which
// every release of the pool would then cost. The connection is put back
// among the idle a moment after this call (or closed, if broken), which
// the head of the line most often runs after; when it looks first, it
// looks again a millisecond later.
func (t *tracer) TraceRelease(*pgxpool.Pool, pgxpool.TraceReleaseData) {
	t.line.connectionReleased()
}

// lineOf is pool's line of calls waiting for want of a slot: its
// tracer's, or, for a pool not opened by this package (a test's), a line
// of the call's own, which no other call joins and no release wakes.
func lineOf(pool *pgxpool.Pool) *slotLine {
	if t, ok := pool.Config().ConnConfig.Tracer.(*tracer); ok {
		return t.line
	}
	return &slotLine{}
}

// waitingLine is pool's line if calls wait in it, else nil. It looks the
// line up (a copy of the pool's configuration, pool.Config) only while
// some call of the process waits in a line (callsInLines), so that an
// acquire costs an atomic load more, and no allocation, while PostgreSQL
// has slots to give.
func waitingLine(pool *pgxpool.Pool) *slotLine {
	if callsInLines.Load() == 0 {
		return nil
	}
	if line := lineOf(pool); line.waiting.Load() > 0 {
		return line
	}
	return nil
}

// callsInLines counts the calls waiting in the lines of every pool of the
// process: a process holds one or two pools, so a count per process costs
// a pool whose line is empty only the look-up while another's is not.
var callsInLines atomic.Int64

// SlotWaits reports how many calls of Acquire on pool waited for one of
// the pool's connections because PostgreSQL refused the pool a new one
// for want of a slot, refused themselves or behind calls that were
// (counted when the wait starts), and how long they waited in all
// (counted when it ends): how often the pool could not grow when its load
// asked it to. Both are 0 for a pool this package did not open.
func SlotWaits(pool *pgxpool.Pool) (waits int64, waited time.Duration) {
	line := lineOf(pool)
	return line.waits.Load(), time.Duration(line.nanos.Load())
}
