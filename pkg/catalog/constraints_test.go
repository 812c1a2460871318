package catalog_test

import (
	"context"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
)

// The database refuses what import validation refuses, whoever writes the
// row: the catalog columns' domains (migration 00004) check every value
// assigned to them, on insert and on update, and a sale's update, which
// assigns none of them, is not checked against them.
func TestDatabaseRefusesBadCatalogValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := newOwner(t, pool)

	const insert = `INSERT INTO export_items (owner_id, id, listed_active, price, currency,
	    characteristics, images, texts, doc_eng, doc_rus, doc_ukr, updated_at)
	VALUES ($1, $2, true, $3::numeric, $4, $5::jsonb, $6::jsonb, $7::jsonb, '{}', '{}', '{}', now())`
	good := []any{owner, "good", "12.5", "EUR", `{}`, `[]`, `{"ENG":{"title":"Thaler"}}`}
	if _, err := pool.Exec(ctx, insert, good...); err != nil {
		t.Fatalf("insert of a valid item: %v", err)
	}

	for _, tc := range []struct {
		column string
		arg    int // index into good
		bad    any
		domain string
	}{
		{"id", 1, "", "item_id"},
		{"id", 1, strings.Repeat("x", 129), "item_id"},
		{"price", 2, "-0.01", "item_price"},
		{"currency", 3, "eur", "currency_code"},
		{"characteristics", 4, `[]`, "item_characteristics"},
		{"images", 5, `{}`, "item_images"},
		{"texts", 6, `{"RUS":{"title":"Талер"}}`, "item_texts"},
	} {
		args := append([]any(nil), good...)
		args[1] = "bad-" + tc.column // a new row, unless id is the bad value
		args[tc.arg] = tc.bad
		_, err := pool.Exec(ctx, insert, args...)
		testenv.WantDomainViolation(t, "insert with bad "+tc.column, err, tc.domain)

		update := `UPDATE export_items SET ` + tc.column + ` = $3 WHERE owner_id = $1 AND id = $2`
		_, err = pool.Exec(ctx, update, owner, "good", tc.bad)
		testenv.WantDomainViolation(t, "update of "+tc.column, err, tc.domain)
	}

	// What a sale changes passes, and moves nothing else.
	tag, err := pool.Exec(ctx, `UPDATE export_items SET sold = true, updated_at = clock_timestamp()
	    WHERE owner_id = $1 AND id = 'good'`, owner)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("sale-like update: %v, %d rows, want 1", err, tag.RowsAffected())
	}
}
