package catalog_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
)

func TestSeedSpeed(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SEED_SPEED_ITEMS"))
	if n == 0 {
		t.Skip("SEED_SPEED_ITEMS not set")
	}
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	start := time.Now()
	got, err := catalog.Seed(context.Background(), pool, owner, n, 1)
	t.Logf("seeded %d in %v (%v)", got, time.Since(start), err)
	var size string
	pool.QueryRow(context.Background(), `SELECT pg_size_pretty(pg_total_relation_size('export_items'))`).Scan(&size)
	t.Logf("size %s", size)
}
