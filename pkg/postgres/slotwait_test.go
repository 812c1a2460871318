package postgres_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// With PostgreSQL out of connection slots (here the role's CONNECTION
// LIMIT, as a rollout's extra pods take max_connections), calls that find
// the pool's one connection busy are refused the new one they ask for
// (53300). They wait for the pool's own instead, and all are served, one
// after the other, on it; the pool does not grow, and SlotWaits counts
// each. Before, every one failed at once with the refusal (a 503
// unavailable), though the connection came free a moment later.
func TestCallsWaitForThePoolsConnectionWhenNoSlotIsLeft(t *testing.T) {
	ctx := context.Background()
	pool, limit := slotLimitedPool(t)
	limit(1) // the pool's one session holds the role's one slot
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const calls = 8
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			callCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			errs <- postgres.AcquireFunc(callCtx, pool, func(conn *pgxpool.Conn) error {
				_, err := conn.Exec(callCtx, "SELECT 1")
				return err
			})
		})
	}
	done := whenDone(&wg)
	untilWaiting(pool, calls, done)
	held.Release()
	<-done
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a call while the pool's connection was busy and no slot left = %v, want it served on that connection", err)
		}
	}
	if got := heldConns(pool); got != 1 {
		t.Errorf("the pool holds %d connections, want 1 (it cannot grow)", got)
	}
	if waits, waited := postgres.SlotWaits(pool); waits != calls || waited <= 0 {
		t.Errorf("SlotWaits = %d, %v, want %d calls and their time waiting", waits, waited, calls)
	}
}

// Calls that wait for one of the pool's connections for want of a slot
// are served in the order they came (a line, first come first served),
// and a call that comes as the connection frees, after them, is served
// after them: it joins the line rather than take the connection ahead of
// those waiting. Before, each waiting call looked at the pool every 1-10
// ms and the newest, or a call just come, took the connection that came
// free: under load the unlucky waited longest (p99 0.6-1.0 s with 1 ms
// queries on one connection, BenchmarkSlotWaitUnderLoad).
func TestCallsWaitingForASlotAreServedInTurn(t *testing.T) {
	ctx := context.Background()
	pool, limit := slotLimitedPool(t)
	const waiting = 5
	order := &servedOrder{}
	held, calls := lineBehindTheOneConnection(t, pool, limit, order, waiting)
	held.Release()
	comer := order.call(ctx, pool, waiting+1) // comes as the connection frees
	calls = append(calls, comer)
	for _, c := range calls {
		if err := c.wait(); err != nil {
			t.Errorf("call %d = %v, want it served", c.n, err)
		}
	}
	if want := []int{1, 2, 3, 4, 5, 6}; !slices.Equal(order.served, want) {
		t.Errorf("calls served in the order %v, want %v (the order they came)", order.served, want)
	}
}

// A call that leaves the line at its hang-up, at its head or behind
// another, passes its turn on: the calls behind it are served in their
// order on the connection that comes free, and it gets its context's
// error, nothing sent.
func TestACallLeavingTheLinePassesItsTurnOn(t *testing.T) {
	pool, limit := slotLimitedPool(t)
	order := &servedOrder{}
	held, calls := lineBehindTheOneConnection(t, pool, limit, order, 4)
	for _, leaving := range []*slotCall{calls[0], calls[2]} { // the head, and one behind the second
		leaving.hangUp()
		if err := leaving.wait(); !errors.Is(err, context.Canceled) || !postgres.NothingSent(err) {
			t.Errorf("call %d hung up in line = %v, want its context's error, nothing sent", leaving.n, err)
		}
	}
	held.Release()
	for _, c := range []*slotCall{calls[1], calls[3]} {
		if err := c.wait(); err != nil {
			t.Errorf("call %d = %v, want it served", c.n, err)
		}
	}
	if want := []int{2, 4}; !slices.Equal(order.served, want) {
		t.Errorf("calls served in the order %v, want %v", order.served, want)
	}
}

// While calls wait in line and none of the pool's connections comes free
// (the one it holds is held throughout), a slot freed on the server (the
// role's CONNECTION LIMIT raised) lets the pool grow back into it: the
// line's probe for a new connection, one at a time, gets it, and the
// calls are served on it. Before, the waiting calls only looked for an
// idle connection, and asked for none: they waited until their deadline.
func TestThePoolGrowsBackWhileCallsWaitInLine(t *testing.T) {
	pool, limit := slotLimitedPool(t)
	held, calls := lineBehindTheOneConnection(t, pool, limit, &servedOrder{}, 3)
	defer held.Release()
	limit(4)
	for _, c := range calls {
		if err := c.wait(); err != nil {
			t.Errorf("call %d = %v, want it served on a connection the pool grew", c.n, err)
		}
	}
	if got := heldConns(pool); got < 2 {
		t.Errorf("the pool holds %d connections, want it grown past the one held", got)
	}
}

// lineBehindTheOneConnection limits the pool's role to one slot, holds
// the pool's one connection, and lines up n calls of AcquireFunc behind it,
// numbered 1 to n in the order they come, each seen waiting before the
// next comes. The caller releases the connection it returns.
func lineBehindTheOneConnection(t *testing.T, pool *pgxpool.Pool, limit func(int), order *servedOrder, n int) (*pgxpool.Conn, []*slotCall) {
	t.Helper()
	limit(1) // the pool's one session holds the role's one slot
	held, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	calls := make([]*slotCall, 0, n+1)
	for i := 1; i <= n; i++ {
		calls = append(calls, order.call(context.Background(), pool, i))
		untilWaiting(pool, int64(i), calls[i-1].done)
	}
	return held, calls
}

// servedOrder records the order in which calls were given a connection.
type servedOrder struct {
	mu     sync.Mutex
	served []int
}

// slotCall is a call of AcquireFunc under way in a goroutine of its own.
type slotCall struct {
	n      int
	done   chan struct{}
	err    error
	hangUp context.CancelFunc
}

// call starts call n: AcquireFunc on pool, within a minute, recording n
// in o when it is given its connection.
func (o *servedOrder) call(ctx context.Context, pool *pgxpool.Pool, n int) *slotCall {
	callCtx, hangUp := context.WithTimeout(ctx, time.Minute)
	c := &slotCall{n: n, done: make(chan struct{}), hangUp: hangUp}
	go func() {
		defer close(c.done)
		defer hangUp()
		c.err = postgres.AcquireFunc(callCtx, pool, func(*pgxpool.Conn) error {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.served = append(o.served, n)
			return nil
		})
	}()
	return c
}

// wait returns the call's error once it has ended.
func (c *slotCall) wait() error {
	<-c.done
	return c.err
}

// A pool that holds no connection has none to wait for: refused for want
// of a slot, the call fails at once with the refusal, which names the
// cause, as before (a 503 unavailable), not at its deadline.
func TestAPoolWithNoConnectionFailsAtOnceWhenNoSlotIsLeft(t *testing.T) {
	pool, limit := slotLimitedPool(t)
	pool.Reset() // its session ends: none left
	limit(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := postgres.Acquire(ctx, pool)
	var acquireErr *postgres.AcquireError
	if !errors.As(err, &acquireErr) || !hasCode(err, "53300") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on an empty pool, no slot left = %v, want the AcquireError of the refusal (53300), without waiting", err)
	}
	if cause := postgres.Cause(err); !strings.Contains(cause, "no connection slot left") {
		t.Errorf("Cause(%v) = %q, want it to name the slots", err, cause)
	}
	if waits, _ := postgres.SlotWaits(pool); waits != 0 {
		t.Errorf("SlotWaits = %d, want 0", waits)
	}
}

// A new session refused for another reason than a slot (here a password
// changed under the service, 28P01) is not waited for, though the pool
// holds a connection: none coming free mends it, and the call fails at
// once with the refusal.
func TestARefusedPasswordFailsAtOnceThoughThePoolHoldsAConnection(t *testing.T) {
	ctx := context.Background()
	role := testenv.PasswordCluster(t)
	pool, err := postgres.Open(ctx, role.DSN+" pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	restore := role.ChangePassword(t)
	defer restore()
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = postgres.Acquire(callCtx, pool)
	if !hasCode(err, "28P01") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with the password refused = %v, want the refusal (28P01), without waiting", err)
	}
	if waits, _ := postgres.SlotWaits(pool); waits != 0 {
		t.Errorf("SlotWaits = %d, want 0", waits)
	}
}

// A call whose deadline comes, or whose caller hangs up, while it waits
// for one of the pool's connections gets an AcquireError: nothing was
// sent (NothingSent, and its Sent says so), and the error holds the
// context's and the refusal that made it wait, so that its line says why.
func TestACallEndedWhileWaitingForASlotSentNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hangUp bool // else the deadline ends the wait
		want   error
	}{
		{"deadline", false, context.DeadlineExceeded},
		{"hang-up", true, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, limit := slotLimitedPool(t)
			limit(1)
			held, err := pool.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			tracked, sent := postgres.TrackSent(context.Background())
			ctx, hangUp := context.WithCancel(tracked)
			defer hangUp()
			if !tc.hangUp {
				// Long enough for the pool to be refused its new
				// connection first, on a loaded machine.
				ctx, hangUp = context.WithTimeout(tracked, time.Second)
				defer hangUp()
			}
			ran := false
			var wg sync.WaitGroup
			wg.Go(func() {
				err = postgres.AcquireFunc(ctx, pool, func(*pgxpool.Conn) error { ran = true; return nil })
			})
			done := whenDone(&wg)
			untilWaiting(pool, 1, done)
			if tc.hangUp {
				hangUp()
			}
			<-done
			var acquireErr *postgres.AcquireError
			if !errors.As(err, &acquireErr) || !errors.Is(err, tc.want) || !hasCode(err, "53300") {
				t.Fatalf("AcquireFunc ended while waiting = %v, want an AcquireError holding %v and the refusal (53300)", err, tc.want)
			}
			if !postgres.NothingSent(err) || !sent.Nothing() || ran {
				t.Errorf("NothingSent = %v, Sent.Nothing() = %v, f ran = %v; want true, true, false", postgres.NothingSent(err), sent.Nothing(), ran)
			}
		})
	}
}

// A pooler in front of PostgreSQL that refuses a client for want of a
// slot of its own (PgBouncer's max_client_conn) is waited for as
// PostgreSQL's 53300 is: the pool's connection to it serves the calls.
func TestCallsWaitForThePoolsConnectionWhenThePoolerIsFull(t *testing.T) {
	ctx := context.Background()
	bouncer := testenv.PgBouncer(t, testenv.PostgresURL(t), "session", "max_client_conn = 1",
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
	// testenv's check that PgBouncer listens was a client too, counted
	// until PgBouncer has seen it go.
	pool, err := postgres.Open(ctx, bouncer+" pool_max_conns=4")
	for try := 0; err != nil && try < 50; try++ {
		time.Sleep(20 * time.Millisecond)
		pool, err = postgres.Open(ctx, bouncer+" pool_max_conns=4")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var callErr error
	wg.Go(func() {
		callCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		callErr = postgres.AcquireFunc(callCtx, pool, func(conn *pgxpool.Conn) error {
			_, err := conn.Exec(callCtx, "SELECT 1")
			return err
		})
	})
	done := whenDone(&wg)
	untilWaiting(pool, 1, done)
	held.Release()
	<-done
	if waits, _ := postgres.SlotWaits(pool); callErr != nil || waits != 1 {
		t.Errorf("a call refused by PgBouncer's max_client_conn = %v after %d waits, want it served on the pool's connection after 1", callErr, waits)
	}
}

func TestNoSlotLeftReadsThePoolersWords(t *testing.T) {
	pooler := func(message string) error {
		return &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: message}
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"PostgreSQL: too many clients", &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: "sorry, too many clients already", Routine: "InitProcess"}, true},
		{"PostgreSQL: the role's limit", &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: `too many connections for role "svc"`, Routine: "InitializeSessionUserId"}, true},
		{"PgBouncer: max_client_conn", pooler("no more connections allowed (max_client_conn)"), true},
		{"PgBouncer passing the role's limit on", pooler(`too many connections for role "svc"`), true},
		{"PgBouncer passing the database's limit on", pooler(`too many connections for database "exportsvc"`), true},
		{"PgBouncer passing PostgreSQL's on", pooler("sorry, too many clients already"), true},
		{"PgBouncer quoting PostgreSQL's", pooler("server login has been failing, cached error: remaining connection slots are reserved for roles with the SUPERUSER attribute (server_login_retry)"), true},
		{"PgBouncer: login refused", pooler("server login has been failing, try again later (server_login_retry)"), false},
		{"PostgreSQL's own 08P01 (a client's bug)", &pgconn.PgError{Code: "08P01", Message: "sorry, too many clients already", Routine: "SocketBackend"}, false},
		{"password", &pgconn.PgError{Code: "28P01"}, false},
		{"starting up", &pgconn.PgError{Code: "57P03"}, false},
		{"out of memory", &pgconn.PgError{Code: "53200"}, false},
		{"deadline", context.DeadlineExceeded, false},
		{"nil", nil, false},
	} {
		if got := postgres.NoSlotLeft(tc.err); got != tc.want {
			t.Errorf("NoSlotLeft(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// slotLimitedPool is a pool opened by Open (whose waits SlotWaits counts)
// as a role of the test's own (testenv.SlotLimitedRole), with room for 4
// connections, holding one, idle; limit sets the role's CONNECTION LIMIT.
func slotLimitedPool(t *testing.T) (*pgxpool.Pool, func(n int)) {
	t.Helper()
	dsn, limit := testenv.SlotLimitedRole(t, testenv.PostgresURL(t))
	pool, err := postgres.Open(context.Background(), dsn+" pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, limit
}

// heldConns is the number of connections pool holds, idle or in use: not
// a connect under way, such as the line's probe for a new one, which
// PostgreSQL refuses while it has no slot.
func heldConns(pool *pgxpool.Pool) int32 {
	stat := pool.Stat()
	return stat.IdleConns() + stat.AcquiredConns()
}

// untilWaiting returns once n calls on pool have been refused a new
// connection and wait for one of its own (SlotWaits), or once done is
// closed: the calls have ended (as they do at once without the wait).
func untilWaiting(pool *pgxpool.Pool, n int64, done <-chan struct{}) {
	for {
		if waits, _ := postgres.SlotWaits(pool); waits >= n {
			return
		}
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// whenDone is a channel closed once wg is done.
func whenDone(wg *sync.WaitGroup) <-chan struct{} {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// hasCode reports whether err holds a server error with SQLSTATE code.
func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// While a connect of the pool is under way for its last place (here a
// query straight on the pool, its connect held), the pool holding fewer
// connections than its size, all in use, no probe can start: the head of
// the line waits for a release, looking at the pool every few
// milliseconds at most. Before, the pause until its next look was the time
// until the next probe was due, 0 once that time had passed though no
// probe could start: the head looked at the pool without a pause, on the
// pool's lock every acquire and release takes, for as long as the connect
// lasted (1.94 million looks, 1.04 s of CPU in a second, on a pool grown
// back to its size before the line ended there).
func TestTheHeadOfTheLineWaitsForAReleaseWhileNoProbeCanStart(t *testing.T) {
	ctx := context.Background()
	dsn, limit := testenv.SlotLimitedRole(t, testenv.PostgresURL(t))
	pool := postgres.OpenHoldingConnects(t, dsn, 2)
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	limit(1) // the pool's one session holds the role's one slot
	call := (&servedOrder{}).call(ctx, pool, 1)
	untilWaiting(pool, 1, call.done)
	hold := make(chan struct{})
	straight := make(chan error, 1)
	go func() { // a query straight on the pool: its connect takes the pool's last place
		conn, err := pool.Acquire(postgres.HoldConnect(ctx, hold))
		if err == nil {
			conn.Release()
		}
		straight <- err
	}()
	for pool.Stat().TotalConns() < 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(2 * 50 * time.Millisecond) // past the time of the line's first probe
	before := postgres.HeadLooks(pool)
	time.Sleep(time.Second)
	// One look every 10 ms at most while nothing is released: 100 a second.
	if looks := postgres.HeadLooks(pool) - before; looks > 1000 {
		t.Errorf("the head of the line looked at the pool %d times in a second with no release, want at most one every few milliseconds", looks)
	}
	close(hold)
	if err := <-straight; !postgres.NoSlotLeft(err) {
		t.Errorf("the query straight on the pool = %v, want the refusal (53300)", err)
	}
	held.Release()
	if err := call.wait(); err != nil {
		t.Errorf("the call in line = %v, want it served", err)
	}
}

// Once the line's probes have grown the pool back to its size (slots
// freed on the server), the pool asks PostgreSQL for no session, and a
// call that comes while calls still wait in line waits in pgxpool's own
// queue, as on any pool at its size: it is not counted as a wait for a
// slot, and a read ahead (AcquireUnlessNoSlot) waits for a connection
// rather than fail with a refusal that no longer holds. Before, a line
// once formed lasted for as long as the load kept a call in it: with 32
// callers on a pool of 8, every call of the 5 s after the limit was raised
// was counted in SlotWaits (14,000, the pool 8 of 8), so that
// ExportPostgresNoSlotToGrow would go on firing on a pool merely busy,
// and every read ahead failed at once with the old refusal.
func TestALineEndsOnceThePoolIsBackToItsSize(t *testing.T) {
	ctx := context.Background()
	pool, limit := slotLimitedPool(t)
	limit(1)
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	served := make(chan int, 5)
	var calls []*slotCall
	for n := 1; n <= 5; n++ {
		callCtx, hangUp := context.WithTimeout(ctx, time.Minute)
		c := &slotCall{n: n, done: make(chan struct{}), hangUp: hangUp}
		go func() {
			defer close(c.done)
			defer hangUp()
			c.err = postgres.AcquireFunc(callCtx, pool, func(*pgxpool.Conn) error {
				served <- n
				<-release
				return nil
			})
		}()
		calls = append(calls, c)
		untilWaiting(pool, int64(n), c.done)
	}
	limit(4)
	for range 3 { // on the three connections the probes grew: the pool is full, two calls in line
		<-served
	}
	// A call and a read ahead come, and end at their deadline, no
	// connection coming free meanwhile.
	var comerErr, aheadErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		callCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		comerErr = postgres.AcquireFunc(callCtx, pool, func(*pgxpool.Conn) error { return nil })
	})
	wg.Go(func() {
		aheadCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		var conn *pgxpool.Conn
		if conn, aheadErr = postgres.AcquireUnlessNoSlot(aheadCtx, pool); aheadErr == nil {
			conn.Release()
		}
	})
	wg.Wait()
	if !errors.Is(aheadErr, context.DeadlineExceeded) || hasCode(aheadErr, "53300") {
		t.Errorf("AcquireUnlessNoSlot on the full pool = %v, want it to wait for a connection until its deadline", aheadErr)
	}
	if !errors.Is(comerErr, context.DeadlineExceeded) {
		t.Errorf("a call on the full pool = %v, want it to wait for a connection until its deadline", comerErr)
	}
	if waits, _ := postgres.SlotWaits(pool); waits != 5 {
		t.Errorf("SlotWaits = %d, want 5: the calls that came while the pool was held below its size", waits)
	}
	close(release)
	held.Release()
	for _, c := range calls {
		if err := c.wait(); err != nil {
			t.Errorf("call %d = %v, want it served", c.n, err)
		}
	}
}
