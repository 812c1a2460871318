package postgres_test

import (
	"context"
	"os"
	"testing"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The services' sessions run without JIT unless their DSN asks for it.
func TestOpenTurnsJITOffUnlessTheDSNSetsIt(t *testing.T) {
	dsn := testenv.PostgresURL(t) // key=value form
	for _, tc := range []struct{ name, dsn, want string }{
		{"default", dsn, "off"},
		{"dsn sets jit", dsn + " jit=on", "on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := postgres.Open(context.Background(), tc.dsn)
			if err != nil {
				t.Fatalf("Open(dsn): %v", err)
			}
			defer pool.Close()
			var jit string
			if err := pool.QueryRow(context.Background(), "SHOW jit").Scan(&jit); err != nil {
				t.Fatalf("SHOW jit: %v", err)
			}
			if jit != tc.want {
				t.Errorf("Open(dsn): SHOW jit = %q, want %q", jit, tc.want)
			}
		})
	}
}

// IndexScansOnly turns sequential scans off in every session, unless the DSN
// sets enable_seqscan; without it they stay on.
func TestIndexScansOnly(t *testing.T) {
	dsn := testenv.PostgresURL(t)
	for _, tc := range []struct {
		name, dsn string
		opts      []postgres.Option
		want      string
	}{
		{"without the option", dsn, nil, "on"},
		{"with the option", dsn, []postgres.Option{postgres.IndexScansOnly()}, "off"},
		{"dsn sets enable_seqscan", dsn + " enable_seqscan=on", []postgres.Option{postgres.IndexScansOnly()}, "on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := postgres.Open(context.Background(), tc.dsn, tc.opts...)
			if err != nil {
				t.Fatalf("Open(dsn): %v", err)
			}
			defer pool.Close()
			var got string
			if err := pool.QueryRow(context.Background(), "SHOW enable_seqscan").Scan(&got); err != nil {
				t.Fatalf("SHOW enable_seqscan: %v", err)
			}
			if got != tc.want {
				t.Errorf("SHOW enable_seqscan = %q, want %q", got, tc.want)
			}
		})
	}
}
