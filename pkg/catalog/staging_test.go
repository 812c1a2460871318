package catalog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Behind a pooler in transaction mode another client's transactions run in
// an import's session between its own: another import's staging there
// must not be what this one writes. With one staging table name for every
// import, the second import's staging replaced the first's, and the first
// owner was given the second owner's items.
func TestImportWritesOnlyItsOwnStaging(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owners := []pgtype.UUID{ownerIn(t, pool), ownerIn(t, pool)}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	staged := make([]string, 2)
	for i, prefix := range []string{"mine", "theirs"} {
		var items []Item
		for n := range 3 {
			items = append(items, itemFor(t, fmt.Sprintf("%s-%d", prefix, n)))
		}
		staged[i] = stagingTable()
		if _, err := stage(ctx, conn.Conn(), staged[i], itemRows(items)); err != nil {
			t.Fatalf("stage %s: %v", prefix, err)
		}
	}
	if _, err := writeStaged(ctx, conn.Conn(), owners[0], staged[0], 3); err != nil {
		t.Fatalf("writeStaged: %v", err)
	}
	var ids []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM export_items WHERE owner_id = $1`,
		owners[0]).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if want := []string{"mine-0", "mine-1", "mine-2"}; !slices.Equal(ids, want) {
		t.Errorf("the owner's items are %q, want %q: it was given another import's items", ids, want)
	}
}

// ownerIn creates an owner in pool's database and returns its id.
func ownerIn(t *testing.T, pool *pgxpool.Pool) pgtype.UUID {
	t.Helper()
	var owner pgtype.UUID
	if err := pool.QueryRow(context.Background(), `INSERT INTO owners (name) VALUES ('test') RETURNING id`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	return owner
}

// itemFor is a valid item with id.
func itemFor(t *testing.T, id string) Item {
	t.Helper()
	items, err := ParseJSONL(strings.NewReader(`{"id":"` + id + `","status":"active","currency":"EUR","images":[],"texts":{"ENG":{"title":"t"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	return items[0]
}

// A chunk run in a session without the import's staging table (its
// transactions moved to another server connection) fails with
// ErrStagingLost, which names the cause, and writes nothing.
func TestImportInAnotherSessionIsNamed(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	staging, other := acquire(t, pool), acquire(t, pool)
	name := stagingTable()
	if _, err := stage(ctx, staging, name, itemRows([]Item{itemFor(t, "a-1")})); err != nil {
		t.Fatal(err)
	}
	_, err := writeStaged(ctx, other, owner, name, 1)
	if err = stagingError(err, name); !errors.Is(err, ErrStagingLost) {
		t.Fatalf("error = %v, want ErrStagingLost", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM export_items WHERE owner_id = $1`, owner).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d items written (%v), want none", n, err)
	}
}

// acquire is a connection of pool of its own, released when the test ends.
func acquire(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	c, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Release)
	return c.Conn()
}

// An import whose staging table ends before the count it staged (it
// cannot, but writeStaged checks) says how many it wrote before: it
// returned an error without the count, which exportctl read as "nothing
// written".
func TestImportShortOfItsStagedCountSaysWhatItWrote(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	owner := ownerIn(t, pool)
	conn := acquire(t, pool)
	staging := stagingTable()
	if _, err := stage(ctx, conn, staging, itemRows([]Item{itemFor(t, "only-one")})); err != nil {
		t.Fatal(err)
	}
	_, err := writeStaged(ctx, conn, owner, staging, 2)
	var cut *WriteError
	if !errors.As(err, &cut) || cut.Written != 1 || cut.Total != 2 || cut.AtLeast {
		t.Errorf("writeStaged of 1 item staged, 2 counted = %v, want a WriteError of 1 written of 2", err)
	}
}
