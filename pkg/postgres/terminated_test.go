package postgres_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A session terminated (pg_terminate_backend) while its batch waits for a
// lock, a row written before the wait in the same transaction, is read as
// Terminated, and the row is not there: nothing was done. Cancelled
// instead (pg_cancel_backend), it is an ERROR, not Terminated; nor is a
// pooler's FATAL of the same SQLSTATE (no routine), which may follow a
// commit.
func TestTerminatedReadsASessionEndedBeforeItsCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.PostgresURL(t)
	admin := testenv.Pool(t, dsn)
	if _, err := admin.Exec(ctx, "CREATE TABLE written (n int)"); err != nil {
		t.Fatal(err)
	}
	for _, end := range []struct {
		stop           string
		wantTerminated bool
	}{
		{"pg_terminate_backend", true},
		{"pg_cancel_backend", false},
	} {
		held, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := held.Exec(ctx, "SELECT pg_advisory_xact_lock(42)"); err != nil {
			t.Fatal(err)
		}
		pool, err := postgres.Open(ctx, dsn+" application_name=ended-"+end.stop)
		if err != nil {
			t.Fatal(err)
		}
		ended := make(chan error, 1)
		go func() {
			batch := &pgx.Batch{}
			batch.Queue("INSERT INTO written VALUES (1)")
			batch.Queue("SELECT pg_advisory_xact_lock(42)")
			ended <- pool.SendBatch(ctx, batch).Close()
		}()
		testenv.WaitUntilTrue(t, admin, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'ended-"+end.stop+"' AND wait_event_type = 'Lock')")
		if _, err := admin.Exec(ctx, "SELECT "+end.stop+"(pid) FROM pg_stat_activity WHERE application_name = $1", "ended-"+end.stop); err != nil {
			t.Fatal(err)
		}
		err = <-ended
		if got := postgres.Terminated(err); got != end.wantTerminated {
			t.Errorf("Terminated(a batch ended by %s: %v) = %t, want %t", end.stop, err, got, end.wantTerminated)
		}
		_ = held.Rollback(ctx)
		pool.Close()
	}
	var written int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM written").Scan(&written); err != nil || written != 0 {
		t.Errorf("rows written by the ended batches = %d (%v), want 0", written, err)
	}
	pooler := &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection"}
	if postgres.Terminated(pooler) {
		t.Errorf("Terminated(a FATAL 57P01 without a routine, a pooler's) = true, want false")
	}
}

// An error that came after a warning (WarnedError) names the warning, is
// still what it wraps (a connection lost: Unreachable, not NothingDone),
// and Cause reads the warning's SQLSTATE when no server error says more.
func TestAnErrorAfterAWarningNamesIt(t *testing.T) {
	t.Parallel()
	err := error(&postgres.WarnedError{Warning: postgres.Warning{Code: "57P01", Severity: "WARNING",
		Message: "canceling the wait for synchronous replication and terminating connection due to administrator command"}, Err: io.ErrUnexpectedEOF})
	if !errors.Is(err, io.ErrUnexpectedEOF) || !postgres.Unreachable(err) || postgres.NothingDone(err) {
		t.Errorf("a connection lost after a warning: Is EOF %t, Unreachable %t, NothingDone %t; want true, true, false",
			errors.Is(err, io.ErrUnexpectedEOF), postgres.Unreachable(err), postgres.NothingDone(err))
	}
	if got := postgres.Cause(err); got == "" || got == postgres.Cause(&pgconn.PgError{Code: "57P01"}) {
		t.Errorf("Cause(a connection lost after a 57P01 warning) = %q, want the cause of a session ended after warning", got)
	}
	if got := err.Error(); got != "unexpected EOF (after PostgreSQL's WARNING 57P01: canceling the wait for synchronous replication and terminating connection due to administrator command)" {
		t.Errorf("the error's text = %q, want it to name the warning", got)
	}
}
