// Package catalogtest reads back what the catalog stores, for the tests of
// every module that check a sync against the database.
package catalogtest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/jackc/pgx/v5"
)

// Querier is what ComposedItems reads with: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ComposedItems is every item of owner as the list route composes it in
// lang (one of catalog.Languages), by id: what a whole sync must deliver.
func ComposedItems(t testing.TB, db Querier, owner, lang string) map[string]string {
	t.Helper()
	if !slices.Contains(catalog.Languages, lang) {
		t.Fatalf("catalogtest.ComposedItems: language %q is none of %v", lang, catalog.Languages)
	}
	column := "doc_" + strings.ToLower(lang)
	rows, err := db.Query(context.Background(), `SELECT id, status, updated_at, `+column+` FROM export_items WHERE owner_id = $1`, owner)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	items := map[string]string{}
	for rows.Next() {
		var id, status, doc string
		var updated time.Time
		if err := rows.Scan(&id, &status, &updated, &doc); err != nil {
			t.Fatal(err)
		}
		items[id] = string(catalog.Compose(nil, status, updated, []byte(doc)))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return items
}
