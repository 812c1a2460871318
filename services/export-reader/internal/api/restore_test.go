package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/catalog/catalogtest"
	"github.com/coinexport/export/services/export-reader/syncclient"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestRestampMendsMirrorsAfterARestore restores the database for real: the
// standby of a pair, cut off from its primary after a marketplace's full
// sync, is promoted after a sale and an import on the primary, and read as
// a database restored from a backup of that moment. The marketplace's
// incremental sync from the checkpoint it kept must bring its mirror back
// to the restored catalog once the items are stamped anew (README,
// "Restoring the database"); without catalog.Restamp it reads nothing, and
// its mirror keeps the lost sale and the lost import for good.
func TestRestampMendsMirrorsAfterARestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby, signer := pairAndSigner(t)
	before := serve(t, primary, signer)
	owner := before.owner(t)
	before.importLines(t, owner, itemLine("a", "active", "A v1"), itemLine("b", "active", "B v1"), itemLine("c", "active", "C v1"))
	if _, err := primary.Exec(ctx, `INSERT INTO platforms (id) VALUES ('market')`); err != nil {
		t.Fatal(err)
	}
	mirror := syncclient.Mirror{}
	checkpoint := syncInto(t, before, owner, time.Time{}, mirror)
	backupPoint(t, primary, standby)

	// After the backup: a sale and an import, which the marketplace syncs.
	if _, err := primary.Exec(ctx, lockedConfirm, owner, "a", "order-1"); err != nil {
		t.Fatal(err)
	}
	before.importLines(t, owner, itemLine("b", "active", "B v2"))
	checkpoint = syncInto(t, before, owner, checkpoint, mirror)
	if mirror["a"].Status != "inactive" {
		t.Fatalf("the mirror did not get the sale: %+v", mirror["a"])
	}

	if _, err := standby.Exec(ctx, "SELECT pg_promote()"); err != nil {
		t.Fatalf("promote the restored copy: %v", err)
	}
	if got := catalogtest.ComposedItems(t, standby, owner, "ENG"); got["a"] == catalogtest.ComposedItems(t, primary, owner, "ENG")["a"] {
		t.Fatal("the restored copy has the sale: the restore lost nothing, and the test proves nothing")
	}
	if _, err := catalog.Restamp(ctx, standby, ownerID(t, owner)); err != nil {
		t.Fatalf("Restamp: %v", err)
	}
	restored := serve(t, standby, signer)
	syncInto(t, restored, owner, checkpoint, mirror)
	want := catalogtest.ComposedItems(t, standby, owner, "ENG")
	for id, doc := range want {
		if got := string(mirror[id].Raw); got != doc {
			t.Errorf("after the restore, mirror[%s] = %s\nwant the restored %s", id, got, doc)
		}
	}
}

// syncInto runs one sync (spec 4.8, no overlap) of owner into mirror from
// checkpoint and returns the next checkpoint.
func syncInto(t *testing.T, e *env, owner string, checkpoint time.Time, mirror syncclient.Mirror) time.Time {
	t.Helper()
	client := &syncclient.Client{BaseURL: e.srv.URL + "/v1", HTTP: e.srv.Client(), Prepare: e.sign(owner), Overlap: -1}
	next, _, err := client.Sync(context.Background(), checkpoint, mirror.Upsert)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return next
}

// backupPoint makes the standby a backup of the primary as it is now: it
// waits until the standby has replayed everything written so far, then
// cuts it off, so nothing written later reaches it.
func backupPoint(t *testing.T, primary, standby *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var lsn string
	if err := primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, standby, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn)
	for _, sql := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := standby.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	waitFor(t, standby, "SELECT NOT EXISTS (SELECT FROM pg_stat_wal_receiver)")
}

// waitFor polls the query (one boolean) on pool until it is true.
func waitFor(t *testing.T, pool *pgxpool.Pool, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ok bool
		if err := pool.QueryRow(context.Background(), query, args...).Scan(&ok); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still false after 30 s", query)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ownerID(t *testing.T, owner string) pgtype.UUID {
	t.Helper()
	u, err := catalog.ParseOwnerID(owner)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
