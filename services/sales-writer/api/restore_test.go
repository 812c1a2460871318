package api

import (
	"os"
	"strings"
	"testing"
)

// renewalBlock is where the repository README's ```sql block that renews
// the idempotency records after a restore starts and ends, with the README.
func renewalBlock(t *testing.T) (readme string, start, end int) {
	t.Helper()
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme = string(b)
	for from := 0; ; from = end {
		start = strings.Index(readme[from:], "```sql")
		if start < 0 {
			t.Fatal("the README has no ```sql block that renews idempotency records after a restore")
		}
		start += from
		end = start + len("```sql")
		if n := strings.Index(readme[end:], "```"); n >= 0 {
			end += n
		}
		if strings.Contains(readme[start:end], "UPDATE idempotency_records") {
			return readme, start, end
		}
	}
}

// documentedRenewal is the SQL of the repository README's "Restoring the
// database", step 6, that gives the Idempotency-Key bindings a restore kept
// the time they had left at the point restored to, with its TIME given.
func documentedRenewal(t *testing.T, point string) string {
	t.Helper()
	readme, start, end := renewalBlock(t)
	return strings.ReplaceAll(readme[start+len("```sql"):end], "'TIME'", "'"+point+"'")
}

// The renewal's time counts from when it runs, so the README puts it in the
// step that starts the services, after the steps that may take hours
// (owners importing again): at step 2, those hours came off every binding,
// and a binding could lapse before its platform sent the call again.
func TestTheDocumentedRenewalRunsJustBeforeTheServicesStart(t *testing.T) {
	t.Parallel()
	readme, start, _ := renewalBlock(t)
	section := strings.Index(readme, "\n## Restoring the database\n")
	if section < 0 {
		t.Fatal(`the README has no "Restoring the database"`)
	}
	step := func(n string) int {
		at := strings.Index(readme[section:], "\n"+n+". ")
		if at < 0 {
			t.Fatalf(`"Restoring the database" has no step %s`, n)
		}
		return section + at
	}
	step6, step7 := step("6"), step("7")
	if start < step6 || start > step7 {
		t.Fatalf(`the renewal is not in step 6 of "Restoring the database" (byte %d; step 6 is bytes %d to %d)`, start, step6, step7)
	}
	if heading := strings.Join(strings.Fields(readme[step6:start]), " "); !strings.Contains(heading, "then start export-reader and sales-writer") {
		t.Errorf("step 6, which renews the bindings, does not say it then starts the services: %q", heading)
	}
}

// After a restore to a point older than IDEMPOTENCY_RETENTION, the calls the
// restore kept still replay once the README's renewal has run: the sales
// platforms are asked to send them again (step 7), and without it a confirm
// whose sale was canceled sold the item again, and a refusal whose cause had
// gone ran (TestARetryPastTheRetentionIsJudgedAnew).
func TestDocumentedRenewalAfterARestoreReplaysKeptCalls(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	orderB := `{"external_order_id":"b"}`
	calls := []struct {
		name       string
		c          call
		wantStatus int
		wantCode   string
	}{
		{"market-a sells", call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "a-confirm", body: order1}, 200, ""},
		{"market-b refused", call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-confirm", body: orderB}, 409, "item_already_sold"},
		{"market-a cancels", call{id: f.writer("market-a"), op: "cancel", item: "coin-1", key: "a-cancel", body: order1}, 200, ""},
	}
	for _, s := range calls {
		if rec, env := f.do(t, s.c); rec.Code != s.wantStatus || errorCode(env) != s.wantCode {
			t.Fatalf("%s = %d %q %s, want %d %q", s.name, rec.Code, errorCode(env), rec.Body, s.wantStatus, s.wantCode)
		}
	}
	// The database restored to a point two days ago, at which the three
	// bindings had an hour left: expired by now.
	var point string
	if err := f.db.QueryRow(t.Context(), "SELECT (now() - interval '2 days')::text").Scan(&point); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"idempotency_records", "idempotency_refusals"} {
		f.exec(t, "UPDATE "+table+" SET expires_at = $1::timestamptz + interval '1 hour'", point)
	}
	// And a binding that had expired at the point: judged anew then, it
	// stays so.
	f.addItem(t, f.owner, "coin-2", true)
	if rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-2", key: "old", body: order1}); rec.Code != 200 {
		t.Fatalf("confirm coin-2 = %d %q, want 200", rec.Code, errorCode(env))
	}
	f.exec(t, "UPDATE idempotency_records SET expires_at = $1::timestamptz - interval '1 minute' WHERE idempotency_key = 'old'", point)
	f.exec(t, documentedRenewal(t, point))

	// Each kept binding has the hour it had left at the point, from now:
	// not less (it would expire under the calls sent again), not more (the
	// key bound past its retention, as a second run of the block does).
	for _, table := range []string{"idempotency_records", "idempotency_refusals"} {
		if n := f.count(t, "SELECT count(*) FROM "+table+` WHERE idempotency_key <> 'old'
			AND expires_at NOT BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes'`); n != 0 {
			t.Errorf("%d bindings in %s do not expire an hour from now, the time they had left at the point", n, table)
		}
	}
	if n := f.count(t, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'old' AND expires_at > now()"); n != 0 {
		t.Error("the binding that had expired at the point was renewed")
	}

	for _, s := range calls {
		rec, env := f.do(t, s.c)
		if rec.Code != s.wantStatus || errorCode(env) != s.wantCode {
			t.Errorf("%s, sent again = %d %q %s, want %d %q", s.name, rec.Code, errorCode(env), rec.Body, s.wantStatus, s.wantCode)
			continue
		}
		if rec.Code == 200 && result(t, env)["idempotent_replay"] != true {
			t.Errorf("%s, sent again: %s, want its replay", s.name, rec.Body)
		}
		if rec.Code != 200 && !strings.Contains(env.Error.Message, strings.TrimSpace(replayedRefusalNote[:30])) {
			t.Errorf("%s, sent again: message %q, want the refusal given before", s.name, env.Error.Message)
		}
	}
	if st := f.item(t, f.owner, "coin-1"); st.Sold {
		t.Errorf("coin-1 = %+v, want unsold, as the kept calls left it", st)
	}
	if n := f.count(t, "SELECT count(*) FROM sales WHERE item_id = 'coin-1'"); n != 1 {
		t.Errorf("%d sales of coin-1, want 1: the kept calls ran nothing again", n)
	}
}
