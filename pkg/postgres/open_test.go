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
	for _, tc := range []struct{ dsn, want string }{
		{dsn, "off"},
		{dsn + " jit=on", "on"},
	} {
		pool, err := postgres.Open(context.Background(), tc.dsn)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		var jit string
		err = pool.QueryRow(context.Background(), "SHOW jit").Scan(&jit)
		pool.Close()
		if err != nil {
			t.Fatalf("SHOW jit: %v", err)
		}
		if jit != tc.want {
			t.Errorf("jit = %q, want %q", jit, tc.want)
		}
	}
}
