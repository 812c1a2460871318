package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/sales-writer/sales"
)

// A sale whose session an operator terminates (pg_terminate_backend)
// while it waits for a lock, before its commit, is answered 503 saying
// that nothing was applied (PostgreSQL's FATAL 57P01 in its statement's
// place: postgres.Terminated), its access line sale_applied "no", and
// the item stays unsold; the line of the failure names the cause. Alone,
// waiting for its key's lock, and in a group of one, waiting for its
// item's row lock. Before, both said the sale may have been applied.
// (Terminated in its commit's wait for a synchronous standby, it may have
// been: TestSaleEndedAfterItsCommitWasSentMayHaveBeenApplied.)
func TestASaleTerminatedBeforeItsCommitSaysNothingWasApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i, c := range []struct {
		name   string
		groups int
		hold   func(item, key string)
	}{
		{"alone, waiting for its key's lock", 0, func(_, key string) {
			tx := testenv.InTransaction(t, f.db, `SELECT pg_advisory_xact_lock(1801812339, hashtext($1::text || '/' || $2::text || '/' || $3::text))`,
				f.owner, "market-a", key)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		}},
		{"a group of one, waiting for its item's row lock", 1, func(item, _ string) { lockItem(t, f, item) }},
	} {
		item, key, app := fmt.Sprintf("coin-%d", i), fmt.Sprintf("k-%d", i), fmt.Sprintf("sales-terminated-%d", i)
		f.addItem(t, f.owner, item, true)
		c.hold(item, key)
		db, err := postgres.Open(context.Background(), f.url+" application_name="+app)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		var logs testenv.Output
		f.handler = newServerOf(t, sales.NewGroupingWriter(db, defaultRetention, c.groups, sales.GroupStats{}), &logs, 10*time.Second).Handler()
		type answer struct {
			rec *httptest.ResponseRecorder
			env envelope.Parsed
		}
		answered := make(chan answer, 1)
		go func() {
			rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: item, key: key, body: order1})
			answered <- answer{rec, env}
		}()
		testenv.WaitUntilTrue(t, f.db, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = '"+app+"' AND wait_event_type = 'Lock')")
		f.exec(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
		a := <-answered
		rec, env := a.rec, a.env
		if rec.Code != http.StatusServiceUnavailable || env.Error == nil || !strings.Contains(env.Error.Message, "nothing was applied") {
			t.Errorf("%s: confirm whose session was terminated = %d %s, want 503 saying nothing was applied", c.name, rec.Code, rec.Body)
		}
		if !strings.Contains(logs.String(), `"sale_applied":"no"`) || !strings.Contains(logs.String(), "pg_terminate_backend") ||
			!strings.Contains(logs.String(), `"msg":"sale store ended the call's session before its commit: nothing was applied"`) {
			t.Errorf("%s: logs, want the failure's line saying nothing was applied, with the cause (pg_terminate_backend), and sale_applied no:\n%s", c.name, logs.String())
		}
		if f.item(t, f.owner, item).Sold {
			t.Errorf("%s: the item is sold, want it unsold: nothing was applied", c.name)
		}
	}
}
