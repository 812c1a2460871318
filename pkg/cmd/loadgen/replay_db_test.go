package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/testenv"
)

// checkReplay counts the run's own sales of an item, not those left by an
// earlier run (an item sold and canceled then, active again and replayed
// now), and holds every shared item to one winner, a shared item no
// platform won included (every confirm refused item_already_sold).
func TestCheckReplayJudgesTheRunAndEverySharedItem(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresURL(t)
	pool := testenv.Pool(t, dsn)
	owner := seededOwner(t, pool, 3)
	ctx := context.Background()
	ids, err := sampleIDs(ctx, pool, owner, 3, false)
	if err != nil || len(ids) != 3 {
		t.Fatalf("the owner's items: %v, %v", ids, err)
	}
	own, won, lost := ids[0], ids[1], ids[2]
	mustExec(t, pool, `INSERT INTO platforms (id) VALUES ('replay-test') ON CONFLICT DO NOTHING`)
	mustExec(t, pool, `INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at, canceled_at)
		VALUES ($1, $2, 'replay-test', 'earlier-run', now(), now()),
		       ($1, $2, 'replay-test', 'run-own', now(), NULL),
		       ($1, $3, 'replay-test', 'run-won', now(), NULL)`, owner, own, won)
	api := testenv.LoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"data":{"status":"inactive"}}`)
	}))
	api.Start()
	cfg := Config{DatabaseURL: dsn, OwnerID: owner, ReadKey: "read"}
	plan := [][]replayItem{{
		{item: own, ops: []replayOp{{own, "confirm", "run-own", "k-own"}}},
		{item: won, shared: true, ops: []replayOp{{won, "confirm", "run-won", "k-won"}}},
	}}
	stats := &replayStats{outcomes: map[string]replayOutcome{"k-own": {status: 200}, "k-won": {status: 200}}}
	var out strings.Builder
	if err := checkReplay(ctx, api.Client(), cfg, api.URL+"/v1", plan, stats, &out); err != nil {
		t.Errorf("a run whose item was sold before it = %v, want no mismatch:\n%s", err, out.String())
	}
	plan[0] = append(plan[0], replayItem{item: lost, shared: true, ops: []replayOp{{lost, "confirm", "run-lost", "k-lost"}}})
	stats.outcomes["k-lost"] = replayOutcome{status: 409, code: "item_already_sold"}
	out.Reset()
	if err := checkReplay(ctx, api.Client(), cfg, api.URL+"/v1", plan, stats, &out); err == nil || !strings.Contains(out.String(), lost) {
		t.Errorf("a shared item no platform won = %v, want a mismatch naming it:\n%s", err, out.String())
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}
