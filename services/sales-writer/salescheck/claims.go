package salescheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Claims counts a history's answers that said nothing was applied, and
// those of them NothingAppliedHolds could hold to the database's stamps.
type Claims struct {
	Said    int // sale answers that said their attempt applied nothing
	Checked int // of them, sent before any attempt of their request that did not say so
}

func (c Claims) String() string {
	return fmt.Sprintf("%d answers said nothing was applied, %d of them before any other attempt of their request that could have applied it, checked against the database's stamps",
		c.Said, c.Checked)
}

// NothingAppliedHolds checks, against the database after a settled
// history of owner's items, the answers that said their attempt applied
// nothing (Output.NothingApplied). Such an answer speaks of its own
// attempt: an earlier attempt of the same request, of unknown outcome, may
// have applied it, and a later one may. So for each request, what its key
// holds (the record of its execution, or its bound refusal) must have been
// written after the first sending of an attempt that did not say nothing
// was applied; if every attempt said so, its key must hold nothing of it.
// The database stamps what it writes with its transaction's start, after
// the attempt that wrote it was sent: a record's created_at, a refusal's
// expires_at less retention (the writers' IDEMPOTENCY_RETENTION), on the
// clock the history's instants are read on (one machine's). The linearizability
// check holds the same answers to the rest of the history (History.Operations).
func NothingAppliedHolds(ctx context.Context, db *pgxpool.Pool, owner string, h *History, retention time.Duration) (Claims, error) {
	var c Claims
	if h.start.IsZero() {
		return c, errors.New("the history has no clock to place the database's stamps on (read from JSON)")
	}
	// A step of the wall clock moves the database's stamps against the
	// history's instants, which are read on the monotonic clock: that much
	// slack keeps the check sound.
	slack := h.clockStep().Abs()
	var errs []error
	for _, r := range requestsOf(h) {
		c.Said += r.said
		if r.checked == 0 {
			continue
		}
		c.Checked += r.checked
		stamp, what, err := keyStamp(ctx, db, owner, r.in, retention)
		if err != nil {
			return c, err
		}
		if stamp.IsZero() {
			continue
		}
		limit := h.start.Round(0).Add(time.Duration(r.firstDoubt) - slack).Truncate(time.Microsecond)
		if r.firstDoubt == math.MaxInt64 || stamp.Before(limit) {
			errs = append(errs, fmt.Errorf("%s: its key holds %s written at %s, %s; said nothing was applied:\n%s",
				r.in, what, stamp.UTC().Format(time.RFC3339Nano), r.doubtSaid(h), strings.Join(r.claims, "\n")))
		}
	}
	return c, errors.Join(errs...)
}

// request is one sale request's attempts, as NothingAppliedHolds reads them.
type request struct {
	in         Input
	firstDoubt int64    // the first sending of an attempt that did not say nothing was applied; MaxInt64 if none
	said       int      // attempts that said nothing was applied
	checked    int      // of them, those sent before firstDoubt
	claims     []string // those, described
}

func (r request) doubtSaid(h *History) string {
	if r.firstDoubt == math.MaxInt64 {
		return "and every attempt of the request said nothing was applied"
	}
	return "before the first attempt that did not say nothing was applied was sent (" +
		h.start.Round(0).Add(time.Duration(r.firstDoubt)).UTC().Format(time.RFC3339Nano) + ")"
}

// requestsOf groups h's sale attempts by request, those with an answer
// that said nothing was applied.
func requestsOf(h *History) []request {
	calls := h.Calls()
	byInput := map[Input]*request{}
	var order []Input
	for _, op := range calls {
		in := op.Input.(Input)
		if in.Op == Read {
			continue
		}
		r, ok := byInput[in]
		if !ok {
			r = &request{in: in, firstDoubt: math.MaxInt64}
			byInput[in] = r
			order = append(order, in)
		}
		if !op.Output.(Output).NothingApplied {
			r.firstDoubt = min(r.firstDoubt, op.Call)
		}
	}
	for _, op := range calls {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Op == Read || !out.NothingApplied {
			continue
		}
		r := byInput[in]
		r.said++
		if op.Call < r.firstDoubt {
			r.checked++
			r.claims = append(r.claims, "  "+describeOp(op))
		}
	}
	var rs []request
	for _, in := range order {
		if r := byInput[in]; r.said > 0 {
			rs = append(rs, *r)
		}
	}
	return rs
}

// keyStamp returns when the database wrote what in's key holds of in (its
// record, or its bound refusal), and which; the zero time if it holds
// nothing of in.
func keyStamp(ctx context.Context, db *pgxpool.Pool, owner string, in Input, retention time.Duration) (time.Time, string, error) {
	fp := sales.Fingerprint(sales.Request{Operation: sales.Operation(in.Op), ItemID: in.Item, ExternalOrderID: in.Order})
	var record, refusal *time.Time
	err := db.QueryRow(ctx, `
SELECT (SELECT created_at FROM idempotency_records
        WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND fingerprint = $4),
       (SELECT expires_at - $5::float8 * interval '1 second' FROM idempotency_refusals
        WHERE owner_id = $1 AND platform_id = $2 AND idempotency_key = $3 AND fingerprint = $4)`,
		owner, in.Platform, in.Key, fp, retention.Seconds()).Scan(&record, &refusal)
	switch {
	case err != nil:
		return time.Time{}, "", fmt.Errorf("reading the key of %s: %w", in, err)
	case record != nil:
		return *record, "its record", nil
	case refusal != nil:
		return *refusal, "its refusal", nil
	}
	return time.Time{}, "", nil
}
