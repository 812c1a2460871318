package main

import (
	"context"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A writer stopped while a commit group of several calls is in flight, in
// its COMMIT: here every commit waits for a synchronous standby that never
// comes (synchronous_standby_names names none that is there), so the
// groups stay in their COMMIT until a call's own bound ends it. Every call
// must be answered (the envelope, with a status; no connection dropped
// while the drain lasts), each answer true to the database afterwards
// (none tells a sale done that its commit never confirmed, none says
// nothing was applied of a sale its key holds), and run must end within
// its drain. Drained for 1 s, every call's connection was closed unanswered
// (EOF); with a call that leaves its group in flight told, as one never
// sent, that nothing was applied, a call of the group was told so while
// its sale committed.
func TestAStopWithACommitGroupInItsCommitAnswersEveryCall(t *testing.T) {
	items := []string{"coin-0", "coin-1", "coin-2", "coin-3"}
	w := startWriterAwaitingAStandby(t, items, nil)

	// Sent at once: the first runs as a group of one and waits in its
	// COMMIT; those arriving meanwhile form the next group, which does too.
	answers := make([]<-chan testenv.Answer, len(items))
	for i, item := range items {
		answers[i] = testenv.AnswerLater(func() (*http.Response, error) { return confirmOf(w.addr, w.owner, item) })
	}
	// Every call's statement has run (its key's lock, sales.keyLock's
	// class, is held to its commit), and fewer commits wait than calls: a
	// group of several is in its COMMIT.
	n := strconv.Itoa(len(items))
	testenv.WaitUntilTrue(t, w.admin, `SELECT (`+heldKeyLocks+`) = `+n+`
		AND (SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sales-writer' AND wait_event = 'SyncRep') < `+n)
	w.stop() // SIGTERM

	for i, a := range w.answersAfterTheStop(t, answers) {
		recorded := w.recorded(t, items[i])
		switch {
		case a.Status == http.StatusOK:
			t.Errorf("the confirm of %s = 200 while its commit waited for a standby that never confirmed it", items[i])
		case nothingApplied(a) && recorded:
			t.Errorf("the confirm of %s = %d %+v, saying nothing was applied, but its key holds its record", items[i], a.Status, a.Body.Error)
		}
		t.Logf("the confirm of %s = %d %+v (its record stored: %t)", items[i], a.Status, a.Body.Error, recorded)
	}
}

// A writer stopped while a commit group waits for a pool connection (the
// pool's one connection held by a group in its COMMIT, waiting for a
// standby that never comes): the waiting group's calls were never sent,
// and are answered so, "nothing was applied", within the drain, their
// keys holding no record; the call in its COMMIT is answered that it may
// have been applied; run ends within its drain.
func TestAStopWithACommitGroupWaitingForAConnectionAnswersEveryCall(t *testing.T) {
	items := []string{"coin-0", "coin-1", "coin-2", "coin-3"}
	w := startWriterAwaitingAStandby(t, items, map[string]string{"SALES_WRITER_DB_MAX_CONNS": "1"})

	first := testenv.AnswerLater(func() (*http.Response, error) { return confirmOf(w.addr, w.owner, items[0]) })
	testenv.WaitUntilTrue(t, w.admin, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'sales-writer' AND wait_event = 'SyncRep')`)
	answers := []<-chan testenv.Answer{first}
	for _, item := range items[1:] {
		answers = append(answers, testenv.AnswerLater(func() (*http.Response, error) { return confirmOf(w.addr, w.owner, item) }))
	}
	// The other calls reach the writer, and their group the pool, within
	// this; one that came later would be refused as the writer stops,
	// nothing applied as well, and this test would not tell.
	time.Sleep(300 * time.Millisecond)
	if held, err := w.heldKeyLocks(); err != nil || held != 1 {
		t.Fatalf("%d keys' locks held by the writer (%v), want 1: the group of the other calls got a connection", held, err)
	}
	w.stop() // SIGTERM

	// A waiting call is sent once the connection comes free, when the
	// first call's bound ends it, if its own bound has not ended first:
	// which of them are depends on when each arrived (one .ci/run saw the
	// last of them sent, its sale committed, answered "may"). Here a call
	// sent commits on the primary (its commit's wait cut at its bound), so
	// a call without a record was never sent and must be told nothing was
	// applied, and one with a record must not be.
	unsent := 0
	for i, a := range w.answersAfterTheStop(t, answers) {
		recorded := w.recorded(t, items[i])
		switch {
		case i == 0 && (a.Status != http.StatusServiceUnavailable || nothingApplied(a)):
			t.Errorf("the confirm of %s, in its COMMIT = %d %+v, want 503 that it may have been applied", items[i], a.Status, a.Body.Error)
		case i > 0 && a.Status != http.StatusServiceUnavailable:
			t.Errorf("the confirm of %s, its group waiting for a connection = %d %+v, want 503", items[i], a.Status, a.Body.Error)
		case i > 0 && !recorded && !nothingApplied(a):
			t.Errorf("the confirm of %s, its group waiting for a connection = %d %+v, its key holding no record: want nothing applied",
				items[i], a.Status, a.Body.Error)
		case i > 0 && recorded && nothingApplied(a):
			t.Errorf("the confirm of %s = %d %+v, saying nothing was applied, but its key holds its record", items[i], a.Status, a.Body.Error)
		case i > 0 && !recorded:
			unsent++
		}
		t.Logf("the confirm of %s = %d %+v (its record stored: %t)", items[i], a.Status, a.Body.Error, recorded)
	}
	if unsent == 0 {
		t.Errorf("every waiting call was sent before its bound: no call of a group waiting for a connection was answered; the test proves nothing")
	}
}

// heldKeyLocks counts the keys' locks (sales.keyLock's class) the writer's
// sessions hold: one per call whose statement has run, held to its commit.
const heldKeyLocks = `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	WHERE a.application_name = 'sales-writer' AND l.locktype = 'advisory' AND l.classid = 1801812339 AND l.granted`

// writerAwaitingAStandby is a writer whose every commit waits for a
// synchronous standby that never comes (synchronous_standby_names names
// none that is there), so that its commit groups stay in their COMMIT
// until a call's own bound ends it.
type writerAwaitingAStandby struct {
	admin        *pgxpool.Pool
	owner, addr  string
	stop         func()
	done         <-chan error
	out          *testenv.Output
	queryTimeout time.Duration
}

// startWriterAwaitingAStandby starts such a writer, with vars over its
// configuration, for an owner of items on the platform market-a.
func startWriterAwaitingAStandby(t *testing.T, items []string, vars map[string]string) *writerAwaitingAStandby {
	ctx := context.Background()
	pair := testenv.StandbyPair(t)
	w := &writerAwaitingAStandby{admin: testenv.Pool(t, pair.Primary), addr: testenv.FreeAddr(t), queryTimeout: 2 * time.Second}
	if err := w.admin.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&w.owner); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []struct {
		sql  string
		args []any
	}{
		{"INSERT INTO platforms (id) VALUES ('market-a')", nil},
		{`INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		  SELECT $1, i, true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"' || i || '"', '"id":"' || i || '"', '"id":"' || i || '"', now()
		  FROM unnest($2::text[]) AS i`, []any{w.owner, items}},
		// Every commit waits for a synchronous standby of that name.
		{"ALTER SYSTEM SET synchronous_standby_names = 'nothere'", nil},
		{"SELECT pg_reload_conf()", nil},
	} {
		if _, err := w.admin.Exec(ctx, stmt.sql, stmt.args...); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitUntilTrue(t, w.admin, "SELECT setting = 'nothere' FROM pg_settings WHERE name = 'synchronous_standby_names'")
	config := map[string]string{
		"DATABASE_URL": pair.Primary + " synchronous_commit=on", "IDENTITY_SECRET": secret,
		"SALES_WRITER_ADDR": w.addr, "SALES_WRITER_ADMIN_ADDR": testenv.FreeAddr(t),
		"SALES_WRITER_QUERY_TIMEOUT": w.queryTimeout.String(), "SALES_WRITER_SHUTDOWN_DELAY": "0s",
		"SALES_WRITER_COMMIT_GROUPS": "1",
	}
	maps.Copy(config, vars)
	w.stop, w.done, w.out = startWriter(t, ctx, config)
	return w
}

// heldKeyLocks is heldKeyLocks' count.
func (w *writerAwaitingAStandby) heldKeyLocks() (held int, err error) {
	err = w.admin.QueryRow(context.Background(), heldKeyLocks).Scan(&held)
	return held, err
}

// answersAfterTheStop waits for each answer, and for run's end, each
// within the drain and 5 s, and for the commits cut off to end (then the
// database holds what it will); it fails the test for a call answered
// without the envelope, and for a call the drain cut off.
func (w *writerAwaitingAStandby) answersAfterTheStop(t *testing.T, answers []<-chan testenv.Answer) []testenv.Answer {
	t.Helper()
	bound := drainTime(Config{QueryTimeout: w.queryTimeout}) + 5*time.Second
	got := make([]testenv.Answer, len(answers))
	for i, answered := range answers {
		select {
		case got[i] = <-answered:
		case <-time.After(bound):
			t.Fatalf("call %d not answered within the drain and 5 s:\n%s", i, w.out.String())
		}
	}
	select {
	case err := <-w.done:
		if err != nil {
			t.Errorf("run() = %v, want nil after a clean stop", err)
		}
	case <-time.After(bound):
		t.Fatalf("run did not end within its drain and 5 s:\n%s", w.out.String())
	}
	testenv.WaitUntilTrue(t, w.admin, "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'SyncRep')")
	for i, a := range got {
		if a.Err != nil || a.Body.Meta.RequestID == "" {
			t.Fatalf("call %d got no answer, or no envelope: %v %+v", i, a.Err, a.Body)
		}
	}
	if strings.Contains(w.out.String(), "sale call cut off") {
		t.Errorf("the drain cut a call off:\n%s", w.out.String())
	}
	return got
}

// recorded reports whether the key of item's confirm holds its record.
func (w *writerAwaitingAStandby) recorded(t *testing.T, item string) bool {
	t.Helper()
	var recorded bool
	if err := w.admin.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM idempotency_records
		WHERE owner_id = $1 AND platform_id = 'market-a' AND idempotency_key = $2)`, w.owner, "k-"+item).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	return recorded
}

// nothingApplied reports whether a says that nothing of its call was
// applied.
func nothingApplied(a testenv.Answer) bool {
	return a.Body.Error != nil && strings.Contains(a.Body.Error.Message, "nothing was applied")
}

// confirmOf sends a signed confirm of owner's item under the key
// "k-<item>", as the gateway does.
func confirmOf(addr, owner, item string) (*http.Response, error) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/export/items/"+item+"/sales/confirm",
		strings.NewReader(`{"external_order_id":"o-`+item+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-"+item)
	signer, _ := identity.NewSigner(secret)
	id := identity.Identity{OwnerID: owner, PlatformID: "market-a", KeyID: "k",
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-" + item}
	for _, h := range signer.Sign(id, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	return http.DefaultClient.Do(req)
}
