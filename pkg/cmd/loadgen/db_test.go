package main

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// seededOwner creates an owner with n seeded items.
func seededOwner(t *testing.T, pool *pgxpool.Pool, n int) string {
	t.Helper()
	ctx := context.Background()
	var owner string
	if err := pool.QueryRow(ctx, `INSERT INTO owners (name) VALUES ('bench') RETURNING id::text`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Seed(ctx, pool, owner, n, 1); err != nil {
		t.Fatal(err)
	}
	return owner
}

func TestKeysetScanReadsEveryItemOnce(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 250)
	seededOwner(t, pool, 30) // another owner's items: never read
	tests := []struct {
		limit, wantPages int
	}{
		{100, 3},
		{50, 6}, // 250 is a multiple: the last, empty page ends the scan
		{1000, 1},
	}
	for _, tt := range tests {
		res, err := keysetScan(context.Background(), pool, owner, "doc_eng", tt.limit)
		if err != nil {
			t.Fatalf("keysetScan(limit %d) error %v", tt.limit, err)
		}
		if res.Items != 250 || res.Pages != tt.wantPages {
			t.Errorf("keysetScan(limit %d) = %d items in %d pages, want 250 in %d", tt.limit, res.Items, res.Pages, tt.wantPages)
		}
	}
}

func TestChangeItemsMovesUpdatedAtPastTheCheckpoint(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 200)
	ctx := context.Background()
	checkpoint, changed, err := changeItems(ctx, pool, owner, 0.05)
	if err != nil {
		t.Fatalf("changeItems() error %v", err)
	}
	if changed != 10 {
		t.Errorf("changeItems(0.05 of 200) changed %d, want 10", changed)
	}
	var after int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM export_items WHERE owner_id = $1 AND updated_at > $2`, owner, checkpoint).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != changed {
		t.Errorf("items updated after the checkpoint = %d, want %d", after, changed)
	}
}

func TestSampleIDsActiveOnly(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 100)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `UPDATE export_items SET listed_active = false WHERE owner_id = $1`, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE export_items SET listed_active = true WHERE owner_id = $1 AND id IN (SELECT id FROM export_items WHERE owner_id = $1 LIMIT 7)`, owner); err != nil {
		t.Fatal(err)
	}
	ids, err := sampleIDs(ctx, pool, owner, 50, true)
	if err != nil || len(ids) != 7 {
		t.Errorf("sampleIDs(active) = %d ids, %v, want 7", len(ids), err)
	}
	ids, err = sampleIDs(ctx, pool, owner, 50, false)
	if err != nil || len(ids) != 50 {
		t.Errorf("sampleIDs(all) = %d ids, %v, want 50", len(ids), err)
	}
}
