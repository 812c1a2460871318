package salescheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Database checks what the database holds after a settled history ops of
// owner's items against itself and against the answers the history got:
//   - an item is sold exactly when it has an open sale;
//   - every sale was stored with the idempotency record of the confirm
//     that made it (same platform, order and confirmed_at), every such
//     record has its sale, and every record of a cancel closed its sale
//     at the canceled_at it answered (a change and its record are one
//     transaction);
//   - every 200 that executed is the record stored under its key, and
//     every refusal (409 item_already_sold or sale_not_cancelable) is bound
//     to its key, with that refusal or an identical request's record.
func Database(ctx context.Context, db *pgxpool.Pool, owner string, ops []porcupine.Operation) error {
	var errs []error
	for _, q := range consistency {
		var n int
		if err := db.QueryRow(ctx, q.sql, owner).Scan(&n); err != nil {
			return fmt.Errorf("%s: %w", q.what, err)
		}
		if n != 0 {
			errs = append(errs, fmt.Errorf("%d %s", n, q.what))
		}
	}
	for _, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Op == Read || out.Unknown {
			continue
		}
		if err := answerStored(ctx, db, owner, in, out); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", describeOp(op), err))
		}
	}
	return errors.Join(errs...)
}

// consistency are counts of rows that break a rule ($1 the owner).
var consistency = []struct{ what, sql string }{
	{"items whose sold flag disagrees with their open sale", `
SELECT count(*) FROM export_items i WHERE i.owner_id = $1
  AND i.sold <> EXISTS (SELECT FROM sales s WHERE s.owner_id = i.owner_id AND s.item_id = i.id AND s.canceled_at IS NULL)`},
	{"sales without the record of the confirm that made them", `
SELECT count(*) FROM sales s WHERE s.owner_id = $1 AND NOT EXISTS (
  SELECT FROM idempotency_records r WHERE r.owner_id = s.owner_id AND r.platform_id = s.platform_id
    AND NOT r.response ? 'canceled_at' AND r.response->>'item_id' = s.item_id
    AND r.response->>'external_order_id' = s.external_order_id
    AND (r.response->>'confirmed_at')::timestamptz = s.confirmed_at)`},
	{"records of a confirm without their sale", `
SELECT count(*) FROM idempotency_records r WHERE r.owner_id = $1 AND NOT r.response ? 'canceled_at'
  AND (SELECT count(*) FROM sales s WHERE s.owner_id = r.owner_id AND s.platform_id = r.platform_id
         AND s.item_id = r.response->>'item_id' AND s.external_order_id = r.response->>'external_order_id'
         AND s.confirmed_at = (r.response->>'confirmed_at')::timestamptz) <> 1`},
	{"records of a cancel whose sale was not closed when they say", `
SELECT count(*) FROM idempotency_records r WHERE r.owner_id = $1 AND r.response ? 'canceled_at'
  AND NOT EXISTS (SELECT FROM sales s WHERE s.owner_id = r.owner_id AND s.platform_id = r.platform_id
         AND s.item_id = r.response->>'item_id' AND s.external_order_id = r.response->>'external_order_id'
         AND s.confirmed_at = (r.response->>'confirmed_at')::timestamptz
         AND s.canceled_at = (r.response->>'canceled_at')::timestamptz)`},
}

// answerStored checks that a told answer is what the key holds.
func answerStored(ctx context.Context, db *pgxpool.Pool, owner string, in Input, out Output) error {
	var record, refused []byte // fingerprints
	var stored Result
	err := db.QueryRow(ctx, `
SELECT (SELECT fingerprint FROM idempotency_records WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3),
       coalesce((SELECT response->>'confirmed_at' FROM idempotency_records
                 WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3), ''),
       coalesce((SELECT response->>'canceled_at' FROM idempotency_records
                 WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3), ''),
       (SELECT fingerprint FROM idempotency_refusals WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3)`,
		owner, in.Platform, in.Key).Scan(&record, &stored.ConfirmedAt, &stored.CanceledAt, &refused)
	if err != nil {
		return err
	}
	fp := sales.Fingerprint(sales.Request{Operation: sales.Operation(in.Op), ItemID: in.Item, ExternalOrderID: in.Order})
	switch {
	case out.Status == http.StatusOK && !bytes.Equal(record, fp):
		return errors.New("answered 200, but its key holds no record of this request")
	case out.Status == http.StatusOK:
		return sameInstants(stored, out.Result)
	case out.Code == codeAlreadySold || out.Code == codeNotCancelable:
		if !bytes.Equal(refused, fp) && !bytes.Equal(record, fp) {
			return errors.New("refused, but its key is bound to no refusal or record of this request")
		}
	}
	return nil
}

// sameInstants compares the timestamps of a stored response (PostgreSQL's
// JSON text) with an answer's.
func sameInstants(stored, answered Result) error {
	for _, pair := range [][2]string{{stored.ConfirmedAt, answered.ConfirmedAt}, {stored.CanceledAt, answered.CanceledAt}} {
		if !sameInstant(pair[0], pair[1]) {
			return fmt.Errorf("its key's record holds confirmed_at %q canceled_at %q", stored.ConfirmedAt, stored.CanceledAt)
		}
	}
	return nil
}

func sameInstant(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	ta, errA := time.Parse(time.RFC3339Nano, a)
	tb, errB := time.Parse(time.RFC3339Nano, b)
	return errA == nil && errB == nil && ta.Equal(tb)
}
