package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
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
	ctx := context.Background()
	pair := testenv.StandbyPair(t)
	admin := testenv.Pool(t, pair.Primary)
	items := []string{"coin-0", "coin-1", "coin-2", "coin-3"}
	var owner string
	if err := admin.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []struct {
		sql  string
		args []any
	}{
		{"INSERT INTO platforms (id) VALUES ('market-a')", nil},
		{`INSERT INTO export_items (owner_id, id, listed_active, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		  SELECT $1, i, true, 'EUR', '{"ENG": {"title": "c"}}', '"id":"' || i || '"', '"id":"' || i || '"', '"id":"' || i || '"', now()
		  FROM unnest($2::text[]) AS i`, []any{owner, items}},
		// Every commit waits for a synchronous standby of that name.
		{"ALTER SYSTEM SET synchronous_standby_names = 'nothere'", nil},
		{"SELECT pg_reload_conf()", nil},
	} {
		if _, err := admin.Exec(ctx, stmt.sql, stmt.args...); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitUntilTrue(t, admin, "SELECT setting = 'nothere' FROM pg_settings WHERE name = 'synchronous_standby_names'")

	addr := testenv.FreeAddr(t)
	const queryTimeout = 2 * time.Second
	vars := map[string]string{
		"DATABASE_URL": pair.Primary + " synchronous_commit=on", "IDENTITY_SECRET": secret,
		"SALES_WRITER_ADDR": addr, "SALES_WRITER_ADMIN_ADDR": testenv.FreeAddr(t),
		"SALES_WRITER_QUERY_TIMEOUT": queryTimeout.String(), "SALES_WRITER_SHUTDOWN_DELAY": "0s",
		"SALES_WRITER_COMMIT_GROUPS": "1",
	}
	stop, done, out := startWriter(t, ctx, vars)

	// Sent at once: the first runs as a group of one and waits in its
	// COMMIT; those arriving meanwhile form the next group, which does too.
	answers := make([]<-chan testenv.Answer, len(items))
	for i, item := range items {
		answers[i] = testenv.AnswerLater(func() (*http.Response, error) { return confirmOf(addr, owner, item) })
	}
	// Every call's statement has run (its key's lock, sales.keyLock's
	// class, is held to its commit), and fewer commits wait than calls: a
	// group of several is in its COMMIT.
	n := strconv.Itoa(len(items))
	testenv.WaitUntilTrue(t, admin, `SELECT (SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		  WHERE a.application_name = 'sales-writer' AND l.locktype = 'advisory' AND l.classid = 1801812339 AND l.granted) = `+n+`
		AND (SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sales-writer' AND wait_event = 'SyncRep') < `+n)
	stop() // SIGTERM

	got := make([]testenv.Answer, len(answers))
	for i, answered := range answers {
		select {
		case got[i] = <-answered:
		case <-time.After(drainTime(Config{QueryTimeout: queryTimeout}) + 5*time.Second):
			t.Fatalf("the confirm of %s not answered within the drain and 5 s:\n%s", items[i], out.String())
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run() = %v, want nil after a clean stop", err)
		}
	case <-time.After(drainTime(Config{QueryTimeout: queryTimeout}) + 5*time.Second):
		t.Fatalf("run did not end within its drain and 5 s:\n%s", out.String())
	}
	// The commits cut off end once their sessions see the cancel or the
	// connection's close: then the database holds what it will.
	testenv.WaitUntilTrue(t, admin, "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'SyncRep')")
	for i, a := range got {
		if a.Err != nil || a.Body.Meta.RequestID == "" {
			t.Errorf("the confirm of %s got no answer, or no envelope: %v %+v", items[i], a.Err, a.Body)
			continue
		}
		var recorded bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM idempotency_records
			WHERE owner_id = $1 AND platform_id = 'market-a' AND idempotency_key = $2)`, owner, "k-"+items[i]).Scan(&recorded); err != nil {
			t.Fatal(err)
		}
		nothingApplied := a.Body.Error != nil && strings.Contains(a.Body.Error.Message, "nothing was applied")
		switch {
		case a.Status == http.StatusOK:
			t.Errorf("the confirm of %s = 200 while its commit waited for a standby that never confirmed it", items[i])
		case nothingApplied && recorded:
			t.Errorf("the confirm of %s = %d %+v, saying nothing was applied, but its key holds its record", items[i], a.Status, a.Body.Error)
		}
		t.Logf("the confirm of %s = %d %+v (its record stored: %t)", items[i], a.Status, a.Body.Error, recorded)
	}
	if strings.Contains(out.String(), "sale call cut off") {
		t.Errorf("the drain cut a call off:\n%s", out.String())
	}
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
