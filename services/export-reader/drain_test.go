package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A list page in flight at SIGTERM, waiting on export_items' table lock (a
// migration's) past the services' usual 10 s drain but within its
// EXPORT_READER_QUERY_TIMEOUT, is answered once the lock goes: 200 with its
// items. Drained for 10 s, the reader cut it off there: its connection was
// closed or it was answered 503 "the reader is shutting down", although
// its own bound would have let it be answered.
func TestAPageInFlightAtTheStopIsAnsweredWithinItsOwnTimeout(t *testing.T) {
	t.Parallel()
	// No delay before the drain: the lock is released 11 s after the
	// drain begins, within the page's 20 s from before SIGTERM (13 s left
	// about 2 s for the lock wait, the signal and the drain's start, which
	// a loaded machine can take).
	r := startReader(t, 1, map[string]string{"EXPORT_READER_QUERY_TIMEOUT": "20s", "EXPORT_READER_SHUTDOWN_DELAY": "0s"})
	setup, owner, addr, out, stop, done := r.setup, r.owner, r.addr, r.out, r.stop, r.done
	ctx := context.Background()

	lock := lockTable(t, setup)
	answered := testenv.AnswerLater(func() (*http.Response, error) { return signedGet(addr, "/v1/export/items", owner) })
	testenv.WaitForALockWait(t, setup, serviceName)
	stop() // SIGTERM, while the page waits for the table
	out.WaitFor(t, `"msg":"draining"`)
	time.Sleep(httpserver.DefaultShutdownTimeout + time.Second)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	a := <-answered
	if a.Err != nil {
		t.Fatalf("the page in flight at the stop got no answer: %v\n%s", a.Err, out.String())
	}
	if a.Status != http.StatusOK || !strings.Contains(string(a.Body.Data), `"id":"coin-1"`) {
		t.Errorf("the page in flight at the stop = %d %s %+v, want 200 with coin-1", a.Status, a.Body.Data, a.Body.Error)
	}
	if err := <-done; err != nil {
		t.Errorf("run() = %v, want nil after a clean stop", err)
	}
	if strings.Contains(out.String(), "export read cut off") {
		t.Errorf("the drain cut the page off:\n%s", out.String())
	}
}

// A stopping reader closes the gateway's kept-alive connections while its
// listener still serves (EXPORT_READER_SHUTDOWN_DELAY): a page asked for on
// one that moment, unread, is asked for again on a new connection and
// answered. Closed by the drain after the listener, its repeat was refused
// and the client got a 502 (13 in 6 restarts of a lone reader under 8
// syncing clients). The same holds for sales (sales-writer's
// TestAConnectionClosedAtTheStopLeavesItsRepeatAListener).
func TestAConnectionClosedAtTheStopLeavesItsRepeatAListener(t *testing.T) {
	t.Parallel()
	r := startReader(t, 1, nil)
	kept, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	req, err := signedRequest(r.addr, "/v1/export/items", r.owner)
	if err != nil {
		t.Fatal(err)
	}
	resp := testenv.SendOn(t, kept, req) // the deadline it sets holds the read after the stop too
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the page before the stop = %d; want 200", resp.StatusCode)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	r.stop() // SIGTERM
	if n, err := kept.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("the kept-alive connection, after the stop: read %d bytes, %v; want it closed", n, err)
	}
	// The gateway's repeat, on a new connection.
	if req, err = signedRequest(r.addr, "/v1/export/items", r.owner); err != nil {
		t.Fatal(err)
	}
	again, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("the repeat found the reader's listener closed (the gateway's 502): %v\n%s", err, r.out.String())
	}
	again.Body.Close()
	if again.StatusCode != http.StatusOK {
		t.Errorf("the repeat = %d, want 200", again.StatusCode)
	}
	if err := <-r.done; err != nil {
		t.Errorf("run() = %v, want nil after a clean stop", err)
	}
}

// startedReader is a reader serving (run) on a database of its own, with
// an owner's items: stop sends it SIGTERM, done gets run's error.
type startedReader struct {
	setup                  *pgxpool.Pool
	owner, addr, adminAddr string
	out                    *testenv.Output
	stop                   context.CancelFunc
	done                   chan error
}

// startReader starts a reader with settings, once an owner has items
// coin-1 to coin-n, and waits until it is ready.
func startReader(t *testing.T, items int, settings map[string]string) startedReader {
	t.Helper()
	dsn := testenv.PostgresURL(t)
	r := startedReader{setup: testenv.Pool(t, dsn), addr: testenv.FreeAddr(t), adminAddr: testenv.FreeAddr(t), out: &testenv.Output{}, done: make(chan error, 1)}
	ctx := context.Background()
	if err := r.setup.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&r.owner); err != nil {
		t.Fatal(err)
	}
	if _, err := r.setup.Exec(ctx, `INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		SELECT $1, 'coin-' || n, true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"coin-' || n || '"', '"id":"coin-' || n || '"', '"id":"coin-' || n || '"', now()
		FROM generate_series(1, $2::int) AS n`, r.owner, items); err != nil {
		t.Fatal(err)
	}
	if options, ok := settings[dsnOptions]; ok {
		dsn += " " + options
		delete(settings, dsnOptions)
	}
	vars := map[string]string{"DATABASE_URL": dsn, "CURSOR_SECRET": cursorSecret, "IDENTITY_SECRET": secret,
		"EXPORT_READER_ADDR": r.addr, "EXPORT_READER_ADMIN_ADDR": r.adminAddr}
	maps.Copy(vars, settings)
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	r.stop = stop
	go func() { r.done <- run(runCtx, env(vars), r.out) }()
	waitReady(t, "http://"+r.addr+"/healthz", r.out)
	return r
}

// dsnOptions is a key of startReader's settings whose value is added to
// DATABASE_URL's options.
const dsnOptions = "dsn options"

// signedGet sends a GET of path to the reader at addr with the identity
// of a key of owner that may read the export.
func signedGet(addr, path, owner string) (*http.Response, error) {
	req, err := signedRequest(addr, path, owner)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

// signedRequest is a GET of path from the reader at addr, signed as the
// gateway signs for owner.
func signedRequest(addr, path, owner string) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	signer, err := identity.NewSigner(secret)
	if err != nil {
		return nil, err
	}
	id := identity.Identity{OwnerID: owner, KeyID: "k", Scopes: []string{identity.ScopeExportRead}, RequestID: "req-stop"}
	for _, h := range signer.Sign(id, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	return req, nil
}

// waitReady waits until the reader's health check answers 200.
func waitReady(t *testing.T, url string, out *testenv.Output) {
	t.Helper()
	for range 400 {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the reader never became ready:\n%s", out.String())
}

// A page read ahead in the background (for a sync's next request) that
// waits on export_items' lock when the drain has ended does not hold the
// reader's stop: nothing will ask for it. Left to its own bound
// (EXPORT_READER_QUERY_TIMEOUT, here an hour), it held the pool's Close,
// and so the stop, past the drain and the grace period counted for it,
// for as long as the lock lasted: a migration's, in the rollout that
// stops the old readers.
func TestAReadAheadWaitingOnALockDoesNotHoldTheStop(t *testing.T) {
	t.Parallel()
	// Pages read ahead are stale at once, so that the second page's
	// request reads its page itself, one statement, and starts a new
	// read-ahead once answered. The first lock below must be waited on
	// by that statement and nothing else, else the statement comes after
	// the second lock and is never answered (CI runs hung here 10
	// minutes): so three items, which the first page's read-ahead reads
	// in one query (two pages, and the end found by the row after them;
	// with four its second query could come after the first lock), and
	// every statement sent in one round trip (exec mode): on a pool
	// connection new to it, pgx's statement cache sent a Prepare first,
	// which parses, so waits on the lock as the statement does, and the
	// statement itself came after the second lock (a CI run's dump had
	// the request in Prepare).
	r := startReader(t, 3, map[string]string{"EXPORT_READER_QUERY_TIMEOUT": "1h", "EXPORT_READER_READ_AHEAD_TTL": "1ms",
		dsnOptions: "default_query_exec_mode=exec"})
	setup, owner, addr, out, stop, done := r.setup, r.owner, r.addr, r.out, r.stop, r.done
	ctx := context.Background()
	firstPage := getPage(t, addr, "/v1/export/items?limit=1", owner)
	if firstPage.Meta.NextCursor == nil {
		t.Fatalf("the first page has no next cursor: %s", firstPage.Data)
	}
	// The first page's read-ahead of the second must be over before the
	// table is locked: on a loaded machine it started late, came to wait
	// on the lock first, and the second page's request, queued behind
	// the second lock, was never answered (a CI run hung here 10 minutes).
	waitForAPageReadAhead(t, r.adminAddr)
	time.Sleep(10 * time.Millisecond) // past the read-ahead's TTL

	// The second page waits behind one lock on the table, a second lock
	// waits behind the page: once the first goes, the page is read and
	// answered, and the read-ahead it starts waits behind the second,
	// which the test holds until the reader has stopped.
	first := lockTable(t, setup)
	answered := make(chan envelope.Parsed, 1)
	go func() {
		answered <- getPage(t, addr, "/v1/export/items?limit=1&cursor="+url.QueryEscape(*firstPage.Meta.NextCursor), owner)
	}()
	testenv.WaitForALockWait(t, setup, serviceName)
	second, err := setup.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Rollback(ctx)
	secondLocked := make(chan error, 1)
	go func() {
		_, err := second.Exec(ctx, "LOCK TABLE export_items IN ACCESS EXCLUSIVE MODE")
		secondLocked <- err
	}()
	waitForLockWaits(t, setup, 2)
	if err := first.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-secondLocked; err != nil {
		t.Fatal(err)
	}
	<-answered
	testenv.WaitForALockWait(t, setup, serviceName) // the read-ahead

	stop() // SIGTERM, nothing in flight, a read-ahead waiting on the lock
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run() = %v, want nil after a clean stop", err)
		}
	case <-time.After(time.Minute):
		second.Rollback(ctx) // the read-ahead ends, and the stop with it
		<-done
		t.Fatalf("the reader did not stop within a minute of SIGTERM, with nothing in flight and a read-ahead waiting on a lock:\n%s", out.String())
	}
}

// waitForAPageReadAhead waits until the reader whose admin listener is at
// adminAddr holds the bytes of a page it read ahead.
func waitForAPageReadAhead(t *testing.T, adminAddr string) {
	t.Helper()
	for range 500 {
		if heldReadAheadBytes(t, adminAddr) > 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the reader never held a page read ahead")
}

// heldReadAheadBytes reads export_reader_read_ahead_bytes from the
// reader's /metrics at adminAddr.
func heldReadAheadBytes(t *testing.T, adminAddr string) float64 {
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(body)) {
		if value, ok := strings.CutPrefix(strings.TrimSpace(line), "export_reader_read_ahead_bytes "); ok {
			held, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("export_reader_read_ahead_bytes %q: %v", value, err)
			}
			return held
		}
	}
	t.Fatalf("no export_reader_read_ahead_bytes in /metrics:\n%s", body)
	return 0
}

// getPage gets a list page of owner's from the reader at addr; anything
// but a 200 fails the test.
func getPage(t *testing.T, addr, path, owner string) envelope.Parsed {
	resp, err := signedGet(addr, path, owner)
	if err != nil {
		t.Error(err)
		return envelope.Parsed{}
	}
	defer resp.Body.Close()
	var page envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s = %d %+v (%v), want 200", path, resp.StatusCode, page.Error, err)
	}
	return page
}

// lockTable takes export_items' ACCESS EXCLUSIVE lock in a transaction of
// db's, rolled back at the test's end if not before.
func lockTable(t *testing.T, db *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(context.Background(), "LOCK TABLE export_items IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitForLockWaits waits until n sessions of db's database wait for a lock.
func waitForLockWaits(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	for range 500 {
		var waiting int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%d sessions never came to wait for a lock", n)
}
