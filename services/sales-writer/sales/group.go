package sales

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Sale calls that arrive together commit together. Each call's statement
// (confirmSQL or cancelSQL, after its key's lock) is one transaction of its
// own when it runs alone, and every commit waits for PostgreSQL to flush the
// WAL to disk: under load the sales path waited on those flushes more than
// it worked (BENCHMARKS.md, "Profiles": 0.8 ms a flush, 3 commits a flush,
// the writer's connections mostly waiting on WALWrite). A commit group runs
// the statements of the calls waiting at that moment, each after its own
// key lock, in one transaction and one round trip, and commits them with
// one flush.
//
// What a call sees does not change: its statements run in the order of the
// group, each with a snapshot taken after its key lock, seeing what the
// calls before it in the group did (READ COMMITTED sees the transaction's
// own changes), as if they had committed one after the other. A call is
// answered only after its group has committed.
//
// A group is all or nothing. When PostgreSQL answers any of its statements
// with an ERROR (a key stored meanwhile by another writer, a deadlock, a
// lock waited on past groupLockTimeout), the whole group is rolled back and
// each of its calls runs again alone, in its own goroutine under its own
// deadline, as calls ran before groups: the error is then its own, and the
// calls that did nothing wrong are not failed by another. A failure that is
// no ERROR (the connection lost, the group's deadline met) may have come
// after the commit, so every call of the group is answered that error, each
// as it would have been alone.
//
// A call alone in the queue is a group of one: it runs at once, and one
// that waits on a lock past groupLockTimeout then runs alone, outside the
// groups, so that the calls arriving meanwhile are not held up behind it.

// maxGroupCalls bounds a group: its statements hold their row and key locks
// until the one commit, so a larger group makes the calls that wait on those
// locks wait longer, and past a few dozen calls one flush a group saves
// nothing more.
const maxGroupCalls = 32

// groupLockTimeout is how long a statement of a group waits for a lock held
// by another transaction (the same item sold by another writer, a key bound
// by a refusal in flight) before the group is rolled back and its calls run
// alone. A call that waits on a lock then waits alone, without the others
// of its group waiting with it. Locks held by sales last a few
// milliseconds; a group's own calls never wait on each other.
const groupLockTimeout = "50ms"

// groupSettingsSQL opens each group of several calls with settings for
// the group's transaction only (set_config's is_local; the batch's
// statements share one implicit transaction, which ends at its Sync, and
// its COMMIT still runs under them): lock_timeout, and client_min_messages
// at warning, so that the WARNING of a COMMIT whose wait for a synchronous
// standby a cancel cut reaches the writer (commitWaitMayBeCut,
// commitWarnings) whatever DATABASE_URL, the role or the database sets;
// at error, PostgreSQL sends none, and the other calls were told their
// sale was done. A call alone sets it in keyLockHearingWarnings.
const groupSettingsSQL = `SELECT set_config('lock_timeout', '` + groupLockTimeout + `', true), ` +
	`set_config('client_min_messages', 'warning', true)`

// DefaultCommitGroups is how many groups a writer runs at once by default
// (SALES_WRITER_COMMIT_GROUPS).
const DefaultCommitGroups = 1

// errRunAlone tells a call that its group was rolled back: it runs alone.
var errRunAlone = errors.New("commit group rolled back")

// rolledBackGroup is errRunAlone with the error PostgreSQL rolled the
// group back for.
type rolledBackGroup struct{ cause error }

func (e *rolledBackGroup) Error() string   { return errRunAlone.Error() + ": " + e.cause.Error() }
func (e *rolledBackGroup) Unwrap() []error { return []error{errRunAlone, e.cause} }

// leaveGrace is how long a call that leaves its group in flight (its
// deadline met, its caller gone) waits for the group to end once it has
// asked PostgreSQL to cancel it, so that its answer can say whether the
// sale was rolled back. Past it, the answer says it may have been applied.
// A cancel request reaches a live server in milliseconds; the grace comes
// out of the 2 s the drain leaves a call past its bound to write its answer
// (httpserver.AnswerWriteMargin), so it stays well under that.
const leaveGrace = 250 * time.Millisecond

// cancelRequestTimeout bounds the cancel request's own connection to the
// server, which may be far, or slow to accept one.
const cancelRequestTimeout = 5 * time.Second

// groupedCall is one call's statement waiting for, or in, a group.
type groupedCall struct {
	ctx    context.Context
	req    Request
	told   *callTold // told of the group's transaction, if PostgreSQL warned during it
	stmt   string
	args   []any
	scan   func(pgx.Row) error
	queued time.Time
	group  *group     // set when a group takes the call
	done   chan error // buffered: the group never waits on a call that left

	// Guarded by the group's mu.
	inBatch bool // its statement went out in the group's batch (inFlightOn)
	left    bool // it left before the batch went out, which then leaves it out
}

// group is one commit group's calls, and what a call leaving it needs: the
// connection its batch is in flight on, to cancel it.
type group struct {
	calls []*groupedCall
	sent  []*groupedCall // the calls its batch holds: those that had not left when it went out

	mu         sync.Mutex
	conn       *pgxpool.Conn // while the batch is in flight
	cancelSent bool          // a cancel request went to the batch's backend
}

// committer gathers calls into groups and runs at most maxGroups at once,
// each on a connection of its own, not counting the groups that have run
// for slowGroup (runWatched): those end on their own. Calls wait in one
// queue, first come first served; a group takes up to maxGroupCalls from
// its head.
type committer struct {
	db        *pgxpool.Pool
	maxGroups int
	stats     GroupStats
	warned    *commitWarnings
	// cancelRequest sends PostgreSQL a cancel request for a connection's
	// statement in flight: (*pgconn.PgConn).CancelRequest, or a test's
	// hook deciding when it arrives.
	cancelRequest func(*pgconn.PgConn, context.Context) error
	// leaveGrace is the grace of leave: the constant leaveGrace, or what
	// a test set (Writer.SetLeaveGrace).
	leaveGrace time.Duration

	mu      sync.Mutex
	queue   []*groupedCall
	running int // groups in flight or being formed
}

// GroupStats is told of every group run (nil hooks are skipped): for the
// writer's metrics.
type GroupStats struct {
	// Ran is told each group's count of calls, once it has ended.
	Ran func(calls int)
	// RolledBack is told of each group of more than one call whose
	// statements PostgreSQL answered with an ERROR; its calls ran alone.
	RolledBack func(calls int)
}

// submit runs stmt for req (as underKeyLock does) in a group with whatever
// other calls are waiting, and returns once the group has committed, or the
// error that settles the call.
func (w *Writer) submit(ctx context.Context, req Request, told *callTold, stmt string, args []any, scan func(pgx.Row) error) error {
	c := w.groups
	if c == nil {
		return w.underKeyLock(ctx, req, told, stmt, args, scan)
	}
	if err := ctx.Err(); err != nil {
		// Ended before it was asked: nothing is sent.
		return &postgres.AcquireError{Err: err}
	}
	call := &groupedCall{ctx: ctx, req: req, told: told, stmt: stmt, args: args, scan: scan, queued: time.Now(), done: make(chan error, 1)}
	c.enqueue(call)
	var err error
	select {
	case err = <-call.done:
	case <-ctx.Done():
		return c.leave(call, ctx.Err())
	}
	var p *groupPanic
	switch {
	case errors.Is(err, errRunAlone):
		return w.underKeyLock(ctx, req, told, stmt, args, scan)
	case errors.As(err, &p):
		panic(p)
	}
	return err
}

// leave ends the wait of a call whose context ended (cause): its deadline
// met, its caller gone. Taken by no group, it is withdrawn: nothing was
// sent, as for a call that waited out its deadline for a pool connection;
// so too in a group not yet sent, which goes on without it. In a group in
// flight, the group is cancelled, as a call alone is when its context
// ends: PostgreSQL rolls the group back unless it has committed already,
// and its other calls run alone. The error says which, when the group
// ends within leaveGrace.
func (c *committer) leave(call *groupedCall, cause error) error {
	g := c.withdraw(call)
	if g == nil || g.cancel(call, c.cancelRequest) {
		return &postgres.AcquireError{Err: cause}
	}
	var err error
	select {
	case err = <-call.done:
	case <-time.After(c.leaveGrace):
		return fmt.Errorf("left its commit group in flight: %w", cause)
	}
	var rolledBack *rolledBackGroup
	switch {
	case err == nil:
		return fmt.Errorf("left its commit group, which committed: %w", cause)
	case errors.As(err, &rolledBack):
		return fmt.Errorf("%w; its commit group was rolled back: %w", cause, rolledBack.cause)
	}
	return fmt.Errorf("%w; its commit group failed: %w", cause, err)
}

// enqueue puts call at the back of the queue and starts a group's runner
// if fewer than maxGroups are running.
func (c *committer) enqueue(call *groupedCall) {
	c.mu.Lock()
	c.queue = append(c.queue, call)
	start := c.running < c.maxGroups
	if start {
		c.running++
	}
	c.mu.Unlock()
	if start {
		go c.runGroups()
	}
}

// withdraw takes call out of the queue and returns nil, or, if a group
// has taken it, returns that group.
func (c *committer) withdraw(call *groupedCall) *group {
	c.mu.Lock()
	defer c.mu.Unlock()
	if call.group != nil {
		return call.group
	}
	i := slices.Index(c.queue, call)
	c.queue = slices.Delete(c.queue, i, i+1)
	return nil
}

// runGroups runs groups from the head of the queue until it is empty.
func (c *committer) runGroups() {
	for {
		g := c.take()
		if g == nil {
			return
		}
		c.runWatched(g)
	}
}

// slowGroup is how long a runner waits for its group before it goes on to
// the next one, leaving the group to end on its own: a call alone in its
// group waits for a lock as long as its own bound lets it (in PostgreSQL's
// line for the lock, first come first served), and the calls arriving
// meanwhile are not held up behind it. A sale commits in a few
// milliseconds.
const slowGroup = 50 * time.Millisecond

// runWatched runs g, and returns when it has ended or has run for
// slowGroup.
func (c *committer) runWatched(g *group) {
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		c.run(g)
	}()
	wait := time.NewTimer(slowGroup)
	defer wait.Stop()
	select {
	case <-ended:
	case <-wait.C:
	}
}

// take removes the next group's calls from the queue, or, with the queue
// empty, ends this runner (nil).
func (c *committer) take() *group {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.running--
		return nil
	}
	n := min(len(c.queue), maxGroupCalls)
	g := &group{calls: slices.Clone(c.queue[:n])}
	for _, call := range g.calls {
		call.group = g
	}
	c.queue = slices.Delete(c.queue, 0, n)
	return g
}

// run runs one group and answers each of its calls.
func (c *committer) run(g *group) {
	defer c.answerPanic(g)
	err := c.commit(g)
	// The stats tell of the calls sent together: a call that left
	// before was not, and a group none of whose calls was sent ran
	// nothing, which PostgreSQL did not roll back.
	together := len(g.sent) > 1
	if together && c.stats.Ran != nil {
		c.stats.Ran(len(g.sent))
	}
	if err != nil && runsAlone(err, len(g.sent)) {
		if together && c.stats.RolledBack != nil {
			c.stats.RolledBack(len(g.sent))
		}
		err = &rolledBackGroup{cause: err}
	}
	leftOut := &rolledBackGroup{cause: errLeftBeforeSent}
	for _, call := range g.calls {
		if len(g.sent) > 0 && !call.inBatch {
			call.done <- leftOut
			continue
		}
		call.done <- err
	}
}

// groupPanic is a panic of a group's goroutine (in a call's scan, in pgx),
// answered to each of its calls, which panics with it in its own goroutine
// (submit): the server answers and logs it there (api's panicAnswer: sent,
// the sale may have been applied; the batch's commit went out with it),
// where a panic up the group's goroutine would end the process and every
// call in flight.
type groupPanic struct {
	value any
	stack []byte
}

func (p *groupPanic) Error() string {
	return fmt.Sprintf("sales: commit group panicked: %v\n%s", p.value, p.stack)
}

// answerPanic answers each call of g the panic of the goroutine running
// it, if any.
func (c *committer) answerPanic(g *group) {
	v := recover()
	if v == nil {
		return
	}
	p := &groupPanic{value: v, stack: debug.Stack()}
	g.landed() // its connection was given back to the pool, which drops one left mid-batch
	for _, call := range g.calls {
		call.done <- p
	}
}

// runsAlone reports whether the calls of a group that failed with err run
// again alone: a group of several calls rolled back by an ERROR cannot
// tell whose statement it was, so each finds out alone. A call alone in
// its group has its own error, which it is answered.
func runsAlone(err error, calls int) bool {
	return errors.Is(err, errLeftBeforeSent) || calls > 1 && postgres.RolledBack(err)
}

// ErrCommitUnconfirmed answers every call of a group that a cancel request
// was sent to (a call left it in flight) whose batch then ended without an
// ERROR but with a WARNING. PostgreSQL answers a cancel that comes while a
// COMMIT waits for a synchronous standby so, and the transaction,
// committed locally, may not be on the standby: a failover could lose it.
// So no call is told its sale is done; each may have been applied (its
// key's retry settles it), as a call alone whose own wait is cut is told.
// Without a WARNING (no synchronous standby, or the cancel came after the
// wait) the calls that stayed are answered their results.
var ErrCommitUnconfirmed = errors.New("a cancel request reached the commit group, which then ended without an error: " +
	"its commit may not have reached a synchronous standby")

// errLeftBeforeSent: a call left the group before its batch was sent,
// which leaves it out; when every call has left, the group sends nothing.
var errLeftBeforeSent = errors.New("a call left the commit group before it was sent")

// commit sends the statements of the group's calls that have not left in
// one batch (g.sent), one implicit transaction committed at its Sync, with
// each call's scan reading its statement's row.
func (c *committer) commit(g *group) error {
	calls := g.calls
	// In item order, so that two groups (of two writers) that change the
	// same items lock them in the same order; calls of one item keep
	// their order of arrival.
	slices.SortStableFunc(calls, func(a, b *groupedCall) int { return cmp.Compare(a.req.ItemID, b.req.ItemID) })
	ctx, cancel := groupContext(calls)
	defer cancel()
	ctx, span := startGroupSpan(ctx, calls)
	var tx warnedTransaction
	var warned, cancelled bool
	err := postgres.AcquireFunc(ctx, c.db, func(conn *pgxpool.Conn) error {
		g.sent = g.inFlightOn(conn)
		if len(g.sent) == 0 {
			return errLeftBeforeSent
		}
		for _, call := range g.sent {
			postgres.MarkSent(call.ctx)
		}
		warnings := postgres.WarningsOf(conn.Conn().PgConn())
		if warnings != nil {
			warnings.Reset() // an earlier statement's on this connection is not the group's
		}
		err := conn.SendBatch(ctx, groupBatch(g.sent)).Close()
		cancelled = g.landed()
		if cancelled {
			// A cancel request may reach the backend late, and cancel
			// whatever the connection runs next: it runs nothing more.
			_ = conn.Conn().Close(context.Background())
			if err == nil && commitWaitMayBeCut(warnings) {
				err = ErrCommitUnconfirmed
			}
		}
		tx, err, warned = warnedOf(warnings, err, len(g.sent), cancelled)
		return err
	})
	if warned {
		c.reportWarned(ctx, g.sent, tx)
	}
	endGroupSpan(span, calls, err)
	return err
}

// reportWarned tells each call of the group's transaction (its calls
// sent), during which PostgreSQL warned, of it (a line once the call is
// answered), and the group's span too, where there is one (ctx's).
func (c *committer) reportWarned(ctx context.Context, sent []*groupedCall, tx warnedTransaction) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(warnedEvent, trace.WithAttributes(warnedAttrs(tx.first, tx.writerSentCancel, tx.calls)...))
	}
	for _, call := range sent {
		call.told.heard(tx)
	}
}

// commitWaitMayBeCut reports whether the COMMIT of a batch that a cancel
// request was sent to, and that ended without an ERROR, may have had its
// wait for a synchronous standby cut: PostgreSQL then warns, and any
// WARNING during the batch counts (its text is not read: lc_messages
// translates it). A connection whose warnings are not recorded (nil: a
// pool not opened by package postgres) cannot tell, and is taken to.
func commitWaitMayBeCut(warnings *postgres.Warnings) bool {
	return warnings == nil || warnings.Heard()
}

// groupBatch is the batch of calls: for each, its key's lock and its
// statement, after the group's settings when they are several; a call
// alone sets client_min_messages in its lock's statement.
func groupBatch(calls []*groupedCall) *pgx.Batch {
	batch := &pgx.Batch{}
	lock := keyLockHearingWarnings // a group of one: as a call alone
	if len(calls) > 1 {
		batch.Queue(groupSettingsSQL)
		lock = keyLock
	}
	for _, call := range calls {
		batch.Queue(lock, call.req.OwnerID, call.req.PlatformID, call.req.IdempotencyKey)
		batch.Queue(call.stmt, call.args...).QueryRow(call.scan)
	}
	return batch
}

// inFlightOn records that the group's batch is about to be sent on conn,
// and returns the calls it holds: those that have not left. A call whose
// context has ended is leaving (submit's leave), or about to: it is left
// out too, and answered that nothing of it was sent.
func (g *group) inFlightOn(conn *pgxpool.Conn) []*groupedCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	var staying []*groupedCall
	for _, call := range g.calls {
		call.left = call.left || call.ctx.Err() != nil
		if !call.left {
			call.inBatch = true
			staying = append(staying, call)
		}
	}
	if len(staying) > 0 {
		g.conn = conn
	}
	return staying
}

// landed records that the batch has ended, and reports whether a cancel
// request was sent to its backend.
func (g *group) landed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.conn = nil
	return g.cancelSent
}

// cancel takes call, leaving, out of the group's batch and reports true,
// when the batch has not gone out (the group, still waiting for a
// connection, sends the others' statements without it: the call is
// answered at once that nothing was applied, as a call alone waiting for a
// connection is); or, the call's statement sent, asks PostgreSQL to cancel
// the batch if it is in flight: PostgreSQL answers the statement running
// with an ERROR (57014), which rolls the group back, unless it has
// committed already.
func (g *group) cancel(call *groupedCall, cancelRequest func(*pgconn.PgConn, context.Context) error) (neverSent bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !call.inBatch {
		call.left = true
		return true
	}
	if g.conn == nil || g.cancelSent {
		return false
	}
	g.cancelSent = true
	pgConn := g.conn.Conn().PgConn()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), cancelRequestTimeout)
		defer cancel()
		_ = cancelRequest(pgConn, ctx)
	}()
	return false
}

// groupContext is the context a group runs under: no call's cancellation
// (a call that leaves does not roll the others back), and the latest of
// the calls' deadlines, so that no call waits on the group past its own
// bound but by the time the others still have (each call's own deadline
// ends its wait: submit). A call without a deadline leaves the group
// without one, bounded by the statement timeout of each statement.
func groupContext(calls []*groupedCall) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, call := range calls {
		d, ok := call.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// maxGroupLinks bounds the links of a group's span, as the gateway's Redis
// batch bounds its own.
const maxGroupLinks = 32

var (
	attrGroupCalls  = attribute.Key("app.commit_group.calls")
	attrGroupTraced = attribute.Key("app.commit_group.traced_calls")
)

// startGroupSpan starts the span of a group's round trip, "commit group",
// when a traced call is among calls, and returns ctx with it, so that the
// group's SQL spans (otelpgx) are its children; otherwise ctx and nil. It
// is a child of the first traced call's span, so that it is sampled with
// it and adds no trace of its own, and links to the traced calls it ran.
// Each call's own span, "commit group wait" (endGroupSpan), links back to
// it: from one request id an SRE finds the group its sale committed in,
// how long that took and whether PostgreSQL refused it.
func startGroupSpan(ctx context.Context, calls []*groupedCall) (context.Context, trace.Span) {
	var parent trace.Span
	var links []trace.Link
	traced := 0
	for _, call := range calls {
		span := trace.SpanFromContext(call.ctx)
		if !span.IsRecording() {
			continue
		}
		traced++
		if parent == nil {
			parent = span
		}
		if len(links) < maxGroupLinks {
			links = append(links, trace.Link{SpanContext: span.SpanContext()})
		}
	}
	if parent == nil {
		return ctx, nil
	}
	tracer := parent.TracerProvider().Tracer("github.com/coinexport/export/services/sales-writer/sales")
	return tracer.Start(trace.ContextWithSpan(ctx, parent), "commit group", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithLinks(links...), trace.WithAttributes(attribute.String("db.system.name", "postgresql"),
			attrGroupCalls.Int(len(calls)), attrGroupTraced.Int(traced)))
}

// endGroupSpan ends the group's span with its outcome, and records on each
// traced call a span from its arrival to the group's end, linked to the
// group's span.
func endGroupSpan(span trace.Span, calls []*groupedCall, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	link := trace.WithLinks(trace.Link{SpanContext: span.SpanContext()})
	for _, call := range calls {
		from := trace.SpanFromContext(call.ctx)
		if !from.IsRecording() {
			continue
		}
		_, wait := from.TracerProvider().Tracer("github.com/coinexport/export/services/sales-writer/sales").
			Start(call.ctx, "commit group wait", trace.WithTimestamp(call.queued), link,
				trace.WithAttributes(attrGroupCalls.Int(len(calls))))
		if err != nil {
			wait.SetStatus(codes.Error, "the commit group failed: see the linked span")
		}
		wait.End()
	}
}

// GroupMetrics registers the commit groups' metrics on reg and returns the
// GroupStats that feed them: how many calls each group committed
// (sales_writer_commit_group_calls: a group of 1 is never counted, it runs
// alone), and how many groups PostgreSQL rolled back, whose calls then ran
// alone (sales_writer_commit_groups_rolled_back_total: a lock waited on
// past groupLockTimeout, a key stored meanwhile by another writer).
func GroupMetrics(reg prometheus.Registerer) GroupStats {
	calls := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sales_writer_commit_group_calls",
		Help:    "Sale calls sent together in one transaction (committed, or rolled back and run again alone), per commit group of two or more calls.",
		Buckets: []float64{2, 4, 8, 16, 32},
	})
	rolledBack := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sales_writer_commit_groups_rolled_back_total",
		Help: "Commit groups PostgreSQL answered with an ERROR (a lock waited on too long, a key stored by another writer); their calls ran again alone.",
	})
	reg.MustRegister(calls, rolledBack)
	return GroupStats{
		Ran:        func(n int) { calls.Observe(float64(n)) },
		RolledBack: func(int) { rolledBack.Inc() },
	}
}
