package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// RenameDatabase renames dsn's database (a test's own, from PostgresURL)
// away, as an operator's rename or drop does under a running service: its
// sessions are ended and every new connection to dsn is refused with
// SQLSTATE 3D000 until the returned restore renames it back (also run
// when the test ends, if the test did not).
func RenameDatabase(t testing.TB, dsn string) (restore func()) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	name, moved := cfg.Database, cfg.Database+"_moved"
	admin := connect(t, adminURL(t))
	ctx := context.Background()
	// ALTER DATABASE … RENAME refuses a database with sessions; a pool may
	// open one between the two statements, hence the tries.
	for try := 0; ; try++ {
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name); err != nil {
			admin.Close(ctx)
			t.Fatalf("testenv: end the sessions of %s: %v", name, err)
		}
		_, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" RENAME TO "+pgx.Identifier{moved}.Sanitize())
		if err == nil {
			break
		}
		if try == 50 {
			admin.Close(ctx)
			t.Fatalf("testenv: rename %s: %v", name, err)
		}
	}
	renamed := true
	restore = func() {
		if !renamed {
			return
		}
		renamed = false
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{moved}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("testenv: rename %s back: %v", moved, err)
		}
	}
	t.Cleanup(restore)
	return restore
}
