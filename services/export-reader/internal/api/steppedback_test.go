package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A sync's pages must all be read from one database. Two readers on two
// databases, here one on the primary and one on a standby a few seconds
// behind (under any READ_MAX_LAG), as when a sync moves to another reader
// instance whose READ_DATABASE_URL differs (a rollout that changes it,
// readers on different standbys, a name balancing several): the second
// page is read from an older state than the first. An item changed
// meanwhile is behind the first page's cursor in the older state and not
// yet at its new place, so a full sync ends without it. (The next
// incremental run brings it: its stamp is within the replica's lag, inside
// the overlap.) This test holds the README's rule to what it guards; it
// fails the day pages stop stepping back (a cursor that carries its
// database's WAL position, say), when the rule may go.
func TestPagesReadFromTwoDatabasesCanStepBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby, signer := pairAndSigner(t)
	onPrimary, onStandby := serve(t, primary, signer), serve(t, standby, signer)
	owner := onPrimary.owner(t)
	onPrimary.importLines(t, owner, itemLine("x", "active", "X v1"))
	for i := range 6 {
		onPrimary.importLines(t, owner, itemLine(fmt.Sprintf("f%d", i), "active", "F"))
	}
	onStandby.waitForPage(t, owner, "/v1/export/items", http.StatusOK, 7) // replayed
	if _, err := standby.Exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = standby.Exec(ctx, "SELECT pg_wal_replay_resume()") })
	onPrimary.importLines(t, owner, itemLine("x", "inactive", "X v2")) // x moves to the end, on the primary only

	first := onPrimary.get(t, owner, "/v1/export/items?limit=4")
	if first.status != http.StatusOK || first.env.Meta.NextCursor == nil {
		t.Fatalf("first page = %d %s, want 4 items and a next cursor", first.status, first.body)
	}
	second := onStandby.get(t, owner, "/v1/export/items?limit=100&cursor="+url.QueryEscape(*first.env.Meta.NextCursor))
	if second.status != http.StatusOK || second.env.Meta.NextCursor != nil {
		t.Fatalf("second page = %d %s, want the last page", second.status, second.body)
	}
	var read []any
	for _, page := range []response{first, second} {
		for _, it := range page.items(t) {
			read = append(read, it["id"])
		}
	}
	if len(read) != 6 {
		t.Errorf("a full sync over two databases read %v; want the six others without x (the rule's reason), or, with pages that no longer step back, the README's rule can go", read)
	}
}

// pairAndSigner starts a standby pair of the test's own and returns pools
// on its primary and its standby, and the signer of the readers served on
// them.
func pairAndSigner(t *testing.T) (primary, standby *pgxpool.Pool, signer *identity.Signer) {
	t.Helper()
	pair := testenv.StandbyPair(t)
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Pool(t, pair.Primary), testenv.Pool(t, pair.Standby), signer
}
