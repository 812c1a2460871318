package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrOwnerNotFound is returned when items are written for an owner that does
// not exist (the lead's exportctl creates owners first).
var ErrOwnerNotFound = errors.New("catalog: owner does not exist")

// ImportResult counts what an import did: new items, changed items and items
// that were already exactly as imported (their updated_at does not move).
type ImportResult struct {
	Inserted, Updated, Unchanged int
	// StagingLeft is the import's staging table when the import could not
	// drop it as it ended, whether the import failed or not; nil otherwise.
	StagingLeft *StagingLeft
}

// Import upserts items (already validated by ParseJSONL) for ownerID. An
// item's updated_at moves only when something a consumer sees (or its
// source texts) changes.
//
// The items travel first by COPY into a staging table of the import's own
// (staging.go), which nobody else reads and which is dropped afterwards;
// every statement of an import is whole in itself, so it runs through a
// pooler in transaction mode as directly. They are then
// written ImportChunk at a time, in id order, each chunk one statement run
// outside an explicit transaction, so PostgreSQL commits it the moment it
// ends: no client round trip sits between the clock_timestamp() an item is
// stamped with and the COMMIT that makes it visible, and no item waits
// longer than its chunk's statement (tens of milliseconds) to be seen. That
// gap is what an updated_after sync can miss (see the export-reader README,
// sync guide): one statement for a whole catalog kept its first items
// stamped but unseen for as long as the import ran (a probe's incremental
// sync missed 13,234 of 15,000 items changed by a 2.5 s import), and held
// their row locks as long, so a sale of one of them waited for the whole
// import. The import is therefore not atomic: if it fails halfway, the
// chunks before are written, and running it again completes it (an item
// already as imported is left alone).
//
// Import never un-sells an item: it writes listed_active, and the exported
// status stays inactive while an item is sold.
//
// Every id is checked with ValidItemID, since items may be built by other
// code than ParseJSONL: one bad id refuses the whole batch, naming the item
// (1-based), not its id, which may hold an API key, before anything is
// written.
func Import(ctx context.Context, pool *pgxpool.Pool, ownerID string, items []Item) (ImportResult, error) {
	owner, err := ParseOwnerID(ownerID)
	if err != nil {
		return ImportResult{}, err
	}
	for i := range items {
		if err := ValidItemID(items[i].ID); err != nil {
			return ImportResult{}, fmt.Errorf("catalog: item %d: id: %w", i+1, err)
		}
	}
	if len(items) == 0 {
		return ImportResult{}, nil
	}
	return importFrom(ctx, pool, owner, itemRows(items))
}

// ImportJSONL imports the JSON Lines file r (ParseJSONL's format) for
// ownerID as Import does, without holding the file: each line is validated
// as it is read, and copied into the staging table with its batch (copyBatches),
// and a bad line (a *LineError) ends the import before anything is
// written, as ParseJSONL's would. A million-item catalog is imported in
// tens of megabytes, where parsing it whole took gigabytes. The connection
// is held while r is read, but no transaction is open while it waits for r.
func ImportJSONL(ctx context.Context, pool *pgxpool.Pool, ownerID string, r io.Reader) (ImportResult, error) {
	owner, err := ParseOwnerID(ownerID)
	if err != nil {
		return ImportResult{}, err
	}
	rows := &fileRows{lines: NewLineReader(r)}
	res, err := importFrom(ctx, pool, owner, rows)
	if rows.err != nil {
		// The file's own error ended the staging: it says more than the
		// error it is wrapped in.
		return ImportResult{StagingLeft: res.StagingLeft}, rows.err
	}
	return res, err
}

// importFrom stages the rows of source in a staging table of the import's
// own and writes them for owner, on one connection of pool, then drops the
// table through pool: a Ctrl-C during a statement closes the connection
// it ran on (pgx), and the table would stay until a later import dropped it.
// A table it could not drop is in the result (StagingLeft), with an error
// or without.
func importFrom(ctx context.Context, pool *pgxpool.Pool, owner pgtype.UUID, source pgx.CopyFromSource) (ImportResult, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return ImportResult{}, fmt.Errorf("catalog: %w", err)
	}
	run, err := openStaging(ctx, conn.Conn(), owner)
	if err != nil {
		conn.Release()
		return ImportResult{}, err
	}
	res, err := importInto(ctx, conn.Conn(), owner, run, source)
	conn.Release()
	left := run.drop(ctx, pool)
	if err != nil {
		return ImportResult{StagingLeft: left}, ownerError(stagingError(err, run))
	}
	res.StagingLeft = left
	return res, nil
}

// importInto copies the rows of source into run's table and writes them
// for owner.
func importInto(ctx context.Context, conn *pgx.Conn, owner pgtype.UUID, run *stagingRun, source pgx.CopyFromSource) (ImportResult, error) {
	total, err := copyBatches(ctx, conn, run, source)
	if err != nil {
		return ImportResult{}, err
	}
	return writeStaged(ctx, conn, owner, run, total)
}

// writeStaged writes the total items of the staging table for owner, a
// chunk per statement.
func writeStaged(ctx context.Context, conn *pgx.Conn, owner pgtype.UUID, run *stagingRun, total int) (ImportResult, error) {
	var res ImportResult
	upsert := upsertChunk(run.table())
	after := "" // the last id written; every valid id sorts after ""
	for written := 0; written < total; {
		if err := run.markSeenIfDue(ctx, conn); err != nil {
			return res, &WriteError{Written: written, Total: total, Err: err}
		}
		var inserted, touched, read int
		if err := conn.QueryRow(ctx, upsert, owner, after, ImportChunk, chunkLockWait).Scan(&inserted, &touched, &read, &after); err != nil {
			return res, &WriteError{Written: written, Total: total, AtLeast: mayHaveCommitted(err), Err: chunkError(ctx, conn, err)}
		}
		if read == 0 { // cannot happen: every staged id follows the last one written
			return res, &WriteError{Written: written, Total: total, Err: errors.New("catalog: the staged items after the last one written were not found")}
		}
		res.Inserted += inserted
		res.Updated += touched - inserted
		res.Unchanged += read - touched
		written += read
	}
	return res, nil
}

// WriteError is an import's error once its items are staged, in a chunk:
// the chunks before it are committed, Written of the Total items (an
// item as imported already counts as written), and an import run again
// completes it. AtLeast is set when the failed chunk may have been
// committed all the same (mayHaveCommitted), so Written is a floor, and
// Written plus that chunk the most it wrote.
type WriteError struct {
	Written, Total int
	AtLeast        bool
	Err            error
}

func (e *WriteError) Error() string {
	if e.AtLeast {
		return fmt.Sprintf("catalog: stopped after writing %d of %d items (or %d: the chunk under way may have committed): %v",
			e.Written, e.Total, min(e.Written+ImportChunk, e.Total), e.Err)
	}
	return fmt.Sprintf("catalog: stopped after writing %d of %d items: %v", e.Written, e.Total, e.Err)
}

// mayHaveCommitted reports whether a chunk's statement that failed with
// err may have been committed anyway: it was sent, and no answer of
// PostgreSQL's says it failed. A Ctrl-C (the context cancelled) or a
// connection lost between the statement's commit and its reply are such:
// pgx's cancel request comes too late to roll it back.
func mayHaveCommitted(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// copyBatches copies the rows of source into the staging table and returns how
// many it copied. The rows are read a batch at a time (StageBatch rows, or
// stageBatchBytes of them), each batch whole before its own COPY: a COPY
// is a transaction, and one COPY fed while the file was read held its
// snapshot for as long as the reading took, the time of the file, or of
// whatever writes it to the standard input (exportctl items import --file -).
// While a transaction holds a snapshot, no VACUUM of any table of the
// database removes a row version that became dead after it began: the
// versions every sale leaves behind piled up for the whole read (a slow
// pipe held for a minute under sales grew export_items twice as fast as
// without it, 13,888 dead versions "not yet removable"), and that space
// stays with the tables. Between batches no transaction is open, however
// long the next line takes to come. The next batch is read while one is
// copied (readBatches), so validating the file and PostgreSQL's COPY
// still run side by side, as in one COPY. While it waits for the file, the
// run is marked seen (stagingRun), so that no other import takes it for
// stopped however slowly the file comes.
func copyBatches(ctx context.Context, conn *pgx.Conn, run *stagingRun, source pgx.CopyFromSource) (int, error) {
	batches, stop := readBatches(source)
	defer stop()
	seen := time.NewTicker(stagingSeenEvery)
	defer seen.Stop()
	total := 0
	var text []byte // a batch in COPY's text format, its buffer kept for the next
	for {
		select {
		case <-seen.C:
			if err := run.markSeen(ctx, conn); err != nil {
				return total, err
			}
		case b, ok := <-batches:
			if !ok {
				return total, nil
			}
			if b.err != nil {
				return total, fmt.Errorf("catalog: read: %w", b.err)
			}
			var err error
			if text, err = appendCopyText(text[:0], b.rows); err != nil {
				return total, err
			}
			n, err := copyBatch(ctx, conn, run, text)
			if err != nil {
				return total, fmt.Errorf("catalog: copy: %w", copyError(ctx, err))
			}
			total += int(n)
		}
	}
}

// copyError is err, or the context's error when the context ended: pgconn
// closes the connection to stop a COPY cut short, and its read then failed
// with "use of closed network connection", which read as a lost database
// where it was a Ctrl-C (4 of 5 tries, HS).
func copyError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return err
}

// copyBatch copies a batch (appendCopyText's text) into run's table in a transaction of its own, not
// as a COPY alone. Behind PgBouncer in transaction mode (1.18), a COPY
// alone that a Ctrl-C cut short left the server connection it ran on
// linked to whichever client came next, its answer never sent: two
// cancelled imports took both server connections of a pool of 2, and
// every client of the pool waited (query_wait_timeout). In a transaction,
// the server connection stays the import's until it ends, and PgBouncer
// closes it with the import's connection.
func copyBatch(ctx context.Context, conn *pgx.Conn, run *stagingRun, text []byte) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		n, err = copyTextIn(ctx, tx, run, text)
		return err
	})
	return n, err
}

// batch is a batch of staging rows read, or the error that ended the
// reading.
type batch struct {
	rows [][]any
	err  error
}

// readBatches reads the batches of source on a goroutine of its own, one
// ahead of the batch being copied, and closes the channel after the last
// (or an error). stop ends the reading and returns once the goroutine has
// ended: after the batch it is reading, so that source is not read once
// stop has returned.
func readBatches(source pgx.CopyFromSource) (batches <-chan batch, stop func()) {
	out := make(chan batch)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for more := true; more; {
			var b batch
			b.rows, more, b.err = readBatch(source)
			if len(b.rows) == 0 && b.err == nil {
				return
			}
			select {
			case out <- b:
			case <-quit:
				return
			}
			more = more && b.err == nil
		}
	}()
	return out, func() { close(quit); <-done }
}

// StageBatch is how many rows one COPY into the staging table takes at
// most; stageBatchBytes bounds the bytes of a batch's values (a batch ends
// with the row that passes it), so that a file of large items is not held
// a thousand at a time (a line may be 1 MiB).
const (
	StageBatch      = ImportChunk
	stageBatchBytes = 8 << 20
)

// readBatch reads the next batch of rows from source, and whether source
// may have more.
func readBatch(source pgx.CopyFromSource) (rows [][]any, more bool, err error) {
	size := 0
	for len(rows) < StageBatch && size < stageBatchBytes {
		if !source.Next() {
			return rows, false, source.Err()
		}
		row, err := source.Values()
		if err != nil {
			return nil, false, err
		}
		rows = append(rows, row)
		size += valuesBytes(row)
	}
	return rows, true, nil
}

// valuesBytes is about the memory a staging row's values hold: its strings
// and byte slices, which are all but a few bytes of it.
func valuesBytes(row []any) int {
	n := 0
	for _, v := range row {
		switch v := v.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		}
	}
	return n
}

// ImportChunk is how many items Import writes per statement (and so per
// commit): small enough that a chunk is seen within tens of milliseconds of
// its stamps and holds its rows' locks as briefly, large enough that the
// statements' own cost stays small against the rows'.
const ImportChunk = 1000

var stagingColumns = []string{"id", "coin_id", "listed_active", "price", "currency", "category",
	"characteristics", "images", "texts", "doc_eng", "doc_rus", "doc_ukr"}

// NextUpdatedAt is the SQL of an item's new updated_at in an UPDATE of
// export_items, whose old row is named table there: clock_timestamp(), or
// the row's last stamp plus a microsecond when the server's clock reads
// earlier than that (it stepped back). A client that synced the row at its
// last stamp asks for updated_after that stamp, so a change stamped earlier
// would never reach it; every writer of export_items uses this expression.
func NextUpdatedAt(table string) string {
	return "greatest(clock_timestamp(), " + table + ".updated_at + interval '1 microsecond')"
}

// upsertChunk writes the new and changed items among the $3 staged ones
// whose ids follow $2 (owner $1), stamping each with clock_timestamp() as it
// is written (never earlier than its last stamp: NextUpdatedAt), and
// returns how many it inserted, how many it wrote in all, how many it read
// and the last id read. An item whose stored form is identical is left out
// before the INSERT (changed), so it is neither counted, re-stamped nor
// locked: ON CONFLICT DO UPDATE locks every conflicting row, its WHERE
// false or not, and each lock is a WAL record and a dirtied page, so a
// re-import of an unchanged 20,000-item catalog wrote 33 MB of WAL after a
// checkpoint (a full-page image of every page it locked a row in), the
// size of the table, where it now writes next to nothing; a sale of an
// unchanged item no longer waits for its chunk either. The WHERE of the
// ON CONFLICT still skips an item that another import made identical
// after this statement's snapshot; an item identical in the snapshot but
// being changed by another import meanwhile is left to that import, as if
// this chunk had run before it (two imports of one owner interleave their
// chunks, and had no order between them before either). Rows are locked in
// id order, so two imports of overlapping files cannot deadlock each other.
// The owner's shared sync lock (WriterLock, barrier.go) is taken before
// the first row is read, so before any stamp, and each wait for a row
// another transaction holds locked is bounded by $4 (ChunkLockWait).
// It reads the staging table named staging.
func upsertChunk(staging string) string {
	return `WITH barrier AS (
SELECT ` + boundedWriterLock("$1::uuid", "$4") + `
), chunk AS (
SELECT * FROM ` + staging + ` WHERE id > $2 AND EXISTS (SELECT FROM barrier) ORDER BY id LIMIT $3
), changed AS (
SELECT * FROM chunk c WHERE NOT EXISTS (
    SELECT FROM export_items s WHERE s.owner_id = $1 AND s.id = c.id
      AND (s.listed_active, s.doc_eng, s.doc_rus, s.doc_ukr, s.texts)
          IS NOT DISTINCT FROM (c.listed_active, c.doc_eng, c.doc_rus, c.doc_ukr, c.texts))
), written AS (
INSERT INTO export_items AS e (owner_id, id, coin_id, listed_active, price, currency,
    category, characteristics, images, texts, doc_eng, doc_rus, doc_ukr, updated_at)
SELECT $1, id, coin_id, listed_active, price, currency, category, characteristics, images, texts,
    doc_eng, doc_rus, doc_ukr, clock_timestamp()
FROM changed ORDER BY id
ON CONFLICT (owner_id, id) DO UPDATE SET
    coin_id = EXCLUDED.coin_id, listed_active = EXCLUDED.listed_active, price = EXCLUDED.price,
    currency = EXCLUDED.currency, category = EXCLUDED.category, characteristics = EXCLUDED.characteristics,
    images = EXCLUDED.images, texts = EXCLUDED.texts,
    doc_eng = EXCLUDED.doc_eng, doc_rus = EXCLUDED.doc_rus, doc_ukr = EXCLUDED.doc_ukr,
    updated_at = ` + NextUpdatedAt("e") + `
WHERE (e.listed_active, e.doc_eng, e.doc_rus, e.doc_ukr, e.texts)
    IS DISTINCT FROM (EXCLUDED.listed_active, EXCLUDED.doc_eng, EXCLUDED.doc_rus, EXCLUDED.doc_ukr, EXCLUDED.texts)
RETURNING (e.xmax = 0) AS inserted)
SELECT (SELECT count(*) FILTER (WHERE inserted) FROM written), (SELECT count(*) FROM written),
    (SELECT count(*) FROM chunk), coalesce((SELECT max(id) FROM chunk), $2)`
}

// itemRows feeds CopyFrom with items.
func itemRows(items []Item) pgx.CopyFromSource {
	return pgx.CopyFromSlice(len(items), func(i int) ([]any, error) { return stagingRow(&items[i]) })
}

// fileRows feeds CopyFrom with the items of an import file as they are
// read. A bad line (its *LineError) or a failed read ends the rows, and is
// kept in err.
type fileRows struct {
	lines *LineReader
	item  Item
	err   error
}

func (f *fileRows) Next() bool {
	it, err := f.lines.Next()
	if err != nil {
		if !errors.Is(err, io.EOF) {
			f.err = err
		}
		return false
	}
	f.item = it
	return true
}

func (f *fileRows) Values() ([]any, error) { return stagingRow(&f.item) }

func (f *fileRows) Err() error { return f.err }

// stagingRow is an item's row of the staging table, with its three
// documents rendered.
func stagingRow(it *Item) ([]any, error) {
	texts, err := json.Marshal(it.Texts)
	if err != nil {
		return nil, err
	}
	images, err := json.Marshal(it.Images)
	if err != nil {
		return nil, err
	}
	return []any{it.ID, it.CoinID, it.Status == StatusActive, numeric(it.Price), it.Currency,
		nullableJSON(it.Category), defaultJSON(it.Characteristics, "{}"), images, texts,
		string(Render(it, "ENG")), string(Render(it, "RUS")), string(Render(it, "UKR"))}, nil
}

// numeric converts a validated price (at most 4 fractional digits).
func numeric(p *json.Number) pgtype.Numeric {
	if p == nil {
		return pgtype.Numeric{}
	}
	r, ok := new(big.Rat).SetString(string(*p))
	if !ok {
		return pgtype.Numeric{}
	}
	scaled := new(big.Rat).Mul(r, big.NewRat(10_000, 1))
	return pgtype.Numeric{Int: new(big.Int).Quo(scaled.Num(), scaled.Denom()), Exp: -4, Valid: true}
}

func nullableJSON(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	return []byte(raw)
}

func defaultJSON(raw json.RawMessage, empty string) []byte {
	if len(raw) == 0 {
		return []byte(empty)
	}
	return raw
}

// ParseOwnerID checks that s is a UUID (the owners' key), so a typo is a
// clear error rather than a database one.
func ParseOwnerID(s string) (pgtype.UUID, error) {
	var u pgtype.UUID
	if err := u.Scan(s); err != nil || !u.Valid {
		return pgtype.UUID{}, fmt.Errorf("catalog: owner id %q is not a UUID", s)
	}
	return u, nil
}

// ownerError turns the foreign-key violation of a missing owner into
// ErrOwnerNotFound, keeping a WriteError's count of the chunks before it:
// an owner deleted during an import (with its items) is missing only from
// the chunk that failed.
func ownerError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23503" || !strings.Contains(pgErr.ConstraintName, "owner") {
		return err
	}
	var cut *WriteError
	if errors.As(err, &cut) {
		return &WriteError{Written: cut.Written, Total: cut.Total, Err: ErrOwnerNotFound}
	}
	return ErrOwnerNotFound
}
