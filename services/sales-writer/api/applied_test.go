package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A sale refused before anything reached PostgreSQL (its connection was
// never opened: refused by the system, or by the server for want of a slot,
// a role or a database) was not applied, and its 503 says so: it said "the
// sale may have been applied", which sends a sales platform reconciling for
// nothing. The key binds nothing then: the same call with it runs anew.
func TestRefusedBeforeTheDatabaseSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	cfg, err := pgxpool.ParseConfig(f.url)
	if err != nil {
		t.Fatal(err)
	}
	role := cfg.ConnConfig.Database // unique to this test, as roles are the cluster's
	f.exec(t, "CREATE ROLE "+pgx.Identifier{role + "_nologin"}.Sanitize()+" NOLOGIN")
	f.exec(t, "CREATE ROLE "+pgx.Identifier{role + "_noslot"}.Sanitize()+" LOGIN CONNECTION LIMIT 0")
	t.Cleanup(func() {
		for _, r := range []string{role + "_nologin", role + "_noslot"} {
			_, _ = f.db.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize())
		}
	})
	refusing := testenv.RefusingAddr(t)

	tests := []struct {
		name   string
		change func(*pgxpool.Config) (undo func())
		want   string // in the log: what refused
	}{
		{"connection refused by the system", func(c *pgxpool.Config) func() {
			host, port, _ := net.SplitHostPort(refusing)
			c.ConnConfig.Host, c.ConnConfig.Port = host, parsePort(t, port)
			c.ConnConfig.Fallbacks = nil
			return func() {}
		}, "connection refused"},
		{"role made NOLOGIN (28000)", func(c *pgxpool.Config) func() {
			c.ConnConfig.User = role + "_nologin"
			return func() {}
		}, "28000"},
		{"no connection slot for the role (53300)", func(c *pgxpool.Config) func() {
			c.ConnConfig.User = role + "_noslot"
			return func() {}
		}, "53300"},
		{"database renamed (3D000)", func(*pgxpool.Config) func() {
			return testenv.RenameDatabase(t, f.url)
		}, "3D000"},
	}
	for _, tt := range tests {
		c := cfg.Copy()
		undo := tt.change(c)
		db, err := pgxpool.NewWithConfig(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		var logs testenv.Output
		f.handler = newLoggedHandler(t, db, defaultRetention, &logs)
		for _, op := range []string{"confirm", "cancel"} {
			rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
			if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
				!strings.Contains(env.Error.Message, "nothing was applied") || strings.Contains(env.Error.Message, "may have been") ||
				!strings.Contains(env.Error.Message, "same Idempotency-Key") {
				t.Errorf("%s, %s = %d %q %s, want 503 unavailable saying nothing was applied", tt.name, op, rec.Code, errorCode(env), rec.Body)
			}
		}
		if !strings.Contains(logs.String(), tt.want) {
			t.Errorf("%s: the log does not name %q:\n%s", tt.name, tt.want, logs.String())
		}
		db.Close()
		undo()
	}
	f.db.Reset() // the rename ended its sessions
	// Nothing was bound to the keys: the calls run anew.
	f.handler = newHandler(t, f.db, defaultRetention)
	confirmed(t, f, "key-confirm")
}

// A password changed under a running writer (rotated in PostgreSQL before
// DATABASE_URL) refuses each new connection, SQLSTATE 28P01, on a cluster
// that asks for it: a sale is 503 unavailable saying nothing was applied,
// and nothing was, its log line says what the operator must do, neither
// the log nor the answer holds a password, and once the password is set
// back the same call with the same key sells the item, with no restart.
func TestPasswordChangedUnderTheWriterSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	role := testenv.PasswordCluster(t)
	f := newFixtureOn(t, role.DSN)
	f.addItem(t, f.owner, "coin-1", true)
	var logs testenv.Output
	f.handler = newLoggedHandler(t, f.db, defaultRetention, &logs)
	restore := role.ChangePassword(t)
	f.db.Reset() // its sessions serve on: the next call connects anew
	for _, op := range []string{"confirm", "cancel"} {
		rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
		if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
			!strings.Contains(env.Error.Message, "nothing was applied") || !strings.Contains(env.Error.Message, "same Idempotency-Key") {
			t.Errorf("%s with the password changed = %d %q %s, want 503 unavailable saying nothing was applied", op, rec.Code, errorCode(env), rec.Body)
		}
		if strings.Contains(rec.Body.String(), role.Password) {
			t.Errorf("%s with the password changed: the answer holds the password: %s", op, rec.Body)
		}
	}
	if !strings.Contains(logs.String(), `"msg":"sale store unavailable"`) || !strings.Contains(logs.String(), "28P01") ||
		!strings.Contains(logs.String(), `"cause":"PostgreSQL refused the password of DATABASE_URL's role`) {
		t.Errorf("the log does not name the refusal, its SQLSTATE and what to do:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), role.Password) {
		t.Errorf("the log holds the password:\n%s", logs.String())
	}
	restore()
	if got := f.item(t, f.owner, "coin-1"); got.Sold || f.count(t, "SELECT count(*) FROM idempotency_records") != 0 {
		t.Fatalf("after the refused calls: coin-1 %+v, %d idempotency records; want it unsold, none", got, f.count(t, "SELECT count(*) FROM idempotency_records"))
	}
	confirmed(t, f, "key-confirm")
}

// A sale on a database past its guard against transaction-id wraparound
// (a year or more of sales with autovacuum held back: PostgreSQL refuses
// every write, SQLSTATE 54000, until an operator's VACUUM) is 503
// unavailable saying nothing was applied, and nothing was; its log line
// names the guard and what to do. It was a 500 internal_error, "the sale
// may have been applied", with no cause in the log.
func TestSaleRefusedByTheWraparoundGuardSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	cluster := testenv.NewWraparoundCluster(t)
	f := newFixtureOn(t, cluster.DSN)
	f.addItem(t, f.owner, "coin-1", true)
	var logs testenv.Output
	f.handler = newLoggedHandler(t, f.db, defaultRetention, &logs)
	cluster.Guard(t)
	f.db.Reset() // its sessions ended with the restart
	for _, op := range []string{"confirm", "cancel"} {
		rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
		if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
			!strings.Contains(env.Error.Message, "nothing was applied") || !strings.Contains(env.Error.Message, "same Idempotency-Key") {
			t.Errorf("%s past the wraparound guard = %d %q %s, want 503 unavailable saying nothing was applied", op, rec.Code, errorCode(env), rec.Body)
		}
	}
	if !strings.Contains(logs.String(), `"msg":"sale store unavailable"`) || !strings.Contains(logs.String(), "54000") ||
		!strings.Contains(logs.String(), `"cause":"PostgreSQL refuses to write, to avoid transaction-id wraparound`) {
		t.Errorf("the log does not name the refusal, its SQLSTATE and what to do:\n%s", logs.String())
	}
	if got := f.item(t, f.owner, "coin-1"); got.Sold || f.count(t, "SELECT count(*) FROM idempotency_records") != 0 {
		t.Errorf("after the refused calls: coin-1 %+v, %d idempotency records; want it unsold, none", got, f.count(t, "SELECT count(*) FROM idempotency_records"))
	}
}

// A sale that waited for a pool connection until its deadline (every
// connection of the pool in use) sent nothing to PostgreSQL, and its 503
// says nothing was applied: it said "the sale may have been applied", as
// a statement that ran past the timeout may have, which sent a platform
// reconciling for nothing. Its log line names the wait, not a statement
// timed out in the database; once a connection is free the same call
// with the same key sells the item.
func TestSaleThatWaitedForAConnectionSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	ctx := context.Background()
	const timeout = 300 * time.Millisecond // as TestSaleLockedPastTheQueryTimeoutIsA503's: the last sale runs under it
	one, err := postgres.Open(ctx, f.url+" pool_max_conns=1", postgres.StatementTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	held, err := one.Acquire(ctx) // the pool's one connection, busy until released
	if err != nil {
		t.Fatal(err)
	}
	// Released before one.Close, which waits for every connection to come
	// back: a check failing half-way left it held, and the test hung until
	// go test's timeout. A second Release does nothing.
	defer held.Release()
	var logs testenv.Output
	f.handler = newTimedHandler(t, one, defaultRetention, &logs, timeout)
	for _, op := range []string{"confirm", "cancel"} {
		rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
		if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
			!strings.Contains(env.Error.Message, "nothing was applied") || strings.Contains(env.Error.Message, "may have been") ||
			!strings.Contains(env.Error.Message, "same Idempotency-Key") {
			t.Errorf("%s with no pool connection free = %d %q %s, want 503 unavailable saying nothing was applied", op, rec.Code, errorCode(env), rec.Body)
		}
	}
	if !strings.Contains(logs.String(), "waiting for a pool connection") || strings.Contains(logs.String(), "timed out in the database") {
		t.Errorf("the log does not name the wait for a connection:\n%s", logs.String())
	}
	held.Release()
	confirmed(t, f, "key-confirm")
}

// A sale whose deadline came while its statement ran (here before the
// server's own statement_timeout) may have been applied, as far as the
// writer can know: its 503 still says so, unlike one that never got a
// connection.
func TestSaleCutByItsDeadlineMidStatementMayHaveBeenApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	lockItem(t, f, "coin-1")
	// f.db's sessions have no statement_timeout: the call's deadline
	// (100 ms and the grace) ends the wait, client-side.
	f.handler = newTimedHandler(t, f.db, defaultRetention, io.Discard, 100*time.Millisecond)
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1})
	if rec.Code != http.StatusServiceUnavailable || env.Error == nil || !strings.Contains(env.Error.Message, "may have been applied") {
		t.Errorf("confirm cut by its deadline mid-statement = %d %s, want 503 saying the sale may have been applied", rec.Code, rec.Body)
	}
}

// A sale whose connection is lost mid-statement, without a word from
// PostgreSQL (a network cut while the sale waited for the item's lock),
// may have been applied, as far as the writer can know (its backend has
// read the whole batch, commit included): its 503 still says so.
// PostgreSQL ending the session instead, with its FATAL, committed
// nothing (TestASaleTerminatedBeforeItsCommitSaysNothingWasApplied); this
// test ended it so, and now cuts the connection.
func TestConnectionLostMidSaleMayHaveBeenApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	testenv.InTransaction(t, f.db, "SELECT 1 FROM export_items WHERE id = 'coin-1' FOR UPDATE")
	relayed, cut := relayToPostgres(t, f.url)
	db, err := postgres.Open(context.Background(), relayed+" application_name=sales-cut")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	f.handler = newServer(t, db, defaultRetention, io.Discard, 10*time.Second).Handler()
	// The connection is cut once the sale waits for the holder's lock
	// (here, while the call runs in the test's goroutine: f.do may Fatal).
	go func() {
		for range 1000 {
			var waiting bool
			err := f.db.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE application_name = 'sales-cut' AND wait_event_type = 'Lock')`).Scan(&waiting)
			if err != nil || waiting {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		cut()
	}()
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1})
	if rec.Code != http.StatusServiceUnavailable || env.Error == nil || !strings.Contains(env.Error.Message, "may have been applied") {
		t.Errorf("confirm whose connection was lost mid-statement = %d %s, want 503 saying the sale may have been applied", rec.Code, rec.Body)
	}
}

// relayToPostgres relays connections to the PostgreSQL of dsn (key/value
// form, as testenv gives it) through a socket of its own, and returns the
// dsn through it and a cut that closes every connection relayed, as a
// network cut would, PostgreSQL saying nothing.
func relayToPostgres(t *testing.T, dsn string) (relayed string, cut func()) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	network, target := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, target = "unix", filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port)))
	}
	dir, err := os.MkdirTemp("", "relay") // short: a socket's path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, ".s.PGSQL.5432"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial(network, target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			go func() { _, _ = io.Copy(server, client); server.Close() }()
			go func() { _, _ = io.Copy(client, server); client.Close() }()
		}
	}()
	return dsn + " host=" + dir + " port=5432", func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
}

// A sale that PgBouncer ends with an error of its own (its query_timeout,
// here while the sale waits for the item's row lock) was sent to
// PostgreSQL, which goes on with it: the pooler only closes its server
// connection, and the backend, which reads the whole batch before it
// sees the close, commits it once the lock is free. The 503 must say the
// sale may have been applied, and it was: a pooler's own error comes
// before the outcome, so it is not a call that sent nothing
// (postgres.NothingSent); but for PgBouncer's query_wait_timeout, the
// one it gives a client still waiting for a server connection (the test
// below), which looks alike but for its words.
func TestSaleThePoolerEndedMayHaveBeenApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	pooled := testenv.PgBouncer(t, f.url, "transaction", "query_timeout = 1",
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
	db := testenv.Pool(t, pooled+" default_query_exec_mode=exec")
	var logs testenv.Output
	f.handler = newLoggedHandler(t, db, defaultRetention, &logs)
	holder := lockItem(t, f, "coin-1")
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1})
	if rec.Code != http.StatusServiceUnavailable || env.Error == nil || !strings.Contains(env.Error.Message, "may have been applied") ||
		!strings.Contains(logs.String(), "query timeout") {
		t.Fatalf("confirm that PgBouncer timed out = %d %s, want 503 saying the sale may have been applied; log:\n%s", rec.Code, rec.Body, logs.String())
	}
	if err := holder.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The sale's backend, no longer waiting, commits it.
	for range 500 {
		if f.count(t, "SELECT count(*) FROM sales WHERE item_id = 'coin-1'") == 1 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("the sale PgBouncer timed out was never committed: the test showed nothing that 'may have been applied' covers")
}

// A sale that waited in PgBouncer for a server connection past its
// query_wait_timeout (every server connection of the pool held by other
// clients' transactions) was never sent to PostgreSQL: PgBouncer forwards
// nothing of a client's transaction until it links it to a server, and
// ends the waiting client with that one word, where its other errors
// (its query_timeout above) may come after the sale was sent. The 503
// says nothing was applied (it said "may"), and it holds: once the
// server connections are free, nothing of the sale is stored and the
// same call under the same key executes, not a replay.
func TestSaleThatWaitedInThePoolerSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	pooled := testenv.PgBouncer(t, f.url, "transaction", "query_wait_timeout = 1",
		"ignore_startup_parameters = "+postgres.PoolerIgnoredSettings)
	// Both of the pool's server connections (testenv.PgBouncer's
	// default_pool_size 2), each held by a transaction left open.
	others := testenv.Pool(t, pooled+" default_query_exec_mode=exec")
	holders := []pgx.Tx{testenv.InTransaction(t, others, "SELECT 1"), testenv.InTransaction(t, others, "SELECT 1")}
	db := testenv.Pool(t, pooled+" default_query_exec_mode=exec")
	var logs testenv.Output
	f.handler = newLoggedHandler(t, db, defaultRetention, &logs)
	sale := call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1}
	rec, env := f.do(t, sale)
	if rec.Code != http.StatusServiceUnavailable || env.Error == nil || !strings.Contains(env.Error.Message, "nothing was applied") ||
		!strings.Contains(logs.String(), "query_wait_timeout") || !strings.Contains(logs.String(), `"sale_applied":"no"`) {
		t.Fatalf("confirm that waited past PgBouncer's query_wait_timeout = %d %s, want 503 saying nothing was applied; log:\n%s", rec.Code, rec.Body, logs.String())
	}
	for _, holder := range holders {
		if err := holder.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(t, "SELECT (SELECT count(*) FROM sales) + (SELECT count(*) FROM idempotency_records) + (SELECT count(*) FROM idempotency_refusals)"); n != 0 {
		t.Errorf("after a confirm that said nothing was applied: %d sales, records and refusals stored, want none", n)
	}
	f.handler = newHandler(t, f.db, defaultRetention)
	rec, env = f.do(t, sale)
	if rec.Code != http.StatusOK || result(t, env)["idempotent_replay"] != false {
		t.Errorf("the same confirm under the same key afterwards = %d %s, want 200, executed, not a replay", rec.Code, rec.Body)
	}
}

func parsePort(t *testing.T, port string) uint16 {
	t.Helper()
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(p)
}

// A call the shutdown's drain cut off (503) or whose caller hung up (499)
// says what is known of the sale, in its answer, its log line and its
// access line and span (sale_applied): nothing was applied when it ended
// before any statement reached PostgreSQL (here its context ended before
// it took a pool connection), and the sale may have been applied when it
// ended while its statement ran (waiting for the item's row lock). Both
// said "may have been applied", which sends the SRE tracing the request
// id reconciling for nothing. An abandoned call's line says a retry with
// the key replays the sale only where it may have been applied: its
// "nothing was applied; a retry with the same Idempotency-Key replays it
// if so" contradicted itself (a make run with sales-writer SIGSTOPped
// past the gateway's timeout wrote it for 15 of its 16 sales).
func TestCutOffOrAbandonedCallSaysWhatWasApplied(t *testing.T) {
	t.Parallel()
	ends := []struct {
		name       string
		cause      error // the request context's cancellation cause
		wantStatus int
		wantLog    string // the line's message, up to what it says of the sale
	}{
		{"cut off by the drain", httpserver.ErrCutOff, http.StatusServiceUnavailable, `"msg":"sale call cut off: the shutdown's drain timed out; `},
		{"abandoned by its caller", context.Canceled, httpserver.StatusClientClosed, `"msg":"sale call abandoned by the caller: `},
	}
	whens := []struct {
		name     string
		midSale  bool
		wantSays string // in the answer and the log line
		wantNote string // sale_applied of the access line and span
		// whether the line tells a retry with the key replays the sale
		wantReplay bool
	}{
		{"before any statement", false, "nothing was applied", `"sale_applied":"no"`, false},
		{"mid-statement", true, "the sale may have been applied", `"sale_applied":"maybe"`, true},
	}
	for _, end := range ends {
		for _, when := range whens {
			f := newFixture(t)
			f.addItem(t, f.owner, "coin-1", true)
			var logs testenv.Output
			f.handler = newLoggedHandler(t, f.db, defaultRetention, &logs)
			ctx, cancel := context.WithCancelCause(context.Background())
			if when.midSale {
				lockItem(t, f, "coin-1")
				go cancelOnceWaiting(f, cancel, end.cause)
			} else {
				cancel(end.cause)
			}
			rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1, ctx: ctx})
			cancel(nil)
			name := end.name + " " + when.name
			if rec.Code != end.wantStatus || env.Error == nil || !strings.Contains(env.Error.Message, when.wantSays) {
				t.Errorf("%s = %d %s, want %d saying %q", name, rec.Code, rec.Body, end.wantStatus, when.wantSays)
			}
			if !strings.Contains(logs.String(), end.wantLog+when.wantSays) || !strings.Contains(logs.String(), when.wantNote) {
				t.Errorf("%s: the log does not say %q and %s:\n%s", name, end.wantLog+when.wantSays, when.wantNote, logs.String())
			}
			if says := strings.Contains(logs.String(), "replays it"); says != when.wantReplay {
				t.Errorf("%s: the log says a retry with the key replays the sale: %v, want %v:\n%s", name, says, when.wantReplay, logs.String())
			}
		}
	}
}

// cancelOnceWaiting cancels a call with cause once a session of f's
// database waits for a lock (the call's statement, behind lockItem's).
func cancelOnceWaiting(f *fixture, cancel context.CancelCauseFunc, cause error) {
	onceWaiting(f, func() { cancel(cause) })
}

// onceWaiting runs then once a session of f's database waits for a lock
// (a call held up by a test's transaction), or after 5 s.
func onceWaiting(f *fixture, then func()) {
	for range 500 {
		var waiting bool
		err := f.db.QueryRow(context.Background(), `SELECT count(*) > 0 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil || waiting {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	then()
}

// A sale whose statement PostgreSQL refuses with an ERROR outside the
// codes of an outage (here the sales table renamed under the writer,
// 42P01: a migration run half-way, an operator's mistake) changed
// nothing: refused while being prepared, before its first call (no
// statement of the call ran), or refused as it ran, once prepared (the
// ERROR rolls back the transaction its statements and commit share). Its
// 500 says nothing was applied; it said "the sale may have been applied",
// which sent a platform reconciling a sale that was never made. The key
// binds nothing: once the table is back, the same call sells the item.
func TestSaleRefusedByAnErrorOfTheDatabaseSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"before its first call", "once prepared"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.addItem(t, f.owner, "coin-1", true)
			if when == "once prepared" {
				f.addItem(t, f.owner, "coin-2", true)
				rec, _ := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-2", key: "key-prepares", body: order1})
				if rec.Code != http.StatusOK {
					t.Fatalf("the confirm that prepares the statements = %d %s, want 200", rec.Code, rec.Body)
				}
			}
			f.exec(t, "ALTER TABLE sales RENAME TO sales_moved")
			for _, op := range []string{"confirm", "cancel"} {
				rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
				if rec.Code != http.StatusInternalServerError || errorCode(env) != "internal_error" ||
					!strings.Contains(env.Error.Message, "nothing was applied") || strings.Contains(env.Error.Message, "may have been") {
					t.Errorf("%s with the sales table gone = %d %q %s, want 500 internal_error saying nothing was applied", op, rec.Code, errorCode(env), rec.Body)
				}
			}
			f.exec(t, "ALTER TABLE sales_moved RENAME TO sales")
			if got := f.item(t, f.owner, "coin-1"); got.Sold {
				t.Fatalf("after the refused calls coin-1 is sold: %+v", got)
			}
			confirmed(t, f, "key-confirm")
		})
	}
}

// A sale that ended while PostgreSQL prepared its statements (its first
// call on a connection, here held up by a migration's lock on the sales
// table) ran none of them: pgx sends a batch's statements to run only
// once PostgreSQL has prepared them. Whether its deadline ran out (here
// client-side: the pool's sessions have no statement_timeout), its
// connection was lost (the backend ended) or its caller left, the answer
// says nothing was applied, and nothing was: once the lock is gone and
// the session has ended, the item is unsold, and the same call under the
// key sells it. The deadline's 503 said "the sale may have been applied".
func TestSaleEndedWhilePreparedSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	const app = "sales-writer-preparing"
	ends := []struct {
		name         string
		queryTimeout time.Duration
		end          func(db *pgxpool.Pool, cancel context.CancelFunc)
		wantStatus   int
		wantLog      string
	}{
		{"deadline run out", 100 * time.Millisecond, func(*pgxpool.Pool, context.CancelFunc) {},
			http.StatusServiceUnavailable, "sale call timed out"},
		{"connection lost", 10 * time.Second, func(db *pgxpool.Pool, _ context.CancelFunc) {
			_, _ = db.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = $1`, app)
		}, http.StatusServiceUnavailable, "sale store ended the call's session before its commit"},
		{"caller gone", 10 * time.Second, func(_ *pgxpool.Pool, cancel context.CancelFunc) { cancel() },
			httpserver.StatusClientClosed, "sale call abandoned by the caller"},
	}
	for _, end := range ends {
		t.Run(end.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.addItem(t, f.owner, "coin-1", true)
			writerDB := testenv.Pool(t, f.url+" application_name="+app)
			var logs testenv.Output
			// The answer checked is that of the group once PostgreSQL has
			// ended it: 13-45 ms after the cancel on one CPU shared with
			// three busy loops, but past leaveGrace (250 ms) in both runs
			// of the module's packages side by side on one CPU (go test
			// -p 4 -parallel 8), answered then that the sale may have
			// been applied. 10 s is a bound, not a measure.
			writer := sales.NewWriter(writerDB, defaultRetention)
			writer.SetLeaveGrace(10 * time.Second)
			f.handler = newServerOf(t, writer, &logs, end.queryTimeout).Handler()
			migration := testenv.InTransaction(t, f.db, "LOCK TABLE sales IN ACCESS EXCLUSIVE MODE")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go onceWaiting(f, func() { end.end(f.db, cancel) })
			rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1, ctx: ctx})
			if rec.Code != end.wantStatus || env.Error == nil ||
				!strings.Contains(env.Error.Message, "nothing was applied") || strings.Contains(env.Error.Message, "may have been") {
				t.Errorf("confirm ended while prepared = %d %s, want %d saying nothing was applied", rec.Code, rec.Body, end.wantStatus)
			}
			if !strings.Contains(logs.String(), end.wantLog) || !strings.Contains(logs.String(), "error preprocessing batch (prepare)") {
				t.Errorf("the log does not say %q of a prepare:\n%s", end.wantLog, logs.String())
			}
			if err := migration.Rollback(context.Background()); err != nil {
				t.Fatal(err)
			}
			writerDB.Close()
			waitForNoSessionOf(t, f, app)
			if got, sales := f.item(t, f.owner, "coin-1"), f.count(t, "SELECT count(*) FROM sales"); got.Sold || sales != 0 {
				t.Fatalf("after a confirm ended while prepared: %+v, %d sales", got, sales)
			}
			f.handler = newHandler(t, f.db, defaultRetention)
			confirmed(t, f, "key-1")
		})
	}
}

// waitForNoSessionOf waits until no session of application is left in
// f's database (a backend ends once it reads its client gone); it fails
// the test after 10 s.
func waitForNoSessionOf(t *testing.T, f *fixture, application string) {
	t.Helper()
	for range 500 {
		if f.count(t, "SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1", application) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("a session of %s is still there", application)
}

// A sale whose COMMIT was sent may have been applied, whatever ends the
// call then: its backend committed, and waits for a synchronous standby
// that is not there (synchronous_standby_names names none of the pair's)
// when its session is ended, its deadline runs out, its caller leaves, or
// PostgreSQL stops. Each answer says the sale may have been applied, never
// that nothing was, and the sale is there once the wait is lifted (after
// the restart, for the stop): the "nothing" of a call that ended before
// any statement ran (TestSaleEndedWhilePreparedSaysNothingWasApplied)
// must not reach a connection lost after the commit.
func TestSaleEndedAfterItsCommitWasSentMayHaveBeenApplied(t *testing.T) {
	t.Parallel()
	pair := testenv.StandbyPair(t)
	f := newFixtureOn(t, pair.Primary)
	ends := []struct {
		name         string
		queryTimeout time.Duration
		end          func(app string, cancel context.CancelFunc)
		wantStatus   int
	}{
		{"session ended", 10 * time.Second, func(app string, _ context.CancelFunc) {
			_, _ = f.db.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
		}, http.StatusServiceUnavailable},
		{"deadline run out", 100 * time.Millisecond, func(string, context.CancelFunc) {}, http.StatusServiceUnavailable},
		{"caller gone", 10 * time.Second, func(_ string, cancel context.CancelFunc) { cancel() }, httpserver.StatusClientClosed},
		{"PostgreSQL stopped", 10 * time.Second, func(string, context.CancelFunc) { pair.StopPrimary(t) }, http.StatusServiceUnavailable},
	}
	for i := range ends {
		f.addItem(t, f.owner, fmt.Sprintf("coin-%d", i), true)
	}
	f.exec(t, "CHECKPOINT") // the pair's primary commits asynchronously: the stop would lose the items
	f.exec(t, "ALTER SYSTEM SET synchronous_standby_names = 'nothere'")
	f.exec(t, "SELECT pg_reload_conf()")
	for f.count(t, "SELECT count(*)::int FROM pg_settings WHERE name = 'synchronous_standby_names' AND setting = 'nothere'") == 0 {
		time.Sleep(10 * time.Millisecond) // the server reloads its settings after the call returns
	}
	for i, end := range ends {
		// A pool, and a name, per call: a backend left waiting by the
		// call before (its client gone) must not be taken for this one's.
		app := fmt.Sprintf("sales-writer-committing-%d", i)
		writerDB := testenv.Pool(t, pair.Primary+" application_name="+app+" synchronous_commit=on")
		f.handler = newTimedHandler(t, writerDB, defaultRetention, io.Discard, end.queryTimeout)
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			waitForCommitWaiting(f.db, app)
			end.end(app, cancel)
		}()
		rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: fmt.Sprintf("coin-%d", i), key: fmt.Sprintf("key-%d", i), body: order1, ctx: ctx})
		<-ended
		cancel()
		if rec.Code != end.wantStatus || env.Error == nil ||
			!strings.Contains(env.Error.Message, "may have been applied") || strings.Contains(env.Error.Message, "nothing was applied") {
			t.Errorf("confirm ended after its commit was sent (%s) = %d %s, want %d saying the sale may have been applied", end.name, rec.Code, rec.Body, end.wantStatus)
		}
	}
	f.db.Close()
	pair.StartPrimary(t)
	f.db = testenv.Pool(t, pair.Primary)
	f.exec(t, "ALTER SYSTEM RESET synchronous_standby_names")
	f.exec(t, "SELECT pg_reload_conf()")
	if sales := f.count(t, "SELECT count(*)::int FROM sales"); sales != len(ends) {
		t.Errorf("sales committed = %d, want %d: a sale ended after its commit was sent is there", sales, len(ends))
	}
}

// waitForCommitWaiting waits until a session of application in db's
// database waits for a synchronous standby after its commit, or 5 s.
func waitForCommitWaiting(db *pgxpool.Pool, application string) {
	for range 500 {
		var waiting bool
		err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1 AND wait_event = 'SyncRep')`, application).Scan(&waiting)
		if err != nil || waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
