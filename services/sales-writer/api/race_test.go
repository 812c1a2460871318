package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
)

// instances starts n service instances, each with its own connection pool,
// on f's database: what several replicas behind the gateway are.
func instances(t *testing.T, f *fixture, n int) []http.Handler {
	t.Helper()
	hs := make([]http.Handler, n)
	for i := range hs {
		hs[i] = newHandler(t, testenv.Pool(t, f.url+" pool_max_conns=6"), defaultRetention)
	}
	return hs
}

type answer struct {
	status   int
	code     string
	replay   any
	platform string
}

// Every platform tries to sell every item at the same time, through three
// service instances: each item is sold exactly once.
func TestConcurrentConfirmsSellEachItemOnce(t *testing.T) {
	t.Parallel()
	const items, platforms = 200, 8
	f := newFixture(t)
	for i := range items {
		f.addItem(t, f.owner, fmt.Sprintf("coin-%d", i), true)
	}
	for p := 2; p < platforms; p++ { // market-a and market-b exist
		f.addPlatform(t, fmt.Sprintf("market-%d", p))
	}
	names := []string{"market-a", "market-b"}
	for p := 2; p < platforms; p++ {
		names = append(names, fmt.Sprintf("market-%d", p))
	}
	hs := instances(t, f, 3)

	answers := make([][]answer, items)
	for i := range answers {
		answers[i] = make([]answer, platforms)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for p, name := range names {
		wg.Go(func() {
			<-start
			for i := range items {
				item := fmt.Sprintf("coin-%d", i)
				rec, env := serve(t, hs[(p+i)%len(hs)], f.signer, call{id: f.writer(name), op: "confirm", item: item,
					key: "k-" + item, body: `{"external_order_id":"` + name + `-` + item + `"}`})
				answers[i][p] = answer{status: rec.Code, code: errorCode(env), platform: name}
			}
		})
	}
	close(start)
	wg.Wait()

	for i, row := range answers {
		wins := 0
		for _, a := range row {
			switch {
			case a.status == 200:
				wins++
			case a.status == 409 && a.code == "item_already_sold":
			default:
				t.Errorf("coin-%d by %s = %d %q, want 200 or 409 item_already_sold", i, a.platform, a.status, a.code)
			}
		}
		if wins != 1 {
			t.Errorf("coin-%d was sold %d times, want 1", i, wins)
		}
	}
	if n := f.count(t, "SELECT count(*) FROM sales WHERE canceled_at IS NULL"); n != items {
		t.Errorf("open sales = %d, want %d", n, items)
	}
	if n := f.count(t, "SELECT count(*) FROM export_items WHERE sold AND status = 'inactive'"); n != items {
		t.Errorf("sold items = %d, want %d", n, items)
	}
	if n := f.count(t, "SELECT count(*) FROM idempotency_records"); n != items {
		t.Errorf("idempotency records = %d, want %d (one per 200)", n, items)
	}
}

// Twenty identical requests with one Idempotency-Key at once: one executes,
// the others replay it or are told it is in progress.
func TestIdenticalRequestsInFlightExecuteOnce(t *testing.T) {
	t.Parallel()
	const n = 20
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	hs := instances(t, f, 2)
	for _, op := range []string{"confirm", "cancel"} {
		answers := make([]answer, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				rec, env := serve(t, hs[i%len(hs)], f.signer, call{id: f.writer("market-a"), op: op, item: "coin-1",
					key: op + "-key", body: order1})
				a := answer{status: rec.Code, code: errorCode(env)}
				if rec.Code == 200 {
					a.replay = result(t, env)["idempotent_replay"]
				}
				answers[i] = a
			})
		}
		close(start)
		wg.Wait()

		executed := 0
		for i, a := range answers {
			switch {
			case a.status == 200 && a.replay == false:
				executed++
			case a.status == 200 && a.replay == true:
			case a.status == 409 && a.code == "request_in_progress":
			default:
				t.Errorf("%s #%d = %+v, want 200 or 409 request_in_progress", op, i, a)
			}
		}
		if executed != 1 {
			t.Errorf("%s executed %d times, want 1", op, executed)
		}
	}
	if got := f.count(t, "SELECT count(*) FROM sales"); got != 1 {
		t.Errorf("sale rows = %d, want 1", got)
	}
	// One confirm and one cancel changed the item: its updated_at is the
	// cancel's, and the one sale is closed.
	if got := f.count(t, `SELECT count(*) FROM sales s JOIN export_items i ON i.owner_id = s.owner_id AND i.id = s.item_id
		WHERE s.canceled_at IS NOT NULL AND i.updated_at >= s.canceled_at AND NOT i.sold`); got != 1 {
		t.Errorf("closed sales with a restored item = %d, want 1", got)
	}
}

// Confirms and cancels by several platforms churn on a few items: no call
// fails with a 5xx, and every item's sold flag matches its open sale.
func TestConfirmCancelChurnKeepsItemsConsistent(t *testing.T) {
	t.Parallel()
	const items, rounds = 5, 30
	f := newFixture(t)
	for i := range items {
		f.addItem(t, f.owner, fmt.Sprintf("coin-%d", i), true)
	}
	hs := instances(t, f, 2)
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for p, name := range []string{"market-a", "market-b"} {
		for worker := range 2 {
			wg.Go(func() {
				for r := range rounds {
					item := fmt.Sprintf("coin-%d", r%items)
					order := fmt.Sprintf(`{"external_order_id":"%s-%d-%d"}`, name, worker, r)
					for _, op := range []string{"confirm", "cancel"} {
						rec, _ := serve(t, hs[(p+worker)%len(hs)], f.signer, call{id: f.writer(name), op: op, item: item,
							key: fmt.Sprintf("%s-%d-%d", op, worker, r), body: order})
						mu.Lock()
						statuses[rec.Code]++
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	for status, n := range statuses {
		if status != 200 && status != 409 {
			t.Errorf("%d answers with status %d, want only 200 and 409", n, status)
		}
	}
	if statuses[200] == 0 {
		t.Errorf("no call succeeded: %v", statuses)
	}
	mismatched := f.count(t, `SELECT count(*) FROM export_items i
		WHERE i.sold <> EXISTS (SELECT FROM sales s WHERE s.owner_id = i.owner_id AND s.item_id = i.id AND s.canceled_at IS NULL)`)
	if mismatched != 0 {
		t.Errorf("items whose sold flag disagrees with their sales = %d, want 0", mismatched)
	}
}

// One Idempotency-Key sent at once with different requests (ten items): one
// executes; the others are refused and leave nothing behind.
func TestOneKeyForDifferentRequestsInFlight(t *testing.T) {
	t.Parallel()
	const n = 10
	f := newFixture(t)
	for i := range n {
		f.addItem(t, f.owner, fmt.Sprintf("coin-%d", i), true)
	}
	hs := instances(t, f, 2)
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			rec, env := serve(t, hs[i%len(hs)], f.signer, call{id: f.writer("market-a"), op: "confirm",
				item: fmt.Sprintf("coin-%d", i), key: "shared-key", body: order1})
			answers[i] = answer{status: rec.Code, code: errorCode(env)}
		})
	}
	close(start)
	wg.Wait()
	executed := 0
	for i, a := range answers {
		switch {
		case a.status == 200:
			executed++
		case a.status == 409 && (a.code == "idempotency_conflict" || a.code == "request_in_progress"):
		default:
			t.Errorf("confirm coin-%d = %+v, want 200 or 409 idempotency_conflict", i, a)
		}
	}
	if executed != 1 {
		t.Errorf("%d requests executed, want 1", executed)
	}
	if got := f.count(t, "SELECT count(*) FROM export_items WHERE sold"); got != 1 {
		t.Errorf("sold items = %d, want 1", got)
	}
	if got := f.count(t, "SELECT count(*) FROM sales") + f.count(t, "SELECT count(*) FROM idempotency_records"); got != 2 {
		t.Errorf("sale rows + idempotency records = %d, want 2", got)
	}
}

// A retry of a sale that arrives while its first attempt still waits for
// the item's row lock (the first attempt's answer lost: its writer killed,
// or the gateway's read timed out, while its statements, sent in one round
// trip, stay queued in PostgreSQL) waits behind it on the key's lock and
// replays what it did: the same result, timestamps included, and one sale.
// Seen on a make run stack: 12 confirms waited on locked rows when their
// writer was killed (-9), their backends committed once the rows were free,
// and the 7 retries sent while they still waited replayed them. Three
// things make the retry a replay, and each alone passes this test: the
// key's lock (the retry's statement starts once the first attempt has
// committed, and sees its record), explain (a retry that queued on the row
// and found it sold reads the record committed meanwhile), and bindRefused
// (a refusal loses to a record of its key). With the three gone, the retry
// was refused 409, its platform told that its own sale failed.
func TestARetryBehindItsFirstAttemptOnALockedItemReplaysIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	hs := instances(t, f, 2)
	// Registered before the row is locked, so run after its rollback: a
	// test that fails early still waits for its calls, which log.
	var sending sync.WaitGroup
	t.Cleanup(sending.Wait)
	holder := lockItem(t, f, "coin-1")
	confirm := call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1}
	first, retry := make(chan map[string]any, 1), make(chan map[string]any, 1)
	send := func(h http.Handler, to chan<- map[string]any) {
		var got map[string]any
		// Deferred, so that serve's or result's t.Fatalf, which ends this
		// goroutine, still answers (nil) instead of leaving the test
		// waiting for the answer until its binary times out.
		defer func() { to <- got }()
		rec, env := serve(t, h, f.signer, confirm)
		if rec.Code != http.StatusOK {
			t.Errorf("confirm = %d %s, want 200", rec.Code, rec.Body)
			return
		}
		got = result(t, env)
	}
	sending.Go(func() { send(hs[0], first) })
	firstPid := waitBlockedBy(t, f, backendPid(t, holder))
	sending.Go(func() { send(hs[1], retry) })
	waitBlockedBy(t, f, firstPid)
	if err := holder.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, b := <-first, <-retry
	if a == nil || b == nil {
		return
	}
	if a["idempotent_replay"] != false || b["idempotent_replay"] != true {
		t.Errorf("idempotent_replay = %v then %v, want false then true", a["idempotent_replay"], b["idempotent_replay"])
	}
	b["idempotent_replay"] = false
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("the retry answered %v, the first attempt %v: want the same result", b, a)
	}
	if n := f.count(t, "SELECT count(*) FROM sales"); n != 1 {
		t.Errorf("sales = %d, want 1", n)
	}
}

func backendPid(t *testing.T, tx pgx.Tx) int {
	t.Helper()
	var pid int
	if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitBlockedBy waits until a backend of f's database waits for a lock
// that backend pid holds (or waits for before it), and returns its pid.
func waitBlockedBy(t *testing.T, f *fixture, pid int) int {
	t.Helper()
	for range 1000 {
		var blocked int
		err := f.db.QueryRow(context.Background(), `SELECT coalesce(min(pid), 0) FROM pg_stat_activity
			WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&blocked)
		if err != nil {
			t.Fatal(err)
		}
		if blocked != 0 {
			return blocked
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no backend waited for backend %d within 10 s", pid)
	return 0
}
