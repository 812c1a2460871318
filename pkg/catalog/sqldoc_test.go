package catalog_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// documentedDeactivation is the SQL the export-reader README gives
// operators for deactivating an item by hand, with its psql variables
// :'owner' and :'id' quoted as psql does (both are plain here).
func documentedDeactivation(t *testing.T, owner, id string) string {
	t.Helper()
	readme, err := os.ReadFile("../../services/export-reader/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(readme), "```sql")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if strings.Contains(block, "listed_active = false") {
			return strings.NewReplacer(":'owner'", "'"+owner+"'", ":'id'", "'"+id+"'").Replace(block)
		}
	}
	t.Fatal("the export-reader README has no ```sql block that deactivates an item")
	return ""
}

// The README's statement for deactivating an item with SQL moves its
// updated_at (so incremental syncs return it: a plain UPDATE left it, and
// every marketplace that had synced the item kept it active) and takes the
// owner's writer lock first (so a sync's barrier waits for it).
func TestDocumentedDeactivationIsSeenBySyncs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerWithItems(t, pool, lineA)
	before := stored(t, pool, owner, "a")
	statement := documentedDeactivation(t, owner, "a")

	release := holdBarrier(t, pool, owner)
	returned, wait := returnsWithin(t, 300*time.Millisecond, func() error {
		_, err := pool.Exec(ctx, statement)
		return err
	})
	release()
	if err := wait(); err != nil {
		t.Fatalf("the documented statement: %v", err)
	}
	if returned {
		t.Error("the documented statement wrote while the owner's sync barrier held the lock")
	}
	after := stored(t, pool, owner, "a")
	if after.Status != "inactive" {
		t.Errorf("status = %q after the documented deactivation, want inactive", after.Status)
	}
	if !after.UpdatedAt.After(before.UpdatedAt) {
		t.Errorf("updated_at = %s after the documented deactivation, was %s: incremental syncs would never see it",
			after.UpdatedAt, before.UpdatedAt)
	}
}
