package sales

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Writer executes confirm and cancel calls against PostgreSQL.
//
// Every call is one pgx batch of two statements, sent in one round trip and
// run by PostgreSQL in one implicit transaction (a statement that fails rolls
// back both):
//
//  1. claimSQL inserts the idempotency record with the pending response
//     'null'. If an identical request holds the same key in an uncommitted
//     transaction, PostgreSQL makes this insert wait on the primary key until
//     that transaction ends; then it finds the committed record (and inserts
//     nothing) or, if the other one left no record, inserts its own. An
//     existing record is taken over only when it has expired.
//  2. confirmSQL or cancelSQL changes the item and the sale only if this
//     transaction holds a pending record for the key: a record is pending
//     only inside the transaction that wrote it, because the same statement
//     either stores the response in it or deletes it. The statement returns
//     the record it saw, the new response if it wrote one, and the item's
//     state for the error to report.
//
// "Sold at most once" rests on the item's row lock: a confirm updates the item
// only WHERE NOT sold, so of two confirms racing for an item one waits for the
// other and then finds it sold. The partial unique index
// sales_one_open_sale_per_item stands behind that.
type Writer struct {
	db        *pgxpool.Pool
	retention time.Duration
}

// NewWriter returns a Writer whose idempotency records live for retention.
func NewWriter(db *pgxpool.Pool, retention time.Duration) *Writer {
	return &Writer{db: db, retention: retention}
}

// errRetry asks Execute to run the call again: the statement's snapshot did
// not explain its outcome (a concurrent transaction committed in between).
var errRetry = errors.New("sales: retry")

// maxAttempts bounds the runs of one call; a second run sees a fresh snapshot.
const maxAttempts = 3

// Execute runs req exactly once per idempotency key and returns the result,
// or replays the stored result of an earlier identical request.
func (w *Writer) Execute(ctx context.Context, req Request) (Result, error) {
	fp := Fingerprint(req)
	for range maxAttempts {
		res, err := w.once(ctx, req, fp)
		if !errors.Is(err, errRetry) {
			return res, err
		}
	}
	return Result{}, lastResort(req.Operation)
}

func (w *Writer) once(ctx context.Context, req Request, fp []byte) (Result, error) {
	o, err := w.run(ctx, req, fp)
	if err != nil {
		return Result{}, err
	}
	return o.decide(req.Operation, fp)
}

// lastResort is the answer when every attempt lost a race: for a confirm some
// other transaction keeps changing the item, which only a sale does; for a
// cancel the record of the key keeps changing under us.
func lastResort(op Operation) error {
	if op == Confirm {
		return ErrAlreadySold
	}
	return ErrInProgress
}

// outcome is what the write statement reports.
type outcome struct {
	recordFingerprint []byte // of the record seen for the key; nil when none
	claimed           bool   // this transaction wrote the record
	stored            []byte // response stored in a record of an earlier request
	written           []byte // response of the change made now; nil when none
	itemFound         bool
	listedActive      bool
	sold              bool
}

func (w *Writer) run(ctx context.Context, req Request, fp []byte) (outcome, error) {
	stmt := confirmSQL
	if req.Operation == Cancel {
		stmt = cancelSQL
	}
	b := &pgx.Batch{}
	b.Queue(claimSQL, req.OwnerID, req.PlatformID, req.IdempotencyKey, fp, w.retention.Seconds())
	b.Queue(stmt, req.OwnerID, req.PlatformID, req.IdempotencyKey, req.ItemID, req.ExternalOrderID)
	br := w.db.SendBatch(ctx, b)
	var o outcome
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&o.recordFingerprint, &o.claimed, &o.stored, &o.written,
			&o.itemFound, &o.listedActive, &o.sold)
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return o, classify(err)
}

// classify turns database errors with a meaning for the caller into errors of
// this package.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == "23505" && pgErr.ConstraintName == "sales_one_open_sale_per_item":
		return ErrAlreadySold
	case pgErr.Code == "23503" && strings.HasPrefix(pgErr.ConstraintName, "idempotency_records_"):
		// The key's owner or platform is not in the database (the gateway
		// signed a key whose owner was since removed): nothing is theirs.
		return ErrNotFound
	case pgErr.Code == "40P01", pgErr.Code == "40001":
		// Deadlock or serialization failure: nothing was written; run again.
		return errRetry
	}
	return fmt.Errorf("sales: %w", err)
}

// decide turns what the statement saw into the call's answer.
func (o outcome) decide(op Operation, fp []byte) (Result, error) {
	switch {
	case o.written != nil:
		return decodeResult(o.written, false)
	case !o.claimed:
		return o.replay(fp)
	case !o.itemFound:
		return Result{}, ErrNotFound
	case op == Cancel:
		return Result{}, ErrNotCancelable
	case o.sold:
		return Result{}, ErrAlreadySold
	case !o.listedActive:
		return Result{}, ErrNotAvailable
	default:
		// The snapshot showed the item for sale, yet the update found it
		// changed by a transaction that committed meanwhile.
		return Result{}, errRetry
	}
}

// replay answers a key that an earlier request already used.
func (o outcome) replay(fp []byte) (Result, error) {
	if o.recordFingerprint == nil {
		// The record we waited for vanished (expired and purged): run again.
		return Result{}, errRetry
	}
	if !bytes.Equal(o.recordFingerprint, fp) {
		return Result{}, ErrIdempotencyConflict
	}
	return decodeResult(o.stored, true)
}

func decodeResult(stored []byte, replay bool) (Result, error) {
	var r Result
	if err := json.Unmarshal(stored, &r); err != nil {
		return Result{}, fmt.Errorf("sales: stored response: %w", err)
	}
	r.ConfirmedAt, r.CanceledAt = r.ConfirmedAt.UTC(), r.CanceledAt.UTC()
	r.IdempotentReplay = replay
	return r, nil
}
