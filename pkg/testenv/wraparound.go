package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// WraparoundCluster is a cluster of a test's own, with a migrated
// database, whose transaction ids can be brought to PostgreSQL's guard
// against wraparound (Guard).
type WraparoundCluster struct {
	DSN string // of the migrated database
	*clusters
}

// NewWraparoundCluster starts a WraparoundCluster, stopped when the test
// ends.
func NewWraparoundCluster(t testing.TB) *WraparoundCluster {
	t.Helper()
	c := &WraparoundCluster{clusters: ownClusters(t, "testenv-wraparound-")}
	c.initdb(t, "main")
	c.start(t, "main")
	c.DSN = c.dsn("main", "export")
	migrate(t, c.dsn("main", "postgres"), c.DSN)
	return c
}

// Guard restarts the cluster with its next transaction id a million short
// of wraparound, past the point where PostgreSQL stops assigning new ones
// ("database is not accepting commands to avoid wraparound data loss",
// SQLSTATE 54000): reads go on, and every statement that would write is
// refused, as after some 2 billion transactions (a year of sales at 70
// calls a second) with autovacuum unable to freeze a table all that while.
// The id is moved with pg_resetwal on the stopped cluster, which also
// needs the commit log's segment of that id (zeros: no transaction there
// has run). Sessions opened before are ended. Nothing holds autovacuum
// back here: it freezes the cluster's four databases one after the other
// and lifts the guard on its own, 80 s after Guard returned in a probe
// (about one database every 20 s), so a test checks
// the refusal at once, not after a wait.
func (c *WraparoundCluster) Guard(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	var oldest uint32
	err = conn.QueryRow(ctx, "SELECT min(datfrozenxid::text::bigint) FROM pg_database").Scan(&oldest)
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	data := filepath.Join(c.dir, "main")
	if out, err := runAs(c.user, filepath.Join(c.bin, "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop"); err != nil {
		t.Fatalf("testenv: pg_ctl stop: %v: %s", err, out)
	}
	// The wrap limit is the oldest datfrozenxid plus 2^31 - 1; PostgreSQL
	// stops assigning ids a few million before it (3 million in 15).
	next := oldest + 1<<31 - 1 - 1_000_000
	if out, err := runAs(c.user, filepath.Join(c.bin, "pg_resetwal"), "-x", strconv.FormatUint(uint64(next), 10), "-D", data); err != nil {
		t.Fatalf("testenv: pg_resetwal: %v: %s", err, out)
	}
	// A commit-log segment holds 2 bits for each of 32 pages × 8 kB × 4 ids.
	segment := filepath.Join(data, "pg_xact", fmt.Sprintf("%04X", next/(32*8192*4)))
	if err := os.WriteFile(segment, make([]byte, 32*8192), 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if c.user != "" {
		if out, err := runAs("", "chown", c.user, segment); err != nil {
			t.Fatalf("testenv: chown: %v: %s", err, out)
		}
	}
	c.start(t, "main")
}
