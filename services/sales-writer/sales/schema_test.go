package sales

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/testenv"
)

// The sale records' rules hold in the database, whoever writes the row: the
// domains of migration 00005 refuse a bad external order id or idempotency
// key on insert and on update.
func TestDatabaseRefusesBadSaleRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "item-1")
	if _, err := db.Exec(ctx, `INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
	    VALUES ($1, 'item-1', 'p', 'order-1', now())`, owner); err != nil {
		t.Fatalf("insert of a valid sale: %v", err)
	}

	for _, bad := range []string{"", strings.Repeat("x", 129)} {
		_, err := db.Exec(ctx, `INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
		    VALUES ($1, 'item-1', 'p', $2, now())`, owner, bad)
		testenv.WantDomainViolation(t, "sale insert", err, "external_order_id")
		// A literal, so that the value is checked where the row is
		// updated, not where the parameter is bound.
		_, err = db.Exec(ctx, `UPDATE sales SET external_order_id = '`+bad+`' WHERE owner_id = $1`, owner)
		testenv.WantDomainViolation(t, "sale update", err, "external_order_id")

		_, err = db.Exec(ctx, `INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
		    VALUES ($1, 'p', $2, '\x00', '{}', now() + interval '1 hour')`, owner, bad)
		testenv.WantDomainViolation(t, "record insert", err, "idempotency_key")
	}
}

// A cancel never records canceled_at before confirmed_at, even when the
// clock reads earlier than the confirm did (a clock stepped back): the
// cancel statement keeps that rule since migration 00005 dropped the CHECK.
func TestCancelIsNeverBeforeConfirm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "item-1")
	confirmedAt := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	if _, err := db.Exec(ctx, `UPDATE export_items SET sold = true WHERE owner_id = $1 AND id = 'item-1'`, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
	    VALUES ($1, 'item-1', 'p', 'order-1', $2)`, owner, confirmedAt); err != nil {
		t.Fatal(err)
	}

	res, err := NewWriter(db, time.Hour).Execute(ctx, Request{Operation: Cancel, OwnerID: owner, PlatformID: "p",
		IdempotencyKey: "k1", ItemID: "item-1", ExternalOrderID: "order-1"})
	if err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if !res.ConfirmedAt.Equal(confirmedAt) || res.CanceledAt.Before(res.ConfirmedAt) {
		t.Errorf("cancel answered confirmed_at %v, canceled_at %v; want confirmed_at %v and canceled_at not before it",
			res.ConfirmedAt, res.CanceledAt, confirmedAt)
	}
	var stored time.Time
	if err := db.QueryRow(ctx, `SELECT canceled_at FROM sales WHERE owner_id = $1`, owner).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored.Before(confirmedAt) {
		t.Errorf("stored canceled_at %v is before confirmed_at %v", stored, confirmedAt)
	}
}

// saleFixture creates an owner, the platform "p" (ownerWithPlatformP) and
// the listed items, and returns the owner's id.
func saleFixture(t testing.TB, db *pgxpool.Pool, items ...string) string {
	t.Helper()
	owner := ownerWithPlatformP(t, db)
	addItems(t, db, owner, items...)
	return owner
}

// addItems lists items of owner, each unsold.
func addItems(t testing.TB, db *pgxpool.Pool, owner string, items ...string) {
	t.Helper()
	for _, item := range items {
		if _, err := db.Exec(context.Background(), `INSERT INTO export_items (owner_id, id, listed_active, currency, texts,
		    doc_eng, doc_rus, doc_ukr, updated_at)
		    VALUES ($1, $2, true, 'EUR', '{"ENG":{}}', '{}', '{}', '{}', now())`, owner, item); err != nil {
			t.Fatal(err)
		}
	}
}

// A sale never moves the item's updated_at backwards, even when the clock
// reads earlier than the item's last stamp (it stepped back): an
// updated_after sync past that stamp would never see the sale.
func TestSaleNeverMovesUpdatedAtBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "item-1")
	var ahead time.Time
	if err := db.QueryRow(ctx, `UPDATE export_items SET updated_at = now() + interval '1 hour'
	    WHERE owner_id = $1 AND id = 'item-1' RETURNING updated_at`, owner).Scan(&ahead); err != nil {
		t.Fatal(err)
	}
	w := NewWriter(db, time.Hour)
	last := ahead
	for _, op := range []Operation{Confirm, Cancel} {
		res, err := w.Execute(ctx, Request{Operation: op, OwnerID: owner, PlatformID: "p",
			IdempotencyKey: "k-" + string(op), ItemID: "item-1", ExternalOrderID: "order-1"})
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		var updatedAt time.Time
		if err := db.QueryRow(ctx, `SELECT updated_at FROM export_items WHERE owner_id = $1 AND id = 'item-1'`, owner).
			Scan(&updatedAt); err != nil {
			t.Fatal(err)
		}
		if !updatedAt.After(last) {
			t.Errorf("%s: updated_at %v, want after the last stamp %v", op, updatedAt, last)
		}
		if op == Confirm && !res.ConfirmedAt.Equal(updatedAt) {
			t.Errorf("confirm: confirmed_at %v, want the item's updated_at %v", res.ConfirmedAt, updatedAt)
		}
		last = updatedAt
	}
}
