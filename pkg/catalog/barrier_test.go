package catalog_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// returnsWithin runs f and reports whether it returned within d; f keeps
// running (and is waited for at cleanup) if it did not.
func returnsWithin(t *testing.T, d time.Duration, f func() error) (returned bool, wait func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return true, func() error { return err }
	case <-time.After(d):
		return false, func() error {
			select {
			case err := <-done:
				return err
			case <-time.After(10 * time.Second):
				t.Fatal("still waiting 10 s after the lock was released")
				return nil
			}
		}
	}
}

func ownerUUID(t *testing.T, id string) pgtype.UUID {
	t.Helper()
	u, err := catalog.ParseOwnerID(id)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A sync's barrier waits for a writer of its owner that has stamped a row
// and not committed yet, and then sees the row; it does not wait for a
// writer of another owner.
func TestSyncBarrierWaitsForWritersInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner, other := ownerWithItems(t, pool, lineA), newOwner(t, pool)

	// A writer, as every writer of export_items does: the shared lock
	// first, then the stamp, then (later) the commit.
	tx := holdWriterLock(t, pool, owner)
	var stamped time.Time
	if err := tx.QueryRow(ctx, `UPDATE export_items SET updated_at = clock_timestamp() WHERE owner_id = $1 AND id = 'a' RETURNING updated_at`,
		owner).Scan(&stamped); err != nil {
		t.Fatal(err)
	}

	if returned, wait := returnsWithin(t, 5*time.Second, func() error { return catalog.SyncBarrier(ctx, pool, ownerUUID(t, other)) }); !returned {
		t.Error("the barrier of another owner waited for this owner's writer")
		_ = wait
	}
	returned, wait := returnsWithin(t, 300*time.Millisecond, func() error { return catalog.SyncBarrier(ctx, pool, ownerUUID(t, owner)) })
	if returned {
		t.Fatal("the barrier returned while a writer of its owner had a stamped row uncommitted")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	// What the sync's first query then reads has the change.
	if got := stored(t, pool, owner, "a").UpdatedAt; !got.Equal(stamped) {
		t.Errorf("after the barrier the item reads updated_at %v, want the writer's %v", got, stamped)
	}
}

// A writer in flight that is stuck (waiting for a row another transaction
// holds locked) makes the barrier give up after SyncBarrierWait with
// ErrSyncBusy, and the owner's writers that queued behind the barrier go
// through then, while the stuck one still holds its lock. The bound is
// the statement's own: the connection's lock_timeout is unchanged after.
func TestSyncBarrierGivesUpOnAStuckWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	holdWriterLock(t, pool, owner) // the stuck writer, until the test ends

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// Named, so that its wait for the stuck writer's lock can be seen.
	if _, err := conn.Exec(ctx, "SET application_name = 'sync barrier'"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	barrier := make(chan error, 1)
	go func() { barrier <- catalog.SyncBarrier(ctx, conn, ownerUUID(t, owner)) }()
	testenv.WaitForALockWait(t, pool, "sync barrier") // the barrier is waiting: a new writer queues behind it
	queued, wait := returnsWithin(t, catalog.SyncBarrierWait+5*time.Second, func() error {
		_, err := pool.Exec(ctx, `SELECT `+catalog.WriterLock("$1::uuid"), owner)
		return err
	})
	if !queued {
		t.Fatal("a writer that queued behind the barrier still waits after the barrier's bound")
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if err := <-barrier; !errors.Is(err, catalog.ErrSyncBusy) {
		t.Fatalf("barrier behind a stuck writer = %v, want ErrSyncBusy", err)
	}
	if took := time.Since(start); took < catalog.SyncBarrierWait {
		t.Errorf("the barrier gave up after %v, want at least %v", took, catalog.SyncBarrierWait)
	}
	var timeout string
	if err := conn.QueryRow(ctx, "SHOW lock_timeout").Scan(&timeout); err != nil || timeout != "0" {
		t.Errorf("lock_timeout after the barrier = %q, %v; want 0 (the bound is the statement's own)", timeout, err)
	}
}

// holdWriterLock opens a transaction holding the owner's shared sync lock,
// as every writer of export_items takes it first; it ends at the test's end
// unless the test ends it sooner.
func holdWriterLock(t *testing.T, pool *pgxpool.Pool, owner string) pgx.Tx {
	t.Helper()
	return testenv.InTransaction(t, pool, `SELECT `+catalog.WriterLock("$1::uuid"), owner)
}

// holdBarrier takes the owner's sync lock exclusively, as a sync's barrier
// does for an instant, and holds it until release is called.
func holdBarrier(t *testing.T, pool *pgxpool.Pool, owner string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The barrier's statement, held open in a transaction.
	if err := catalog.SyncBarrier(ctx, tx, ownerUUID(t, owner)); err != nil {
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback(ctx) }
}

// An import takes its owner's shared sync lock before it stamps a row: it
// waits while a barrier holds the lock, and writes once it is released.
func TestImportTakesTheWriterLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)
	release := holdBarrier(t, pool, owner)
	returned, wait := returnsWithin(t, 300*time.Millisecond, func() error {
		_, err := catalog.Import(ctx, pool, owner, mustParse(t, lineA))
		return err
	})
	if returned {
		release()
		t.Fatal("Import wrote while the owner's sync barrier held the lock")
	}
	release()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, pool, owner, "a"); got.DocENG == "" {
		t.Error("the import wrote nothing after the barrier was released")
	}
}

// An import or a restamp that meets an item another transaction keeps
// locked (an operator's SELECT … FOR UPDATE left open) gives up after
// ChunkLockWait with ErrItemsLocked, naming that transaction's session,
// instead of waiting as long as it lasts with the owner's writer lock
// held, which made every sync of the owner give up at its barrier.
func TestImportAndRestampGiveUpOnALockedItem(t *testing.T) {
	t.Parallel()
	for name, write := range map[string]func(ctx context.Context, pool *pgxpool.Pool, owner string) error{
		"import": func(ctx context.Context, pool *pgxpool.Pool, owner string) error {
			_, err := catalog.Import(ctx, pool, owner, mustParse(t, lineA2))
			return err
		},
		"restamp": func(ctx context.Context, pool *pgxpool.Pool, owner string) error {
			_, err := catalog.Restamp(ctx, pool, ownerUUID(t, owner))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testenv.Postgres(t)
			owner := ownerWithItems(t, pool, lineA)
			operator := testenv.InTransaction(t, pool, `SELECT FROM export_items WHERE owner_id = $1 AND id = 'a' FOR UPDATE`, owner)
			var pid int
			if err := operator.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			returned, wait := returnsWithin(t, catalog.ChunkLockWait+10*time.Second, func() error { return write(ctx, pool, owner) })
			if !returned {
				_ = operator.Rollback(ctx)
				t.Fatalf("the %s still waits for the locked item %v past ChunkLockWait", name, 10*time.Second)
			}
			err := wait()
			if !errors.Is(err, catalog.ErrItemsLocked) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (", pid)) {
				t.Fatalf("%s of a locked item = %v, want ErrItemsLocked naming pid %d", name, err, pid)
			}
			// It holds nothing of the owner now: a sync's barrier passes.
			if err := catalog.SyncBarrier(ctx, pool, ownerUUID(t, owner)); err != nil {
				t.Errorf("SyncBarrier() after the %s gave up = %v", name, err)
			}
		})
	}
}
