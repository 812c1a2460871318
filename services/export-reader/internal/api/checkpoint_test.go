package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/coinexport/export/services/export-reader/syncclient"
)

// The sync guide's checkpoint is the client's start time, not the newest
// updated_at a run read. An item stamped while the database's clock ran an
// hour ahead (then set back) is read again by every run for that hour,
// which costs a read; a checkpoint taken from the newest stamp (less the
// overlap) stood an hour ahead instead, and every change stamped in that
// hour, by the corrected clock, was skipped for good.
func TestACheckpointIsNotMovedByAStampFromAClockAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("ahead", "active", "Ahead"), itemLine("later", "active", "Later v1"))
	// What a server clock an hour ahead stamps.
	if _, err := e.pool.Exec(ctx, `UPDATE export_items SET updated_at = clock_timestamp() + interval '1 hour'
		WHERE owner_id = $1 AND id = 'ahead'`, owner); err != nil {
		t.Fatal(err)
	}
	client := &syncclient.Client{BaseURL: e.srv.URL + "/v1", HTTP: e.srv.Client(), Prepare: e.sign(owner)}
	mirror := syncclient.Mirror{}
	checkpoint, _, err := client.Sync(ctx, time.Time{}, mirror.Upsert)
	if err != nil {
		t.Fatal(err)
	}
	var newest time.Time
	for _, it := range mirror {
		if it.UpdatedAt.After(newest) {
			newest = it.UpdatedAt
		}
	}
	e.importLines(t, owner, itemLine("ahead", "active", "Ahead"), itemLine("later", "inactive", "Later v2"))

	if _, _, err := client.Sync(ctx, checkpoint, mirror.Upsert); err != nil {
		t.Fatal(err)
	}
	if got := mirror["later"].Status; got != "inactive" {
		t.Errorf("after the guide's incremental run (from its start time) the mirror holds 'later' %s, want inactive", got)
	}
	fromNewest := syncclient.Mirror{}
	if _, _, err := client.Sync(ctx, newest, fromNewest.Upsert); err != nil {
		t.Fatal(err)
	}
	if _, read := fromNewest["later"]; read {
		t.Errorf("a run from the newest stamp read 'later': the README's warning against that checkpoint no longer holds")
	}
}
