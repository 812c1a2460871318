package export

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"
)

// TestPagesEndAtMaxPageBytes: a page whose items pass maxPageBytes ends
// there with a next cursor, so items the import accepts (up to 1 MiB each)
// never make a page the gateway cannot relay; the sync still reads every
// item once, in order, with read-ahead and without.
func TestPagesEndAtMaxPageBytes(t *testing.T) {
	pool := testenv.Postgres(t)
	owner := seededOwner(t, pool, 60)
	q := Query{OwnerID: owner, Lang: "ENG", Limit: 10}
	want := pageItems(t, readAll(t, newTestReader(t, pool, ReadAhead{}), q))

	const budget = 3000 // a few seeded items (about 1 KB each)
	for name, ahead := range map[string]ReadAhead{"plain": {}, "read-ahead": readAheadFor(time.Minute)} {
		t.Run(name, func(t *testing.T) {
			r := newTestReader(t, pool, ahead)
			r.maxPageBytes = budget
			pages := readAll(t, r, q)
			var got []json.RawMessage
			for i, page := range pages {
				items := pageItems(t, [][]byte{page})
				if len(items) == 0 || len(items) > q.Limit {
					t.Fatalf("page %d has %d items, want 1 to %d", i, len(items), q.Limit)
				}
				// Only the item that passed the budget may lie beyond it.
				if before := len(page) - len(items[len(items)-1]); i < len(pages)-1 && before >= budget {
					t.Errorf("page %d: %d bytes before its last item, want under %d", i, before, budget)
				}
				got = append(got, items...)
			}
			if len(pages) <= len(want)/q.Limit {
				t.Errorf("%d pages for %d items, want more than %d (pages cut by bytes)", len(pages), len(want), len(want)/q.Limit)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("items read in pages cut by bytes differ from full pages (-full +cut):\n%s", diff)
			}
		})
	}
}

// pageItems splits the comma-separated items of pages (as AppendPage
// appends them) into single items.
func pageItems(t *testing.T, pages [][]byte) []json.RawMessage {
	t.Helper()
	var items []json.RawMessage
	for _, page := range pages {
		var these []json.RawMessage
		if err := json.Unmarshal(append(append([]byte("["), page...), ']'), &these); err != nil {
			t.Fatalf("page %.80q: %v", page, err)
		}
		for _, it := range these {
			items = append(items, bytes.Clone(it))
		}
	}
	return items
}
