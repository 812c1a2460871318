package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/export-reader/internal/api"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/coinexport/export/services/export-reader/internal/export"
	"github.com/coinexport/export/services/export-reader/internal/replica"
	"github.com/jackc/pgx/v5/pgxpool"
)

// testMaxLag is READ_MAX_LAG in these tests: above what an idle link to
// the primary shows with wal_receiver_timeout=1s (a keepalive every half
// second), far below the production minute.
const testMaxLag = 2 * time.Second

// replicaEnv is the reader on the standby of a pair of its own, refusing
// list pages past testMaxLag; its pool (for owners and imports) is the
// primary's.
func replicaEnv(t *testing.T) (*env, *testenv.Pair, *pgxpool.Pool) {
	t.Helper()
	pair := testenv.StandbyPair(t, "wal_receiver_timeout=1s")
	primary, standby := testenv.Pool(t, pair.Primary), testenv.Pool(t, pair.Standby)
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	cursors, err := cursor.New(cursorSecret)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Output{}
	log := logging.New(logs, "info", "export-reader") // its lines name their request (wantReplicaBehind)
	side, err := postgres.OpenSide(context.Background(), standby)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(side.Close)
	lag := replica.Start(context.Background(), side, log, replica.Options{MaxLag: testMaxLag, Interval: 100 * time.Millisecond})
	t.Cleanup(lag.Close) // before side.Close: cleanups run last first
	mux := http.NewServeMux()
	api.New(export.NewReader(standby, cursors, testReadAhead, export.RefuseListsUnless(lag.Check)), log, 10*time.Second, "READ_DATABASE_URL").Register(mux)
	srv := httptest.NewServer(httpserver.New(httpserver.Config{Service: "export-reader", Log: log, Signer: signer}, mux).Handler())
	t.Cleanup(srv.Close)
	return &env{pool: primary, srv: srv, signer: signer, logs: logs}, pair, standby
}

// waitForPage asks for path until its answer has status want (and its data
// holds items, when want is 200), and returns that answer.
func (e *env) waitForPage(t *testing.T, owner, path string, want, items int) response {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r := e.get(t, owner, path)
		if r.status == want && (want != http.StatusOK || len(r.items(t)) == items) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %s, waited a minute for %d", path, r.status, r.body, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitForLog waits for a line holding s: the monitor logs from its own
// goroutine, a tick after a page may have seen the crossing.
func waitForLog(t *testing.T, logs *testenv.Output, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line says %q:\n%s", s, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantReplicaBehind checks the refusal of a list page by a lagging replica,
// and that its own access line (found by its request id) says why: no
// other line names the request (the monitor logs the crossings alone), so
// an SRE tracing its request id found a 503 unavailable and no cause.
func wantReplicaBehind(t *testing.T, e *env, r response) {
	t.Helper()
	if r.env.Error == nil || r.env.Error.Code != "unavailable" || !strings.Contains(r.env.Error.Message, "read replica is behind") ||
		!strings.Contains(r.env.Error.Message, "same cursor") || r.header.Get("Retry-After") == "" {
		t.Errorf("page from a lagging replica = %d %s (Retry-After %q), want 503 unavailable saying the replica is behind, with Retry-After",
			r.status, r.body, r.header.Get("Retry-After"))
	}
	// The access line is written as the handler returns, which may be
	// just after the client has read the answer.
	own := fmt.Sprintf(`"request_id":%q`, r.env.Meta.RequestID)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		for line := range strings.SplitSeq(e.logs.String(), "\n") {
			if !strings.Contains(line, `"msg":"request"`) || !strings.Contains(line, own) {
				continue
			}
			if !strings.Contains(line, `"status":503`) || !strings.Contains(line, `"read_replica_behind":true`) {
				t.Errorf("access line of a page refused for the replica's lag does not say so:\n%s", line)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("no access line of request %s:\n%s", r.env.Meta.RequestID, e.logs)
			return
		}
	}
}

// A sale the standby has not replayed is missed by the sync reading it
// then; were the sync to succeed, its checkpoint could put the sale
// before the next run's updated_after. So while the standby lags past the
// bound every list page (a sync's next page too) is refused, and once it
// has replayed the sale the same cursor brings it. The item route is
// served all along, stale.
func TestListPagesAreRefusedWhileTheReplicaLags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, _, standby := replicaEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"), itemLine("b", "active", "B"))
	e.waitForPage(t, owner, "/v1/export/items", http.StatusOK, 2) // replayed
	first := e.get(t, owner, "/v1/export/items?limit=1")
	if first.env.Meta.NextCursor == nil {
		t.Fatalf("first page of two items = %s, want a next cursor", first.body)
	}
	next := "/v1/export/items?limit=1&cursor=" + url.QueryEscape(*first.env.Meta.NextCursor)

	// The crossing this test makes is counted from here: a standby just
	// started may not stream yet, and its lag, unknown for that moment,
	// is a crossing of its own (a WARN, then "caught up").
	logged := len(e.logs.String())
	if _, err := standby.Exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE export_items SET listed_active = false, updated_at = clock_timestamp()
	    WHERE owner_id = $1 AND id = 'b'`, owner); err != nil {
		t.Fatal(err)
	}
	wantReplicaBehind(t, e, e.waitForPage(t, owner, next, http.StatusServiceUnavailable, 0))
	wantReplicaBehind(t, e, e.get(t, owner, "/v1/export/items"))
	// A cursor that can never work is refused as such: a 503 would have
	// the client retry it for as long as the replica lags.
	if bad := e.get(t, owner, "/v1/export/items?limit=1&cursor=not-a-cursor"); bad.status != http.StatusBadRequest {
		t.Errorf("bad cursor while the replica lags = %d %s, want 400", bad.status, bad.body)
	}
	if item := e.get(t, owner, "/v1/export/items/b"); item.status != http.StatusOK {
		t.Errorf("item route while the replica lags = %d %s, want 200 (stale)", item.status, item.body)
	}
	waitForLog(t, e.logs, "read replica behind")
	if n := strings.Count(e.logs.String()[logged:], "read replica behind"); n != 1 {
		t.Errorf("%d WARNs that the replica is behind since replay was paused, want 1:\n%s", n, e.logs)
	}

	if _, err := standby.Exec(ctx, "SELECT pg_wal_replay_resume()"); err != nil {
		t.Fatal(err)
	}
	page := e.waitForPage(t, owner, next, http.StatusOK, 1)
	if items := page.items(t); items[0]["id"] != "b" || items[0]["status"] != "inactive" {
		t.Errorf("page after the replay = %s, want b, inactive", page.body)
	}
	waitForLog(t, e.logs, "read replica caught up")
}

// A standby that lost its primary replays nothing new, and what the
// primary committed meanwhile is unknown to it: its lag grows from its
// last reading, and list pages are refused once past the bound.
func TestListPagesAreRefusedWhenTheStandbyLosesItsPrimary(t *testing.T) {
	t.Parallel()
	e, pair, _ := replicaEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"))
	e.waitForPage(t, owner, "/v1/export/items", http.StatusOK, 1)

	pair.StopPrimary(t)
	wantReplicaBehind(t, e, e.waitForPage(t, owner, "/v1/export/items", http.StatusServiceUnavailable, 0))
	if item := e.get(t, owner, "/v1/export/items/a"); item.status != http.StatusOK {
		t.Errorf("item route on a standby without its primary = %d %s, want 200", item.status, item.body)
	}
	waitForLog(t, e.logs, "no WAL receiver streaming")
}
