package sales

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// ownerWithPlatformP creates an owner and the platform "p" in db, and
// returns the owner's id.
func ownerWithPlatformP(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	ctx := context.Background()
	var owner string
	if err := db.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "INSERT INTO platforms (id) VALUES ('p')"); err != nil {
		t.Fatal(err)
	}
	return owner
}

func TestPurgeDeletesOnlyExpiredRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := ownerWithPlatformP(t, db)
	// More expired records than one purge statement deletes.
	const expired, live = 2*purgeBatch + 7, 5
	_, err := db.Exec(ctx, `
		INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
		SELECT $1::uuid, 'p', 'old-' || g, '\x00'::bytea, '{}'::jsonb, now() - interval '1 minute' FROM generate_series(1, $2::int) g
		UNION ALL
		SELECT $1::uuid, 'p', 'new-' || g, '\x00'::bytea, '{}'::jsonb, now() + interval '1 hour' FROM generate_series(1, $3::int) g`,
		owner, expired, live)
	if err != nil {
		t.Fatal(err)
	}
	// And refusals (one expired, one live), purged the same way.
	_, err = db.Exec(ctx, `
		INSERT INTO idempotency_refusals (owner_id, platform_id, idempotency_key, fingerprint, expires_at)
		VALUES ($1, 'p', 'old-refused', '\x00', now() - interval '1 minute'), ($1, 'p', 'new-refused', '\x00', now() + interval '1 hour')`,
		owner)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(db, time.Hour)
	n, err := w.Purge(ctx)
	if err != nil || n != expired+1 {
		t.Errorf("Purge() = %d, %v, want %d, nil", n, err, expired+1)
	}
	var refusals []string
	if err := db.QueryRow(ctx, "SELECT array_agg(idempotency_key) FROM idempotency_refusals").Scan(&refusals); err != nil {
		t.Fatal(err)
	}
	if len(refusals) != 1 || refusals[0] != "new-refused" {
		t.Errorf("refusals after Purge = %v, want [new-refused]", refusals)
	}
	var left int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM idempotency_records WHERE idempotency_key LIKE 'new-%'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	var total int
	_ = db.QueryRow(ctx, "SELECT count(*) FROM idempotency_records").Scan(&total)
	if left != live || total != live {
		t.Errorf("records after Purge = %d (%d live), want %d live only", total, left, live)
	}
}

// RunPurge keeps purging in the background until its context ends.
func TestRunPurgeRunsInTheBackground(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	var owner string
	if err := db.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('o') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	insert := func(key string) {
		t.Helper()
		_, err := db.Exec(ctx, `INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
			VALUES ($1::uuid, 'p', $2, '\x00'::bytea, '{}'::jsonb, now() - interval '1 second')`, owner, key)
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(ctx, "INSERT INTO platforms (id) VALUES ('p')"); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		NewWriter(db, time.Hour).RunPurge(runCtx, time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	for _, key := range []string{"first", "second"} { // the loop keeps going after a purge
		insert(key)
		deadline := time.Now().Add(30 * time.Second)
		for n := 1; n > 0; {
			if time.Now().After(deadline) {
				t.Fatalf("record %q still there after 30 s of purging every millisecond", key)
			}
			time.Sleep(5 * time.Millisecond)
			if err := db.QueryRow(ctx, "SELECT count(*) FROM idempotency_records").Scan(&n); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop()
	<-done
}

// A purge refused by PostgreSQL's guard against transaction-id wraparound
// (which refuses only what writes: a purge with nothing to delete passes)
// is logged with the cause a sale's line gives, what to do; it gave the
// error alone.
func TestRefusedPurgeNamesItsCause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := testenv.NewWraparoundCluster(t)
	db := testenv.Pool(t, cluster.DSN)
	owner := ownerWithPlatformP(t, db)
	if _, err := db.Exec(ctx, `INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
		VALUES ($1::uuid, 'p', 'old', '\x00'::bytea, '{}'::jsonb, now() - interval '1 second')`, owner); err != nil {
		t.Fatal(err)
	}
	cluster.Guard(t)
	db.Reset() // its sessions ended with the restart
	var logs testenv.Output
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		NewWriter(db, time.Hour).RunPurge(runCtx, time.Millisecond, slog.New(slog.NewJSONHandler(&logs, nil)))
		close(done)
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), "idempotency purge failed"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no failed purge logged within 30 s past the guard:\n%s", logs.String())
		}
	}
	stop()
	<-done
	if !strings.Contains(logs.String(), `"cause":"PostgreSQL refuses to write, to avoid transaction-id wraparound`) {
		t.Errorf("the purge's line does not say what to do:\n%s", logs.String())
	}
}
