package postgres_test

import (
	"context"
	"os"
	"testing"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The sessions of a pool get Open's defaults: no JIT, and no sequential
// scans with IndexScansOnly; a setting in the DSN wins over either.
func TestOpenSessionDefaults(t *testing.T) {
	dsn := testenv.PostgresURL(t) // key=value form
	indexScansOnly := []postgres.Option{postgres.IndexScansOnly()}
	for _, tc := range []struct {
		name, dsn string
		opts      []postgres.Option
		setting   string
		want      string
	}{
		{"jit off by default", dsn, nil, "jit", "off"},
		{"dsn sets jit", dsn + " jit=on", nil, "jit", "on"},
		{"seqscan on without the option", dsn, nil, "enable_seqscan", "on"},
		{"seqscan off with IndexScansOnly", dsn, indexScansOnly, "enable_seqscan", "off"},
		{"dsn sets enable_seqscan", dsn + " enable_seqscan=on", indexScansOnly, "enable_seqscan", "on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := postgres.Open(context.Background(), tc.dsn, tc.opts...)
			if err != nil {
				t.Fatalf("Open(dsn): %v", err)
			}
			defer pool.Close()
			var got string
			if err := pool.QueryRow(context.Background(), "SHOW "+tc.setting).Scan(&got); err != nil {
				t.Fatalf("SHOW %s: %v", tc.setting, err)
			}
			if got != tc.want {
				t.Errorf("SHOW %s = %q, want %q", tc.setting, got, tc.want)
			}
		})
	}
}
