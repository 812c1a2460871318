package postgres_test

import (
	"context"
	"testing"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
)

// A connection of a pool Open made records the WARNINGs PostgreSQL sends
// it, and only those: a NOTICE is not one, and Reset forgets an earlier
// statement's. A connection of a pool Open did not make has no record
// (nil), so that its caller does not take silence for "no warning".
func TestWarningsRecordsWhatPostgreSQLWarnedOf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	pool, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	warnings := postgres.WarningsOf(conn.Conn().PgConn())
	if warnings == nil {
		t.Fatal("WarningsOf(a connection of Open's pool) = nil, want its record")
	}
	steps := []struct {
		stmt string
		want bool
	}{
		{`DO $$ BEGIN RAISE NOTICE 'a notice'; END $$`, false},
		{`DO $$ BEGIN RAISE WARNING 'a warning'; END $$`, true},
		{`SELECT 1`, true}, // not Reset: still heard
	}
	for _, step := range steps {
		if _, err := conn.Exec(ctx, step.stmt); err != nil {
			t.Fatal(err)
		}
		if got := warnings.Heard(); got != step.want {
			t.Errorf("Heard() after %s = %t, want %t", step.stmt, got, step.want)
		}
	}
	warnings.Reset()
	if _, err := conn.Exec(ctx, `SELECT 1`); err != nil || warnings.Heard() {
		t.Errorf("Heard() after Reset and SELECT 1 = %t (%v), want false", warnings.Heard(), err)
	}

	plain := testenv.Pool(t, dsn)
	other, err := plain.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if w := postgres.WarningsOf(other.Conn().PgConn()); w != nil {
		t.Errorf("WarningsOf(a connection of pgxpool.New's pool) = %p, want nil", w)
	}
}
