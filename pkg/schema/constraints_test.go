package schema_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/coinexport/export/pkg/testenv"
)

// The business rules the schema holds itself, whoever writes the rows
// (issue 2): at most one open sale per item (a canceled one does not
// count), API keys unique by their hash, a sales:write key bound to a
// platform, and an item that is sold exported inactive whatever its owner's
// listing says. sales-writer's tests hold the first through its statements;
// these hold it for any writer (a script, a restore, a future service).
func TestDatabaseHoldsTheBusinessRules(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	var owner string
	if err := pool.QueryRow(ctx, `INSERT INTO owners (name) VALUES ('o') RETURNING id`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `INSERT INTO platforms (id) VALUES ('p')`)
	mustExec(t, pool, `INSERT INTO export_items (owner_id, id, listed_active, sold, currency, texts, doc_eng, doc_rus, doc_ukr, updated_at)
		VALUES ($1, 'item-1', true, true, 'EUR', '{"ENG":{}}', '{}', '{}', '{}', now())`, owner)

	sale := `INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at) VALUES ($1, 'item-1', 'p', $2, now())`
	mustExec(t, pool, sale, owner, "order-1")
	_, err := pool.Exec(ctx, sale, owner, "order-2")
	wantViolation(t, "a second open sale of an item", err, "23505", "sales_one_open_sale_per_item")
	mustExec(t, pool, `UPDATE sales SET canceled_at = now() WHERE external_order_id = 'order-1'`)
	mustExec(t, pool, sale, owner, "order-2") // the canceled sale is closed

	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM export_items WHERE id = 'item-1'`).Scan(&status); err != nil || status != "inactive" {
		t.Errorf("status of a listed, sold item = %q (%v), want inactive", status, err)
	}
	_, err = pool.Exec(ctx, `UPDATE export_items SET status = 'active' WHERE id = 'item-1'`)
	wantViolation(t, "status written directly", err, "428C9", "") // generated_always

	key := `INSERT INTO api_keys (owner_id, platform_id, prefix, hash, scopes) VALUES ($1, $2, 'cx', $3, $4)`
	hash := bytes.Repeat([]byte{7}, 32)
	mustExec(t, pool, key, owner, nil, hash, []string{"export:read"})
	_, err = pool.Exec(ctx, key, owner, "p", hash, []string{"sales:write"})
	wantViolation(t, "a second key of the same hash", err, "23505", "api_keys_hash_key")
	_, err = pool.Exec(ctx, key, owner, nil, bytes.Repeat([]byte{8}, 32), []string{"export:read", "sales:write"})
	wantViolation(t, "a sales:write key without a platform", err, "23514", "sales_write_needs_platform")
}

// wantViolation fails t unless err is PostgreSQL's code, of constraint
// (when named): the database itself refused the row.
func wantViolation(t *testing.T, what string, err error, code, constraint string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code || pgErr.ConstraintName != constraint {
		t.Errorf("%s: error = %v, want SQLSTATE %s of constraint %q", what, err, code, constraint)
	}
}
