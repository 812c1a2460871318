package catalog

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Restamp gives every item of owner a new updated_at (now, never earlier
// than its last stamp: NextUpdatedAt), changing nothing else, and returns
// how many it stamped. It is the step that follows a restore of the
// database from a backup (README, "Restoring the database").
//
// A restore moves the catalog back in time under the marketplaces: an item
// sold, canceled or imported after the backup point is back as it was, with
// the updated_at it had then. Every marketplace's checkpoint is later than
// that stamp, so no incremental sync ever reads the item again; and a full
// sync would not mend it either, since a marketplace keeps the version of
// an item with the later updated_at (sync guide, step 3), which is the lost
// one it holds. After a drill's restore, a marketplace kept 77 of 2,010
// items wrong so, a full sync included (35 with the wrong status: sales
// and cancels lost; 42 with a lost import's content). Stamped anew,
// every item is later than any checkpoint and than any version a
// marketplace holds, so each one's next incremental sync, and any sync in
// flight past its cursor, reads the restored catalog whole and takes it:
// the contract's own recipe repairs the copies, with no signal a client
// must know.
//
// It writes RestampChunk items per statement, each committed at once and
// holding the owner's shared sync lock from before its stamps to its
// commit, as every writer does (barrier.go), so a sync that runs meanwhile
// misses nothing; rows are locked in id order, as an import locks them.
func Restamp(ctx context.Context, pool *pgxpool.Pool, owner pgtype.UUID) (int, error) {
	total := 0
	after := "" // the last id stamped; every valid id sorts after ""
	for {
		var stamped int
		if err := pool.QueryRow(ctx, restampChunk, owner, after, chunkLockWait).Scan(&stamped, &after); err != nil {
			return total, fmt.Errorf("catalog: restamp after %d items: %w", total, chunkError(ctx, pool, err))
		}
		total += stamped
		if stamped < RestampChunk {
			return total, nil
		}
	}
}

// RestampChunk is how many items Restamp stamps per statement and commit,
// as ImportChunk for an import.
const RestampChunk = ImportChunk

// restampChunk stamps anew the RestampChunk items of owner $1 whose ids
// follow $2, locked in id order (each wait for a row another transaction
// holds locked bounded by $3, ChunkLockWait), and returns how many it
// stamped and the last id. (A var: it is built with WriterLock and
// NextUpdatedAt.) The
// limit is written in, not a parameter: from its sixth run pgx's prepared
// statement gets PostgreSQL's generic plan, which, not knowing the limit,
// sorted every item of the owner after $2 for each chunk: 200,000 items
// took 66 s, 9 s with the limit known.
var restampChunk = `WITH barrier AS (
SELECT ` + boundedWriterLock("$1::uuid", "$3") + `
), chunk AS (
SELECT id FROM export_items
WHERE owner_id = $1 AND id > $2 AND EXISTS (SELECT FROM barrier)
ORDER BY id LIMIT ` + strconv.Itoa(RestampChunk) + ` FOR UPDATE
), stamped AS (
UPDATE export_items AS e SET updated_at = ` + NextUpdatedAt("e") + `
FROM chunk WHERE e.owner_id = $1 AND e.id = chunk.id
RETURNING e.id)
SELECT count(*)::int, coalesce(max(id), $2) FROM stamped`
