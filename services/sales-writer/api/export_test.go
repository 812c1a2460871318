package api

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
)

// exportView is what an export consumer sees of an item.
type exportView struct {
	ID            string    `json:"id"`
	Status        string    `json:"status"`
	StockQuantity int       `json:"stock_quantity"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// exported reads coin-1 the way the export routes do (status, updated_at and
// the stored per-language document, composed by catalog.Compose): through
// the item route's lookup and through the list route's updated_after page.
func exported(t *testing.T, f *fixture, since time.Time) (single, listed []exportView) {
	t.Helper()
	queries := []struct {
		sql  string
		args []any
		into *[]exportView
	}{
		{"SELECT status, updated_at, doc_eng, doc_rus, doc_ukr FROM export_items WHERE owner_id = $1 AND id = 'coin-1'",
			[]any{f.owner}, &single},
		{`SELECT status, updated_at, doc_eng, doc_rus, doc_ukr FROM export_items
		  WHERE owner_id = $1 AND updated_at > $2 ORDER BY updated_at, id LIMIT 100`, []any{f.owner, since}, &listed},
	}
	for _, q := range queries {
		rows, err := f.db.Query(context.Background(), q.sql, q.args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var status string
			var updated time.Time
			docs := make([][]byte, 3)
			if err := rows.Scan(&status, &updated, &docs[0], &docs[1], &docs[2]); err != nil {
				t.Fatal(err)
			}
			for _, doc := range docs { // ENG, RUS, UKR
				var v exportView
				if err := json.Unmarshal(catalog.Compose(nil, status, updated, doc), &v); err != nil {
					t.Fatalf("composed item is not JSON: %v", err)
				}
				*q.into = append(*q.into, v)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return single, listed
}

// After a confirm every export shows the item inactive with stock 0 and a
// later updated_at, so an updated_after sync picks it up; after the cancel,
// active with stock 1.
func TestExportsFollowTheSale(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	checkpoint := f.item(t, f.owner, "coin-1").UpdatedAt

	steps := []struct {
		name      string
		do        func()
		wantState string
		wantStock int
	}{
		{"confirm", func() { confirmed(t, f, "confirm-1") }, "inactive", 0},
		{"cancel", func() { cancel(t, f, "market-a", "cancel-1", order1, 200) }, "active", 1},
	}
	for _, st := range steps {
		st.do()
		single, listed := exported(t, f, checkpoint)
		if len(single) != 3 || len(listed) != 3 {
			t.Fatalf("after %s: item route gave %d documents, list after the checkpoint %d; want 3 each (one per language)",
				st.name, len(single), len(listed))
		}
		for _, v := range append(single, listed...) {
			if v.ID != "coin-1" || v.Status != st.wantState || v.StockQuantity != st.wantStock || !v.UpdatedAt.After(checkpoint) {
				t.Errorf("after %s: exported %+v, want coin-1 %s stock %d updated after %v",
					st.name, v, st.wantState, st.wantStock, checkpoint)
			}
		}
		checkpoint = single[0].UpdatedAt
	}
}
