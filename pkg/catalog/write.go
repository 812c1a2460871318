package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
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

// Import upserts items (already validated by ParseJSONL) for ownerID in one
// transaction. An item's updated_at moves only when something a consumer
// sees (or its source texts) changes, and it is stamped with
// clock_timestamp() by the last statement before COMMIT, so the window in
// which a committed change carries an older updated_at is as short as it can
// be (see the export-reader README, sync guide). Import never un-sells an
// item: it writes listed_active, and the exported status stays inactive while
// an item is sold.
func Import(ctx context.Context, pool *pgxpool.Pool, ownerID string, items []Item) (ImportResult, error) {
	owner, err := ParseOwnerID(ownerID)
	if err != nil {
		return ImportResult{}, err
	}
	if len(items) == 0 {
		return ImportResult{}, nil
	}
	// Rows are locked in id order, so two imports of overlapping files cannot
	// deadlock each other.
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b Item) int { return strings.Compare(a.ID, b.ID) })
	var res ImportResult
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err = importTx(ctx, tx, owner, sorted)
		return err
	})
	if err != nil {
		return ImportResult{}, ownerError(err)
	}
	return res, nil
}

func importTx(ctx context.Context, tx pgx.Tx, owner pgtype.UUID, items []Item) (ImportResult, error) {
	preferLZ4(ctx, tx)
	if _, err := tx.Exec(ctx, createStaging); err != nil {
		return ImportResult{}, fmt.Errorf("catalog: staging table: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"import_items"}, stagingColumns, itemRows(items)); err != nil {
		return ImportResult{}, fmt.Errorf("catalog: copy: %w", err)
	}
	rows, err := tx.Query(ctx, upsertFromStaging, owner)
	if err != nil {
		return ImportResult{}, fmt.Errorf("catalog: upsert: %w", err)
	}
	var touched []string
	var res ImportResult
	for rows.Next() {
		var id string
		var inserted bool
		if err := rows.Scan(&id, &inserted); err != nil {
			return ImportResult{}, fmt.Errorf("catalog: upsert: %w", err)
		}
		touched = append(touched, id)
		if inserted {
			res.Inserted++
		} else {
			res.Updated++
		}
	}
	if err := rows.Err(); err != nil {
		return ImportResult{}, fmt.Errorf("catalog: upsert: %w", err)
	}
	res.Unchanged = len(items) - len(touched)
	if len(touched) > 0 {
		if _, err := tx.Exec(ctx, stampUpdated, owner, touched); err != nil {
			return ImportResult{}, fmt.Errorf("catalog: stamp updated_at: %w", err)
		}
	}
	return res, nil
}

const createStaging = `CREATE TEMP TABLE import_items (
    id text NOT NULL, coin_id text, listed_active boolean NOT NULL, price numeric(18,4),
    currency text NOT NULL, category jsonb, characteristics jsonb NOT NULL, images jsonb NOT NULL,
    texts jsonb NOT NULL, doc_eng text NOT NULL, doc_rus text NOT NULL, doc_ukr text NOT NULL
) ON COMMIT DROP`

var stagingColumns = []string{"id", "coin_id", "listed_active", "price", "currency", "category",
	"characteristics", "images", "texts", "doc_eng", "doc_rus", "doc_ukr"}

// upsertFromStaging writes new and changed items and returns them; an item
// whose stored form is identical is skipped by the WHERE, so it is neither
// returned nor re-stamped. The provisional updated_at of a new row is
// replaced by stampUpdated before COMMIT.
const upsertFromStaging = `INSERT INTO export_items AS e (owner_id, id, coin_id, listed_active, price, currency,
    category, characteristics, images, texts, doc_eng, doc_rus, doc_ukr, updated_at)
SELECT $1, id, coin_id, listed_active, price, currency, category, characteristics, images, texts,
    doc_eng, doc_rus, doc_ukr, clock_timestamp()
FROM import_items ORDER BY id
ON CONFLICT (owner_id, id) DO UPDATE SET
    coin_id = EXCLUDED.coin_id, listed_active = EXCLUDED.listed_active, price = EXCLUDED.price,
    currency = EXCLUDED.currency, category = EXCLUDED.category, characteristics = EXCLUDED.characteristics,
    images = EXCLUDED.images, texts = EXCLUDED.texts,
    doc_eng = EXCLUDED.doc_eng, doc_rus = EXCLUDED.doc_rus, doc_ukr = EXCLUDED.doc_ukr
WHERE (e.listed_active, e.doc_eng, e.doc_rus, e.doc_ukr, e.texts)
    IS DISTINCT FROM (EXCLUDED.listed_active, EXCLUDED.doc_eng, EXCLUDED.doc_rus, EXCLUDED.doc_ukr, EXCLUDED.texts)
RETURNING e.id, (e.xmax = 0) AS inserted`

// stampUpdated is the last statement of a writing transaction: updated_at is
// the clock as close to COMMIT as the transaction can get it.
const stampUpdated = `UPDATE export_items SET updated_at = clock_timestamp()
WHERE owner_id = $1 AND id = ANY($2)`

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
