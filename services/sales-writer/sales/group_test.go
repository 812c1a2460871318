package sales

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// groupsSeen records what a committer tells its GroupStats.
type groupsSeen struct {
	mu         sync.Mutex
	ran        []int
	rolledBack []int
}

func (s *groupsSeen) stats() GroupStats {
	return GroupStats{
		Ran:        func(n int) { s.mu.Lock(); s.ran = append(s.ran, n); s.mu.Unlock() },
		RolledBack: func(n int) { s.mu.Lock(); s.rolledBack = append(s.rolledBack, n); s.mu.Unlock() },
	}
}

func (s *groupsSeen) counts() (ran, rolledBack []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ran), slices.Clone(s.rolledBack)
}

// heldGroupingWriter is a writer of db running one group at a time, whose
// runners are held (holdRunners), with the groups it runs recorded.
func heldGroupingWriter(t *testing.T, db *pgxpool.Pool) (w *Writer, seen *groupsSeen, release func()) {
	t.Helper()
	seen = &groupsSeen{}
	w = NewGroupingWriter(db, time.Hour, 1, seen.stats())
	return w, seen, holdRunners(t, w)
}

// holdRunners makes w's committer look as if its every runner were busy,
// so that calls submitted meanwhile wait in its queue, in the order they
// arrive; the release it returns lets one runner go on, as a runner does
// whose group has ended: it takes the queued calls as one group.
func holdRunners(t *testing.T, w *Writer) (release func()) {
	t.Helper()
	c := w.groups
	c.mu.Lock()
	c.running = c.maxGroups
	c.mu.Unlock()
	return func() { go c.runGroups() }
}

// queued waits until n calls wait in w's queue.
func queued(t *testing.T, w *Writer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.groups.mu.Lock()
		got := len(w.groups.queue)
		w.groups.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued after 10 s, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

type answer struct {
	res Result
	err error
}

// executeInOrder starts each of reqs (in its own goroutine, as requests
// are served) once the one before it is queued, so that they wait in
// their order, and returns where each will be answered.
func executeInOrder(t *testing.T, ctx context.Context, w *Writer, reqs []Request) []chan answer {
	t.Helper()
	answers := make([]chan answer, len(reqs))
	for i, req := range reqs {
		answers[i] = make(chan answer, 1)
		go func() {
			res, err := w.Execute(ctx, req)
			answers[i] <- answer{res, err}
		}()
		queued(t, w, i+1)
	}
	return answers
}

// answered waits for a call's answer: 10 s is a liveness bound, not a
// measure (a call answers in milliseconds).
func answered(t *testing.T, what string, a <-chan answer) answer {
	t.Helper()
	select {
	case got := <-a:
		return got
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not answered after 10 s", what)
		return answer{}
	}
}

func confirmOf(owner, key, item, order string) Request {
	return Request{Operation: Confirm, OwnerID: owner, PlatformID: "p", IdempotencyKey: key, ItemID: item, ExternalOrderID: order, Quantity: 1}
}

// Calls that arrive while every runner is busy wait, and the next group
// takes them all: one transaction, each call answered as alone.
func TestCallsArrivingTogetherCommitInOneGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "a", "b", "c", "d")
	w, seen, release := heldGroupingWriter(t, db)
	items := []string{"d", "b", "a", "c"}
	var reqs []Request
	for _, item := range items {
		reqs = append(reqs, confirmOf(owner, "k-"+item, item, "o-"+item))
	}
	answers := executeInOrder(t, ctx, w, reqs)
	release()
	for i, a := range answers {
		got := answered(t, "confirm of "+items[i], a)
		if got.err != nil || got.res.IdempotentReplay || got.res.Status != "inactive" || got.res.ConfirmedAt.IsZero() {
			t.Errorf("confirm of %s in a group = %+v, %v; want it sold, as alone", items[i], got.res, got.err)
		}
	}
	if ran, rolledBack := seen.counts(); len(ran) != 1 || ran[0] != len(items) || len(rolledBack) != 0 {
		t.Errorf("groups run %v, rolled back %v; want one group of %d, none rolled back", ran, rolledBack, len(items))
	}
	var sold int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM export_items WHERE sold").Scan(&sold); err != nil || sold != len(items) {
		t.Errorf("%d items sold (%v), want %d", sold, err, len(items))
	}
}

// In one group, each call sees what the calls before it did, as if they
// had committed one after another: two copies of a request execute once
// and replay once; another request under that key is a conflict; two
// platforms confirming one item make one sale and one 409; a confirm and
// its cancel, in that order, sell and restore the item.
func TestAGroupJudgesItsCallsOneAfterAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "a", "b", "c", "d")
	if _, err := db.Exec(ctx, "INSERT INTO platforms (id) VALUES ('q')"); err != nil {
		t.Fatal(err)
	}
	w, seen, release := heldGroupingWriter(t, db)
	byQ := confirmOf(owner, "k-q", "c", "o-q")
	byQ.PlatformID = "q"
	cancelD := confirmOf(owner, "k-cancel-d", "d", "o-d")
	cancelD.Operation = Cancel
	reqs := []Request{
		confirmOf(owner, "k", "a", "o-a"), // 0
		confirmOf(owner, "k", "a", "o-a"), // 1: a copy of 0
		confirmOf(owner, "k", "b", "o-b"), // 2: another request under 0's key
		confirmOf(owner, "k-p", "c", "o-p"),
		byQ,                                 // 4: c sold to p just before
		confirmOf(owner, "k-d", "d", "o-d"), // 5
		cancelD,                             // 6: cancels 5
	}
	answers := executeInOrder(t, ctx, w, reqs)
	release()
	got := make([]answer, len(reqs))
	for i := range reqs {
		got[i] = answered(t, reqs[i].IdempotencyKey, answers[i])
	}
	if got[0].err != nil || got[0].res.IdempotentReplay {
		t.Errorf("first copy = %+v, %v; want it executed", got[0].res, got[0].err)
	}
	if got[1].err != nil || !got[1].res.IdempotentReplay || !got[1].res.ConfirmedAt.Equal(got[0].res.ConfirmedAt) {
		t.Errorf("second copy = %+v, %v; want the first's replay", got[1].res, got[1].err)
	}
	if !errors.Is(got[2].err, ErrIdempotencyConflict) {
		t.Errorf("another request under the key = %+v, %v; want ErrIdempotencyConflict", got[2].res, got[2].err)
	}
	if got[3].err != nil || !errors.Is(got[4].err, ErrAlreadySold) {
		t.Errorf("p then q confirming c = %v, %v; want a sale, then ErrAlreadySold", got[3].err, got[4].err)
	}
	if got[5].err != nil || got[6].err != nil || got[6].res.Status != "active" || got[6].res.CanceledAt.IsZero() {
		t.Errorf("confirm then cancel of d = %v; %+v, %v; want sold then restored", got[5].err, got[6].res, got[6].err)
	}
	if ran, rolledBack := seen.counts(); len(ran) != 1 || ran[0] != len(reqs) || len(rolledBack) != 0 {
		t.Errorf("groups run %v, rolled back %v; want one group of %d, none rolled back", ran, rolledBack, len(reqs))
	}
	var sales, open int
	if err := db.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE canceled_at IS NULL) FROM sales").Scan(&sales, &open); err != nil || sales != 3 || open != 2 {
		t.Errorf("%d sales, %d open (%v); want 3 (a, c, d), 2 open (a, c)", sales, open, err)
	}
}

// A group with a call on an item another transaction has locked is rolled
// back after groupLockTimeout; the others, run again alone, are answered
// while the lock is still held, and the locked call completes once it
// goes.
func TestAGroupWithALockedItemDoesNotHoldUpItsOtherCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "a", "b", "x")
	tx := testenv.InTransaction(t, db, `SELECT FROM export_items WHERE id = 'x' FOR UPDATE`)
	w, seen, release := heldGroupingWriter(t, db)
	reqs := []Request{confirmOf(owner, "k-a", "a", "o-a"), confirmOf(owner, "k-x", "x", "o-x"), confirmOf(owner, "k-b", "b", "o-b")}
	answers := executeInOrder(t, ctx, w, reqs)
	release()
	for _, i := range []int{0, 2} {
		if got := answered(t, reqs[i].ItemID+" while x is locked", answers[i]); got.err != nil || got.res.Status != "inactive" {
			t.Errorf("confirm of %s = %+v, %v; want it sold while x is locked", reqs[i].ItemID, got.res, got.err)
		}
	}
	select {
	case got := <-answers[1]:
		t.Fatalf("confirm of the locked item answered %+v, %v while it was locked", got.res, got.err)
	default:
	}
	if ran, rolledBack := seen.counts(); len(ran) != 1 || ran[0] != 3 || len(rolledBack) != 1 || rolledBack[0] != 3 {
		t.Errorf("groups run %v, rolled back %v; want one group of 3, rolled back", ran, rolledBack)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := answered(t, "x once unlocked", answers[1]); got.err != nil || got.res.Status != "inactive" {
		t.Errorf("confirm of x once unlocked = %+v, %v; want it sold", got.res, got.err)
	}
}

// A call alone (SALES_WRITER_COMMIT_GROUPS=0) or in a group of one waits
// for a lock as long as its bound lets it, as a group's call does once
// its group is rolled back after groupLockTimeout and it runs again alone
// (TestAGroupWithALockedItemDoesNotHoldUpItsOtherCalls): here its item's
// row held by another transaction for 4 lock timeouts after the call began
// to wait (a sale of the item committing slowly, behind a synchronous
// standby, say), and the call sells the item once the lock goes. Given
// the group's lock_timeout, it was answered 503 (55P03), a lock it would
// have had a moment later: it holds no other call up (its runner goes on
// after slowGroup), which is all the group's timeout is for.
func TestACallAloneWaitsForALockAsAGroupsCallDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	admin := testenv.Pool(t, dsn)
	owner := saleFixture(t, admin, "a", "b")
	for _, c := range []struct {
		name   string
		groups int
		item   string
	}{
		{"alone", 0, "a"},
		{"a group of one", 1, "b"},
	} {
		app := "sales-waiting-" + c.item
		w := NewGroupingWriter(openRecording(t, dsn+" application_name="+app), time.Hour, c.groups, GroupStats{})
		tx := testenv.InTransaction(t, admin, "SELECT FROM export_items WHERE id = $1 FOR UPDATE", c.item)
		done := make(chan answer, 1)
		go func() {
			res, err := w.Execute(ctx, confirmOf(owner, "k-"+c.item, c.item, "o-"+c.item))
			done <- answer{res, err}
		}()
		testenv.WaitUntilTrue(t, admin, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = '"+app+"' AND wait_event_type = 'Lock')")
		time.Sleep(4 * 50 * time.Millisecond) // groupLockTimeout, 4 times over: not a measure
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if got := answered(t, c.name, done); got.err != nil || got.res.Status != "inactive" {
			t.Errorf("%s: a confirm that waited for its item's lock = %+v, %v; want it sold once the lock went", c.name, got.res, got.err)
		}
	}
}

// A call that leaves (its caller gone, its deadline met) while its group
// waits for a pool connection had nothing sent, and its answer says so at
// once (postgres.NothingDone: "nothing was applied"), as a call alone
// waiting for a connection. The group goes on without it: its other calls
// commit together once the connection comes, rather than each waiting
// again for one of its own (under overload, calls timing out in the
// pool's line would otherwise dissolve every group they are in).
func TestACallLeavingBeforeItsGroupIsSentSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Pool(t, testenv.PostgresURL(t)+" pool_max_conns=1")
	owner := saleFixture(t, db, "a", "b", "c")
	w, seen, release := heldGroupingWriter(t, db)
	held, err := db.Acquire(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	leaving, leave := context.WithCancel(ctx)
	defer leave()
	leaving, sent := postgres.TrackSent(leaving)
	left := make(chan error, 1)
	go func() { _, err := w.Execute(leaving, confirmOf(owner, "k-b", "b", "o-b")); left <- err }()
	queued(t, w, 1)
	var staying []chan answer
	for _, item := range []string{"a", "c"} {
		stay := make(chan answer, 1)
		staying = append(staying, stay)
		go func() {
			res, err := w.Execute(ctx, confirmOf(owner, "k-"+item, item, "o-"+item))
			stay <- answer{res, err}
		}()
		queued(t, w, len(staying)+1)
	}
	release()
	queued(t, w, 0) // the group has taken all three, and waits for the connection
	leave()
	// Answered while the group still waits for the connection.
	if err := <-left; !postgres.NothingDone(err) || !sent.Nothing() {
		t.Errorf("call that left before its group was sent = %v (sent: %t); want nothing done, nothing sent", err, !sent.Nothing())
	}
	held.Release()
	for _, stay := range staying {
		if got := answered(t, "a call that stayed", stay); got.err != nil || got.res.Status != "inactive" {
			t.Errorf("a call that stayed = %+v, %v; want it sold", got.res, got.err)
		}
	}
	if ran, rolledBack := seen.counts(); len(ran) != 1 || ran[0] != 2 || len(rolledBack) != 0 {
		t.Errorf("groups run %v, rolled back %v; want the two calls that stayed sent together, none rolled back", ran, rolledBack)
	}
	rows, _ := db.Query(ctx, "SELECT id FROM export_items WHERE sold ORDER BY id")
	sold, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(sold) != 2 || sold[0] != "a" || sold[1] != "c" {
		t.Errorf("sold %v (%v), want [a c]", sold, err)
	}
}

// A panic while a group runs (in its scan of a call's row, in pgx) is its
// calls' own: each panics with it in its own goroutine, where the server
// answers it (api's panicAnswer: the call was sent, so the sale may have
// been applied) and the writer goes on. It once went up the group's
// goroutine and ended the process, every call in flight with it.
func TestAPanicInACommitGroupPanicsInItsCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "a", "b", "c")
	w := NewGroupingWriter(db, time.Hour, 1, GroupStats{})
	release := holdRunners(t, w)
	scans := map[string]func(pgx.Row) error{
		"a": func(pgx.Row) error { panic("a bug in a scan") },
		"b": func(row pgx.Row) error {
			var wr written
			return row.Scan(&wr.recordFingerprint, &wr.stored, &wr.status, &wr.confirmedAt, &wr.canceledAt)
		},
	}
	type panicked struct {
		value any
		sent  *postgres.Sent
	}
	var calls []chan panicked
	for i, item := range []string{"a", "b"} {
		req := confirmOf(owner, "k-"+item, item, "o-"+item)
		callCtx, sent := postgres.TrackSent(ctx)
		call := make(chan panicked, 1)
		calls = append(calls, call)
		go func() {
			defer func() { call <- panicked{recover(), sent} }()
			_ = w.submit(callCtx, req, w.warned.call(callCtx, req), confirmSQL, []any{owner, "p", req.IdempotencyKey, item, req.ExternalOrderID,
				Fingerprint(req), 3600.0}, scans[item])
		}()
		queued(t, w, i+1)
	}
	release()
	for i, call := range calls {
		select {
		case got := <-call:
			if got.value == nil || !strings.Contains(fmt.Sprint(got.value), "a bug in a scan") || got.sent.Nothing() {
				t.Errorf("call %d of the group that panicked: panic %v, sent %t; want the group's panic, sent", i, got.value, !got.sent.Nothing())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d of the group that panicked not answered after 10 s", i)
		}
	}
	if res, err := w.Execute(ctx, confirmOf(owner, "k-c", "c", "o-c")); err != nil || res.Status != "inactive" {
		t.Errorf("a call after the panic = %+v, %v; want it sold", res, err)
	}
}

// A cancel request that reaches a group's COMMIT while it waits for a
// synchronous standby ends the wait with a WARNING, not an ERROR: the
// batch succeeds, its transaction committed locally and perhaps not on the
// standby. A call that left its group in flight sends one; its group's
// other calls are then told their sale may have been applied, never that
// it is done (a failover could lose it), as a call alone is told when its
// own wait is cut (api's TestSaleEndedAfterItsCommitWasSentMayHaveBeenApplied).
// So too when the session's client_min_messages would hold the WARNING
// back, and on a pool whose connections' warnings nobody records.
func TestACallLeavingDuringItsGroupsCommitWaitLeavesTheOthersUnsure(t *testing.T) {
	t.Parallel()
	for _, pool := range []struct {
		name string
		open func(t testing.TB, dsn string) *pgxpool.Pool
	}{
		{"a pool of package postgres", openRecording},
		// A DATABASE_URL, role or database setting PostgreSQL then
		// sends the writer no WARNING under.
		{"client_min_messages error", func(t testing.TB, dsn string) *pgxpool.Pool {
			return openRecording(t, dsn+" client_min_messages=error")
		}},
		// Its connections' warnings are not recorded: it cannot tell.
		{"a pool of pgxpool.New", testenv.Pool},
	} {
		t.Run(pool.name, func(t *testing.T) {
			t.Parallel()
			g := groupWaitingForAStandby(t, pool.open, func(*Writer) {})
			g.leave()
			if err := <-g.left; err == nil || postgres.NothingDone(err) || postgres.RolledBack(err) {
				t.Errorf("the call that left = %v, want an error saying it may have been applied", err)
			}
			if got := answered(t, "the call that stayed", g.stay); !errors.Is(got.err, ErrCommitUnconfirmed) {
				t.Errorf("the call that stayed, its commit's wait for the standby cut = %+v, %v; want ErrCommitUnconfirmed (it may have been applied)", got.res, got.err)
			}
		})
	}
}

// A cancel request sent to a group in flight that reaches PostgreSQL only
// once the COMMIT is done (no synchronous standby to wait for, or its wait
// over) changes nothing and draws no WARNING: the group committed
// plainly, and the call that stayed is told its sale is done, where it
// was once told it may have been applied (503). The committer's hook holds
// the cancel until the COMMIT's wait is released by emptying
// synchronous_standby_names, which PostgreSQL does without a warning.
func TestACancelReachingItsGroupAfterTheCommitLeavesTheOthersDone(t *testing.T) {
	t.Parallel()
	asked := make(chan struct{}, 1)
	arrive := make(chan struct{})
	g := groupWaitingForAStandby(t, openRecording, func(w *Writer) {
		w.groups.cancelRequest = func(conn *pgconn.PgConn, ctx context.Context) error {
			asked <- struct{}{}
			<-arrive
			return conn.CancelRequest(ctx)
		}
	})
	letCancelArrive := sync.OnceFunc(func() { close(arrive) })
	t.Cleanup(letCancelArrive) // before the pair stops, should the test end early
	g.leave()
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the call that left sent no cancel request after 10 s")
	}
	for _, stmt := range []string{"ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
		if _, err := g.admin.Exec(context.Background(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	got := answered(t, "the call that stayed", g.stay)
	letCancelArrive() // after the commit
	if got.err != nil || got.res.Status != "inactive" || got.res.IdempotentReplay {
		t.Errorf("the call that stayed, its group's cancel arriving after the commit = %+v, %v; want it sold", got.res, got.err)
	}
	if err := <-g.left; err == nil || postgres.NothingDone(err) || postgres.RolledBack(err) {
		t.Errorf("the call that left = %v, want an error saying it may have been applied", err)
	}
	rows, _ := g.admin.Query(context.Background(), "SELECT id FROM export_items WHERE sold ORDER BY id")
	sold, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Equal(sold, []string{"a", "b"}) {
		t.Errorf("sold %v (%v), want [a b]: the group committed", sold, err)
	}
}

// standbyWaitingGroup is a group of two calls whose COMMIT waits for a
// synchronous standby.
type standbyWaitingGroup struct {
	admin *pgxpool.Pool
	leave func()      // ends the context of the call confirming a
	left  chan error  // where the call confirming a is answered
	stay  chan answer // where the call confirming b is answered
}

// groupWaitingForAStandby starts a writer (its pool of one connection
// opened by open, set up by configure) on a primary whose
// synchronous_standby_names names a standby that never comes, and returns
// once a group of two calls (confirming a, then b) waits for it in its
// COMMIT: the session of application committingApp. The calls' request
// ids are req-a and req-b. The pool's one connection has been warned of
// before, by a statement that is not the group's.
func groupWaitingForAStandby(t *testing.T, open func(t testing.TB, dsn string) *pgxpool.Pool, configure func(*Writer)) *standbyWaitingGroup {
	t.Helper()
	ctx := context.Background()
	primary, admin, owner := primaryAwaitingAStandby(t, "a", "b")
	db := open(t, primary+" application_name="+committingApp+" synchronous_commit=on pool_max_conns=1")
	if _, err := db.Exec(ctx, "DO $$ BEGIN RAISE WARNING 'not the group''s'; END $$"); err != nil {
		t.Fatal(err)
	}
	w := NewGroupingWriter(db, time.Hour, 1, GroupStats{})
	configure(w)
	release := holdRunners(t, w)
	leaving, leave := context.WithCancel(ctx)
	t.Cleanup(leave)
	g := &standbyWaitingGroup{admin: admin, leave: leave, left: make(chan error, 1), stay: make(chan answer, 1)}
	leaving = identity.WithContext(leaving, identity.Identity{RequestID: "req-a"})
	go func() { _, err := w.Execute(leaving, confirmOf(owner, "k-a", "a", "o-a")); g.left <- err }()
	queued(t, w, 1)
	staying := identity.WithContext(ctx, identity.Identity{RequestID: "req-b"})
	go func() {
		res, err := w.Execute(staying, confirmOf(owner, "k-b", "b", "o-b"))
		g.stay <- answer{res, err}
	}()
	queued(t, w, 2)
	release()
	waitingInSyncRep(t, admin, committingApp)
	return g
}

// primaryAwaitingAStandby returns a primary of its own (its DSN and a
// pool), with an owner of items, whose every commit of synchronous_commit
// on waits for a synchronous standby that is not there
// (awaitAStandbyThatNeverComes).
func primaryAwaitingAStandby(t *testing.T, items ...string) (primary string, admin *pgxpool.Pool, owner string) {
	t.Helper()
	pair := testenv.StandbyPair(t)
	admin = testenv.Pool(t, pair.Primary)
	owner = saleFixture(t, admin, items...)
	awaitAStandbyThatNeverComes(t, admin)
	return pair.Primary, admin, owner
}

// awaitAStandbyThatNeverComes has the primary of admin's pool make every
// commit of synchronous_commit on wait for a synchronous standby that is
// not there.
func awaitAStandbyThatNeverComes(t *testing.T, admin *pgxpool.Pool) {
	t.Helper()
	for _, stmt := range []string{"ALTER SYSTEM SET synchronous_standby_names = 'nothere'", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(context.Background(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitUntilTrue(t, admin, "SELECT setting = 'nothere' FROM pg_settings WHERE name = 'synchronous_standby_names'")
}

// committingApp is the application name of groupWaitingForAStandby's
// session.
const committingApp = "sales-group-committing"

// waitingInSyncRep returns once a session of app waits for a synchronous
// standby in its COMMIT.
func waitingInSyncRep(t *testing.T, admin *pgxpool.Pool, app string) {
	t.Helper()
	testenv.WaitUntilTrue(t, admin, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = '"+app+"' AND wait_event = 'SyncRep')")
}

// openRecording opens a pool as the service does (package postgres), whose
// connections record PostgreSQL's warnings.
func openRecording(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	db, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}
