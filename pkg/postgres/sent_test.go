package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A call's Sent says nothing was sent until Acquire gives it a
// connection, under its context or one derived from it; a wait for a
// connection that ends without one sends nothing; another call's
// connection is not its.
func TestSentCountsTheCallsOwnConnections(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx, sent := postgres.TrackSent(context.Background())
	other, otherSent := postgres.TrackSent(context.Background())
	if !sent.Nothing() {
		t.Fatal("a new Sent says a statement may have been sent")
	}

	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := postgres.AcquireFunc(ended, pool, func(*pgxpool.Conn) error { return nil }); !postgres.NothingSent(err) {
		t.Fatalf("AcquireFunc under an ended context = %v, want an AcquireError", err)
	}
	if !sent.Nothing() {
		t.Error("a wait for a connection that got none marked the call's Sent")
	}

	if err := postgres.AcquireFunc(other, pool, func(*pgxpool.Conn) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !sent.Nothing() || otherSent.Nothing() {
		t.Errorf("after another call was given a connection: this call's Nothing() = %v (want true), the other's = %v (want false)", sent.Nothing(), otherSent.Nothing())
	}

	derived, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := postgres.AcquireFunc(derived, pool, func(conn *pgxpool.Conn) error {
		_, err := conn.Exec(derived, "SELECT 1")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if sent.Nothing() {
		t.Error("a call given a connection, which ran a statement on it, still says nothing was sent")
	}
}
