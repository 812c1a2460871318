package catalog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/coinexport/export/pkg/postgres"
)

// The sync barrier makes the contract's sync recipe (spec 4.8: record the
// start time, read every page, then pass that time as updated_after) miss
// nothing, where by itself it misses changes:
//
// A writer stamps updated_at with clock_timestamp() while it writes, and
// its change becomes visible only when it commits, a little later (the end
// of a sale's statement and its WAL flush; a 1,000-item import chunk,
// tens of milliseconds). A sync that starts in between does not see the
// change, and the next sync, asking for changes after this one's start,
// skips it too, as it is stamped earlier. A probe that synced back to back
// as spec 4.8 says lost 18 of 400 sales and 4,981 of 5,000 imported items.
//
// So every writer that stamps updated_at first takes a shared advisory lock
// on its owner (WriterLock), before it stamps anything, and holds it until
// it commits; writers do not wait for each other. The first page of a sync
// (a list request without a cursor) first takes the same lock exclusively
// for an instant (SyncBarrier): it waits until every writer of the owner
// that may have stamped a row before that instant has committed, and its
// own query then starts after them. A row stamped before a sync's start is
// therefore visible to that sync's every page; a row stamped after it is
// seen by this sync or has updated_at after its start, where the next sync
// begins. What remains is the client's clock: a start time read from a
// clock ahead of the database's can still skip a change, which is why the
// sync guide keeps its overlap.
//
// The wait is short: in-flight writers only (a sale's commit, at most one
// import chunk); new writers queue behind the barrier for as long. It is
// bounded (SyncBarrierWait): a writer in flight can itself wait, for a row
// another transaction holds locked (an operator's SELECT ... FOR UPDATE),
// up to its query timeout, and every writer of the owner that comes after
// the barrier would queue behind it as long. Past the bound the barrier
// gives up (ErrSyncBusy: the first page answers 503, and the client asks
// again after a backoff), so that the owner's other sales go through.

// syncLockClass is the first key of the owner's advisory lock (the second
// is hashtext of the owner id): a namespace of its own, apart from any
// other advisory lock in the database. Owners whose ids hash alike share a
// lock, which costs them a wait, never a miss.
const syncLockClass = 1_868_789_363 // "owns" in ASCII

// WriterLock is the SQL expression that takes the shared sync lock of the
// owner whose id (a uuid) is the SQL expression owner, until the
// transaction ends. A writer evaluates it before it stamps updated_at: in a
// single statement, as a CTE that the statement's first row-changing step
// requires (EXISTS), so that it runs before any row is locked or stamped.
func WriterLock(owner string) string {
	return "pg_advisory_xact_lock_shared(" + strconv.Itoa(syncLockClass) + ", hashtext(" + owner + "::text))"
}

// SyncBarrierWait is the longest the barrier waits for the writers in
// flight: far longer than a sale's commit or an import chunk takes, short
// enough that the owner's writers queued behind the barrier are not held
// up for a writer that is stuck.
const SyncBarrierWait = 2 * time.Second

// ErrSyncBusy is the barrier giving up after SyncBarrierWait.
var ErrSyncBusy = errors.New("catalog: a write of the owner's items has been in flight for longer than the sync barrier waits")

// syncBarrier takes the owner's sync lock exclusively and, run on its own
// outside a transaction, releases it as its statement ends: it returns once
// every writer that held the lock when it asked has committed or rolled
// back, or fails with lock_not_available after $2 of waiting. The
// subquery sets lock_timeout (for this statement's transaction only)
// before the lock is asked for: a subquery with a volatile function is
// never merged into its parent, so it runs first.
var syncBarrier = "SELECT pg_advisory_xact_lock(" + strconv.Itoa(syncLockClass) + ", hashtext($1::uuid::text))" +
	" FROM (SELECT set_config('lock_timeout', $2, true)) AS bounded"

// lockNotAvailable is PostgreSQL's SQLSTATE for a lock_timeout.
const lockNotAvailable = "55P03"

// Execer runs a statement (a pool or a connection).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SyncBarrier waits until every write of the owner's items in flight now
// has committed (see above). A sync's first page calls it before its query.
// It fails with ErrSyncBusy if they take longer than SyncBarrierWait.
func SyncBarrier(ctx context.Context, db Execer, owner pgtype.UUID) error {
	_, err := db.Exec(ctx, syncBarrier, owner, strconv.FormatInt(SyncBarrierWait.Milliseconds(), 10)+"ms")
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
		return ErrSyncBusy
	case err != nil:
		return fmt.Errorf("catalog: sync barrier: %w", err)
	}
	return nil
}

// ChunkLockWait bounds each wait of an import's or a restamp's chunk for a
// lock another transaction holds on one of its items. A chunk waits
// holding its owner's writer lock, so every sync of the owner that starts
// meanwhile gives up at its barrier (503 after SyncBarrierWait), for as
// long as the chunk waits: behind an operator's forgotten
// SELECT … FOR UPDATE on one item, an import waited without end and
// without a word, and every first page of the owner's syncs answered 503
// all the while. The waits a chunk meets otherwise (a sale's statement,
// another import's or restamp's chunk) last milliseconds, a second or so
// on a loaded host. Past the bound the chunk fails with ErrItemsLocked,
// naming the sessions whose transactions are that old. A table's lock (a
// migration's) is taken before the statement runs, and waited for without
// the bound, holding nothing of the owner.
const ChunkLockWait = 10 * time.Second

// ErrItemsLocked is an import's or a restamp's chunk that gave up after
// ChunkLockWait on an item another transaction keeps locked.
var ErrItemsLocked = errors.New("catalog: an item stayed locked by another transaction for over " +
	ChunkLockWait.String() + " (no longer is waited for: the owner's syncs wait for the writer meanwhile)")

// boundedWriterLock is the SELECT list and FROM of a chunk's first step:
// the owner's writer lock (WriterLock), taken once the transaction's
// lock_timeout is ChunkLockWait; wait is the SQL parameter holding
// chunkLockWait. A subquery with a volatile function is never merged into
// its parent, so the setting comes first, and every lock the statement
// then waits for is bounded; the transaction is the chunk's statement, so
// the setting ends with it.
func boundedWriterLock(owner, wait string) string {
	return WriterLock(owner) + " FROM (SELECT set_config('lock_timeout', " + wait + ", true)) AS bounded"
}

// chunkLockWait is ChunkLockWait as lock_timeout reads it.
var chunkLockWait = strconv.FormatInt(ChunkLockWait.Milliseconds(), 10) + "ms"

// chunkError is a chunk's error, made ErrItemsLocked (with the sessions
// that may hold the lock) when the chunk gave up waiting for a lock.
func chunkError(ctx context.Context, db postgres.Querier, err error) error {
	if !postgres.LockTimedOut(err) {
		return err
	}
	return fmt.Errorf("%w: %s", ErrItemsLocked, postgres.OldTransactions(ctx, db, ChunkLockWait))
}
