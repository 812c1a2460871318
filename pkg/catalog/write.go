package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

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
}

// Import upserts items (already validated by ParseJSONL) for ownerID,
// atomically. An item's updated_at moves only when something a consumer
// sees (or its source texts) changes.
//
// The write itself is one statement run outside an explicit transaction, so
// PostgreSQL commits it the moment it ends: no client round trip sits
// between the clock_timestamp() an item is stamped with and the COMMIT that
// makes it visible. That gap is what an updated_after sync can miss (see the
// export-reader README, sync guide), so it is kept as short as the server
// can make it. The items travel first by COPY into a session-private staging
// table, which nobody else sees and which is dropped afterwards.
//
// Import never un-sells an item: it writes listed_active, and the exported
// status stays inactive while an item is sold.
//
// Every id is checked with ValidItemID, since items may be built by other
// code than ParseJSONL: one bad id refuses the whole batch, naming the item
// (1-based), before anything is written.
func Import(ctx context.Context, pool *pgxpool.Pool, ownerID string, items []Item) (ImportResult, error) {
	owner, err := ParseOwnerID(ownerID)
	if err != nil {
		return ImportResult{}, err
	}
	for i := range items {
		if err := ValidItemID(items[i].ID); err != nil {
			return ImportResult{}, fmt.Errorf("catalog: item %d: id %q %w", i+1, items[i].ID, err)
		}
	}
	if len(items) == 0 {
		return ImportResult{}, nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return ImportResult{}, fmt.Errorf("catalog: %w", err)
	}
	defer conn.Release()
	res, err := importOn(ctx, conn.Conn(), owner, items)
	if err != nil {
		return ImportResult{}, ownerError(err)
	}
	return res, nil
}

func importOn(ctx context.Context, conn *pgx.Conn, owner pgtype.UUID, items []Item) (ImportResult, error) {
	// A connection left with the table by a failed import is cleaned first.
	if _, err := conn.Exec(ctx, dropStaging); err != nil {
		return ImportResult{}, fmt.Errorf("catalog: staging table: %w", err)
	}
	if _, err := conn.Exec(ctx, createStaging); err != nil {
		return ImportResult{}, fmt.Errorf("catalog: staging table: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), dropStaging+"; RESET default_toast_compression")
	}()
	// lz4 compresses the stored documents several times faster than pglz,
	// on write and on every read; a server built without it keeps pglz.
	_, _ = conn.Exec(ctx, "SET default_toast_compression = lz4")
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"import_items"}, stagingColumns, itemRows(items)); err != nil {
		return ImportResult{}, fmt.Errorf("catalog: copy: %w", err)
	}
	var res ImportResult
	var touched int
	if err := conn.QueryRow(ctx, upsertFromStaging, owner).Scan(&res.Inserted, &touched); err != nil {
		return ImportResult{}, fmt.Errorf("catalog: upsert: %w", err)
	}
	res.Updated = touched - res.Inserted
	res.Unchanged = len(items) - touched
	return res, nil
}

const dropStaging = `DROP TABLE IF EXISTS pg_temp.import_items`

const createStaging = `CREATE TEMP TABLE import_items (
    id text NOT NULL, coin_id text, listed_active boolean NOT NULL, price numeric(18,4),
    currency text NOT NULL, category jsonb, characteristics jsonb NOT NULL, images jsonb NOT NULL,
    texts jsonb NOT NULL, doc_eng text NOT NULL, doc_rus text NOT NULL, doc_ukr text NOT NULL
)`

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

// upsertFromStaging writes new and changed items, stamping each with
// clock_timestamp() as it is written (never earlier than its last stamp:
// NextUpdatedAt), and counts them. An item whose stored form is identical
// is skipped by the WHERE, so it is neither counted nor re-stamped. Rows are
// locked in id order, so two imports of overlapping files cannot deadlock
// each other. (A var: it is built with NextUpdatedAt.)
var upsertFromStaging = `WITH written AS (
INSERT INTO export_items AS e (owner_id, id, coin_id, listed_active, price, currency,
    category, characteristics, images, texts, doc_eng, doc_rus, doc_ukr, updated_at)
SELECT $1, id, coin_id, listed_active, price, currency, category, characteristics, images, texts,
    doc_eng, doc_rus, doc_ukr, clock_timestamp()
FROM import_items ORDER BY id
ON CONFLICT (owner_id, id) DO UPDATE SET
    coin_id = EXCLUDED.coin_id, listed_active = EXCLUDED.listed_active, price = EXCLUDED.price,
    currency = EXCLUDED.currency, category = EXCLUDED.category, characteristics = EXCLUDED.characteristics,
    images = EXCLUDED.images, texts = EXCLUDED.texts,
    doc_eng = EXCLUDED.doc_eng, doc_rus = EXCLUDED.doc_rus, doc_ukr = EXCLUDED.doc_ukr,
    updated_at = ` + NextUpdatedAt("e") + `
WHERE (e.listed_active, e.doc_eng, e.doc_rus, e.doc_ukr, e.texts)
    IS DISTINCT FROM (EXCLUDED.listed_active, EXCLUDED.doc_eng, EXCLUDED.doc_rus, EXCLUDED.doc_ukr, EXCLUDED.texts)
RETURNING (e.xmax = 0) AS inserted)
SELECT count(*) FILTER (WHERE inserted), count(*) FROM written`

// itemRows feeds CopyFrom, rendering each item's three documents.
func itemRows(items []Item) pgx.CopyFromSource {
	return pgx.CopyFromSlice(len(items), func(i int) ([]any, error) {
		it := &items[i]
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
	})
}

// preferLZ4 makes the transaction compress the stored documents with lz4,
// several times faster than the default pglz both when written and on every
// read of a page. A server built without lz4 keeps pglz: the savepoint keeps
// the refused SET from aborting the transaction.
func preferLZ4(ctx context.Context, tx pgx.Tx) {
	if _, err := tx.Exec(ctx, "SAVEPOINT prefer_lz4"); err != nil {
		return
	}
	if _, err := tx.Exec(ctx, "SET LOCAL default_toast_compression = lz4"); err != nil {
		_, _ = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT prefer_lz4")
		return
	}
	_, _ = tx.Exec(ctx, "RELEASE SAVEPOINT prefer_lz4")
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
// ErrOwnerNotFound.
func ownerError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" && strings.Contains(pgErr.ConstraintName, "owner") {
		return ErrOwnerNotFound
	}
	return err
}
