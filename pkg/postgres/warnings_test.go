package postgres_test

import (
	"context"
	"testing"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgconn"
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
	// The first warning is the one kept: its SQLSTATE and unlocalized
	// severity, which a log line and a span say.
	first := postgres.Warning{Code: "01000", Severity: "WARNING", Message: "a warning"}
	steps := []struct {
		stmt      string
		want      bool
		wantFirst postgres.Warning
	}{
		{`DO $$ BEGIN RAISE NOTICE 'a notice'; END $$`, false, postgres.Warning{}},
		{`DO $$ BEGIN RAISE WARNING 'a warning'; END $$`, true, first},
		{`DO $$ BEGIN RAISE WARNING 'another' USING ERRCODE = '01003'; END $$`, true, first},
		{`SELECT 1`, true, first}, // not Reset: still heard
	}
	for _, step := range steps {
		if _, err := conn.Exec(ctx, step.stmt); err != nil {
			t.Fatal(err)
		}
		if got := warnings.Heard(); got != step.want {
			t.Errorf("Heard() after %s = %t, want %t", step.stmt, got, step.want)
		}
		if got := warnings.First(); got != step.wantFirst {
			t.Errorf("First() after %s = %+v, want %+v", step.stmt, got, step.wantFirst)
		}
	}
	warnings.Reset()
	if _, err := conn.Exec(ctx, `SELECT 1`); err != nil || warnings.Heard() || warnings.First() != (postgres.Warning{}) {
		t.Errorf("Heard(), First() after Reset and SELECT 1 = %t, %+v (%v), want false, none", warnings.Heard(), warnings.First(), err)
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

// A notice is read from its unlocalized severity, whatever lc_messages
// made of the other; one without it (a pooler's, a server before 9.6)
// cannot say it is no warning, and counts as one: a commit group then
// stays cautious rather than take silence for a plain commit.
func TestANoticeIsAWarningByItsUnlocalizedSeverity(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		notice pgconn.Notice
		want   bool
	}{
		{pgconn.Notice{Severity: "WARNUNG", SeverityUnlocalized: "WARNING"}, true},
		{pgconn.Notice{Severity: "HINWEIS", SeverityUnlocalized: "NOTICE"}, false},
		{pgconn.Notice{Severity: "NOTICE"}, true},
	} {
		if got := postgres.IsWarning(&c.notice); got != c.want {
			t.Errorf("IsWarning(severity %q, unlocalized %q) = %t, want %t", c.notice.Severity, c.notice.SeverityUnlocalized, got, c.want)
		}
	}
}
