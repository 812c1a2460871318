package catalog_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
)

// BenchmarkSeed reports how fast Seed loads SEED_ITEMS items (default 10000):
//
//	SEED_ITEMS=1000000 go test ./catalog -run '^$' -bench Seed -benchtime 1x -timeout 20m
func BenchmarkSeed(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("SEED_ITEMS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	pool := testenv.Postgres(b)
	owner := newOwner(b, pool)
	b.ResetTimer()
	for i := range b.N {
		if got, err := catalog.Seed(ctx, pool, owner, n, int64(i)); err != nil || got != int64(n) {
			b.Fatalf("Seed(%d) = %d, %v", n, got, err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "items/s")
}
