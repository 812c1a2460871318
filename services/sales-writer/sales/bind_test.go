package sales

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
)

// The second half of a race on one Idempotency-Key: a request was refused
// (its item sold) by a statement whose snapshot predates another request
// with the same key, which executed and committed meanwhile. Binding the
// refusal then finds that record: the answer is the conflict (spec 4.7
// rule 3), and the key stays bound to the executed request alone.
func TestRefusalLosesTheKeyToARequestThatExecuted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := ownerWithPlatformP(t, db)
	w := NewWriter(db, time.Hour)
	executed := Request{Operation: Confirm, OwnerID: owner, PlatformID: "p", IdempotencyKey: "k", ItemID: "y", ExternalOrderID: "o", Quantity: 1}
	refused := executed
	refused.ItemID = "x"
	if _, err := db.Exec(ctx, `INSERT INTO idempotency_records (owner_id, platform_id, idempotency_key, fingerprint, response, expires_at)
		VALUES ($1, 'p', 'k', $2, '{}', now() + interval '1 hour')`, owner, Fingerprint(executed)); err != nil {
		t.Fatal(err)
	}
	if err := w.bindRefused(ctx, refused, Fingerprint(refused), ErrAlreadySold); !errors.Is(err, ErrIdempotencyConflict) {
		t.Errorf("binding the refusal after another request executed with the key = %v, want ErrIdempotencyConflict", err)
	}
	var refusals int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM idempotency_refusals").Scan(&refusals); err != nil || refusals != 0 {
		t.Errorf("%d refusals bound (%v), want none: the key is the executed request's", refusals, err)
	}
	// The identical request's own refusal (it raced itself) still binds as before.
	if err := w.bindRefused(ctx, executed, Fingerprint(executed), ErrAlreadySold); !errors.Is(err, ErrAlreadySold) {
		t.Errorf("binding a refusal of the executed request itself = %v, want the refusal", err)
	}
}
