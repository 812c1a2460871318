package sales

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Writer executes confirm and cancel calls against PostgreSQL, each as one
// statement after the key's lock, in one round trip (see queries.go for why
// that is safe).
//
// "Sold at most once" rests on the item's row lock: a confirm updates the item
// only WHERE NOT sold, so of two confirms racing for an item one waits for the
// other and then finds it sold. The partial unique index
// sales_one_open_sale_per_item stands behind that. "Executed at most once per
// idempotency key" rests on the record's primary key: a second transaction
// that stores the same key fails and rolls back everything it did.
//
// Every statement goes through postgres.AcquireFunc, whose connection
// marks the call's postgres.Sent: a panic's answer says nothing was
// applied until then (api's panicAnswer). A statement sent otherwise would
// not be seen, and such an answer would lie.
type Writer struct {
	db        *pgxpool.Pool
	retention time.Duration
	groups    *committer // nil: every call commits alone
	warned    *commitWarnings
}

// NewWriter returns a Writer whose idempotency records live for retention,
// which commits the calls that arrive together in groups (group.go),
// DefaultCommitGroups at once.
func NewWriter(db *pgxpool.Pool, retention time.Duration) *Writer {
	return NewGroupingWriter(db, retention, DefaultCommitGroups, GroupStats{})
}

// NewGroupingWriter is NewWriter running at most groups commit groups at
// once (0: none; every call commits alone), telling stats of each.
func NewGroupingWriter(db *pgxpool.Pool, retention time.Duration, groups int, stats GroupStats) *Writer {
	w := &Writer{db: db, retention: retention, warned: newCommitWarnings()}
	if groups > 0 {
		w.groups = &committer{db: db, maxGroups: groups, stats: stats, warned: w.warned, cancelRequest: (*pgconn.PgConn).CancelRequest,
			leaveGrace: leaveGrace}
	}
	return w
}

// SetLeaveGrace sets how long a call that leaves its commit group in
// flight waits for the group to end before it is answered that its sale
// may have been applied (leaveGrace, 250 ms, unless set). For tests of
// the answers of a group that ends: on a loaded machine PostgreSQL can
// take longer than leaveGrace to end a group it was asked to cancel, and
// such a test would then read the answer of a group that did not.
func (w *Writer) SetLeaveGrace(d time.Duration) {
	if w.groups != nil {
		w.groups.leaveGrace = d
	}
}

var (
	// errRetry: the statement's snapshot does not explain its outcome; a
	// concurrent transaction committed meanwhile. Another run sees it.
	errRetry = errors.New("sales: retry")
	// errKeyTaken: another transaction stored the key after the statement
	// started, or an expired record not yet purged holds it.
	errKeyTaken = errors.New("sales: idempotency key taken")
	// errRolledBack: PostgreSQL rolled the run back to let another
	// transaction through (a deadlock, or a serialization failure):
	// nothing was written, and another run may pass. Unlike errRetry it
	// says nothing of the item, so a call whose every run ends so is
	// answered the database's error (503), never a refusal.
	errRolledBack = errors.New("sales: rolled back by the database")
)

// maxAttempts bounds the runs of one call. A second run normally settles it:
// it sees whatever the first one raced with.
const maxAttempts = 3

// Execute runs req at most once per idempotency key and returns the result,
// or replays the stored result of an earlier identical request. A refusal
// binds the key to req (spec 4.7 rule 3).
// Each of its transactions during which PostgreSQL warned (a commit's
// wait for a synchronous standby cut) is told of once the call's outcome is
// known (commitWarnings).
func (w *Writer) Execute(ctx context.Context, req Request) (Result, error) {
	told := w.warned.call(ctx, req)
	answered := false
	defer func() {
		if !answered { // a panic, which the caller answers 500
			told.answerPanic()
		}
	}()
	res, err := w.execute(ctx, req, told)
	answered = true
	told.answer(res, err)
	return res, err
}

// execute is Execute, telling told of the call's warned transactions.
func (w *Writer) execute(ctx context.Context, req Request, told *callTold) (Result, error) {
	fp := Fingerprint(req)
	res, err := w.attempts(ctx, req, fp, told)
	if code, refused := refusalCode(err); refused && !IsReplayedRefusal(err) {
		return w.bindRefused(ctx, req, fp, err, code, told)
	}
	return res, err
}

// attempts runs req until one run settles it.
func (w *Writer) attempts(ctx context.Context, req Request, fp []byte, told *callTold) (Result, error) {
	var last error
	for range maxAttempts {
		res, err := w.once(ctx, req, fp, told)
		switch {
		case errors.Is(err, errKeyTaken):
			if err := w.dropExpired(ctx, req); err != nil {
				return Result{}, fmt.Errorf("sales: drop expired record: %w", err)
			}
			last = ErrInProgress
		case errors.Is(err, errRetry):
			last = lastResort(req.Operation)
		case errors.Is(err, errRolledBack):
			last = err
		default:
			return res, err
		}
	}
	return Result{}, last
}

// dropExpired deletes the key's record if it has expired.
func (w *Writer) dropExpired(ctx context.Context, req Request) error {
	return postgres.AcquireFunc(ctx, w.db, func(conn *pgxpool.Conn) error {
		_, err := conn.Exec(ctx, dropExpiredSQL, req.OwnerID, req.PlatformID, req.IdempotencyKey)
		return err
	})
}

// lastResort answers a call whose every run lost a race for the item: some
// other call keeps changing it, which only sales and cancellations do.
func lastResort(op Operation) error {
	if op == Confirm {
		return ErrAlreadySold
	}
	return ErrNotCancelable
}

func (w *Writer) once(ctx context.Context, req Request, fp []byte, told *callTold) (Result, error) {
	stmt := confirmSQL
	if req.Operation == Cancel {
		stmt = cancelSQL
	}
	var wr written
	err := w.submit(ctx, req, told, stmt, []any{req.OwnerID, req.PlatformID, req.IdempotencyKey, req.ItemID,
		req.ExternalOrderID, fp, w.retention.Seconds()},
		func(row pgx.Row) error {
			return row.Scan(&wr.recordFingerprint, &wr.stored, &wr.status, &wr.confirmedAt, &wr.canceledAt)
		})
	switch {
	case err != nil:
		return Result{}, classify(err)
	case wr.status.Valid:
		return wr.result(req), nil
	case wr.recordFingerprint != nil:
		return replay(wr.recordFingerprint, wr.stored, fp)
	}
	return w.explain(ctx, req, fp)
}

// written is what the write statement reports: the live record it saw, or
// the change it made (status set), or neither. The change's columns are
// pgtype's nullable types, which pgx scans into without planning a
// pointer-to-pointer wrapper for each column of every call.
type written struct {
	recordFingerprint []byte      // of the key's live record; nil when none
	stored            []byte      // response in that record
	status            pgtype.Text // exported status after the change; not Valid when nothing changed
	confirmedAt       pgtype.Timestamptz
	canceledAt        pgtype.Timestamptz // cancel only
}

// result is the answer to req of the change just made; it equals the
// response the statement stored, which TestConfirmRetryReplays and
// TestCancelRestoresItem check by comparing the first answer with a replay.
func (wr written) result(req Request) Result {
	r := Result{
		ItemID:          req.ItemID,
		Status:          wr.status.String,
		PlatformID:      req.PlatformID,
		ExternalOrderID: req.ExternalOrderID,
	}
	if r.Status == "active" {
		r.StockQuantity = 1
	}
	if wr.confirmedAt.Valid {
		r.ConfirmedAt = wr.confirmedAt.Time.UTC()
	}
	if wr.canceledAt.Valid {
		r.CanceledAt = wr.canceledAt.Time.UTC()
	}
	return r
}

// replay answers with the record's stored response if it was stored for the
// same request, else with a conflict.
func replay(recordFingerprint, stored, fp []byte) (Result, error) {
	if !bytes.Equal(recordFingerprint, fp) {
		return Result{}, ErrIdempotencyConflict
	}
	return decodeReplay(stored)
}

// explain finds out, in a snapshot taken after the write statement, why it
// changed nothing.
func (w *Writer) explain(ctx context.Context, req Request, fp []byte) (Result, error) {
	var o outcome
	err := postgres.AcquireFunc(ctx, w.db, func(conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, explainSQL, req.OwnerID, req.PlatformID, req.IdempotencyKey, req.ItemID,
			req.ExternalOrderID).
			Scan(&o.recordFingerprint, &o.stored, &o.boundFingerprint, &o.boundRefusal, &o.itemFound, &o.sellable, &o.sold, &o.platformFound, &o.openSale)
	})
	if err != nil {
		return Result{}, classify(err)
	}
	return o.decide(req.Operation, fp)
}

// bindRefused binds the key to req and its refusal, and returns the
// refusal; or what the key holds when a request with it got there first
// (it raced this one): the conflict, if that was another request; if it
// was req itself (a copy of the same call), its executed result or the
// refusal bound first, so that every copy of a call gets one answer.
func (w *Writer) bindRefused(ctx context.Context, req Request, fp []byte, refusal error, code string, told *callTold) (Result, error) {
	var k keyHolds
	err := w.underKeyLock(ctx, req, told, bindRefusedSQL,
		[]any{req.OwnerID, req.PlatformID, req.IdempotencyKey, fp, w.retention.Seconds(), code},
		func(row pgx.Row) error {
			return row.Scan(&k.boundFingerprint, &k.boundRefusal, &k.recordFingerprint, &k.stored)
		})
	switch {
	case err != nil:
		return Result{}, classify(err)
	case k.recordFingerprint != nil:
		return replay(k.recordFingerprint, k.stored, fp)
	case !bytes.Equal(k.boundFingerprint, fp):
		return Result{}, ErrIdempotencyConflict
	case k.boundRefusal != nil && *k.boundRefusal != code:
		return Result{}, replayRefusal(*k.boundRefusal)
	}
	return Result{}, refusal
}

// keyHolds is what bindRefusedSQL reports.
type keyHolds struct {
	boundFingerprint  []byte  // nil when a record kept the key from being bound
	boundRefusal      *string // nil in a binding of a build before migration 00007
	recordFingerprint []byte  // of the key's live record; nil when none
	stored            []byte  // response in that record
}

// underKeyLock runs stmt (one row, read by scan) in a transaction that
// first takes req's key lock (keyLockHearingWarnings) in a statement of
// its own, so that stmt's snapshot is taken once the lock is held. One
// batch, one round trip: the statements before its one Sync form one
// implicit transaction, committed at the Sync. A transaction during which
// PostgreSQL warned is told of (told.heard), its answer unchanged, or its
// error naming the warning (warnedOf).
func (w *Writer) underKeyLock(ctx context.Context, req Request, told *callTold, stmt string, args []any, scan func(pgx.Row) error) error {
	batch := keyLockBatch(req, stmt, args, scan)
	var tx warnedTransaction
	var warned bool
	err := postgres.AcquireFunc(ctx, w.db, func(conn *pgxpool.Conn) error {
		warnings := postgres.WarningsOf(conn.Conn().PgConn())
		if warnings != nil {
			warnings.Reset() // an earlier statement's on this connection is not this call's
		}
		var err error
		tx, err, warned = warnedOf(warnings, conn.SendBatch(ctx, batch).Close(), 1, false)
		return err
	})
	if warned {
		tx.binding = stmt == bindRefusedSQL
		told.heard(tx)
	}
	return err
}

// keyLockBatch is underKeyLock's batch: req's key lock, then stmt. Like
// groupBatch's, it holds no statement of transaction control, so that it
// is one implicit transaction committed at its Sync, which a FATAL of a
// terminated session read in its place never follows (postgres.Terminated:
// with a COMMIT of its own in a batch, one can).
func keyLockBatch(req Request, stmt string, args []any, scan func(pgx.Row) error) *pgx.Batch {
	batch := &pgx.Batch{}
	batch.Queue(keyLockHearingWarnings, req.OwnerID, req.PlatformID, req.IdempotencyKey)
	batch.Queue(stmt, args...).QueryRow(scan)
	return batch
}

// outcome is what explainSQL reports.
type outcome struct {
	recordFingerprint []byte  // of the key's live record; nil when none
	stored            []byte  // response in that record
	boundFingerprint  []byte  // of the key's refused first request; nil when none
	boundRefusal      *string // its refusal's code; nil when none, or bound by a build before 00007
	itemFound         bool
	sellable          bool // listed and not sold
	sold              bool
	platformFound     bool
	openSale          bool // an open sale of this platform and order
}

// classify turns database errors with a meaning for the caller into errors of
// this package.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("sales: %w", err)
	}
	switch {
	case pgErr.Code == "23505" && pgErr.ConstraintName == "sales_one_open_sale_per_item":
		return ErrAlreadySold
	case pgErr.Code == "23505" && pgErr.ConstraintName == "idempotency_records_pkey":
		return errKeyTaken
	case pgErr.Code == "40P01", pgErr.Code == "40001":
		// Deadlock or serialization failure: nothing was written; run again.
		return fmt.Errorf("%w: %w", errRolledBack, err)
	}
	return fmt.Errorf("sales: %w", err)
}

// decide turns what explainSQL saw into the call's answer. Its snapshot is
// newer than the write statement's, so a transaction that committed in
// between (perhaps an identical request, which must be replayed) is seen. A
// refusal stands only if this snapshot explains it: if the item (or sale)
// is in a state the write would have changed, a concurrent change got in
// between, and the call runs again.
func (o outcome) decide(op Operation, fp []byte) (Result, error) {
	switch {
	case o.recordFingerprint != nil:
		return replay(o.recordFingerprint, o.stored, fp)
	case o.boundFingerprint != nil && !bytes.Equal(o.boundFingerprint, fp):
		return Result{}, ErrIdempotencyConflict
	case o.boundRefusal != nil:
		// The key's request was refused before: the refusal is its
		// answer, as a 200 would be, whatever the item's state now.
		return Result{}, replayRefusal(*o.boundRefusal)
	case !o.itemFound, op == Confirm && !o.platformFound:
		// A signed identity of a platform not in the database (one that
		// was removed) sells nothing; it has no sale to cancel either,
		// which the cancel rows below answer.
		return Result{}, ErrNotFound
	case op == Cancel && o.openSale, op == Confirm && o.sellable:
		return Result{}, errRetry
	case op == Cancel:
		return Result{}, ErrNotCancelable
	case o.sold && o.openSale:
		return Result{}, ErrAlreadySoldToThisOrder
	case o.sold:
		return Result{}, ErrAlreadySold
	default:
		return Result{}, ErrNotAvailable
	}
}

// refusalCodes name the refusals a key's binding keeps (migration 00007);
// ErrAlreadySoldToThisOrder before ErrAlreadySold, which it wraps.
var refusalCodes = []struct {
	err  error
	code string
}{
	{ErrNotFound, "not_found"},
	{ErrAlreadySoldToThisOrder, "item_already_sold_to_this_order"},
	{ErrAlreadySold, "item_already_sold"},
	{ErrNotAvailable, "item_not_available"},
	{ErrNotCancelable, "sale_not_cancelable"},
}

// refusalCode is the code a key's binding keeps for err, and whether err
// refuses the request for the state of the item or sale, which binds the
// key to the request (spec 4.7 rule 3): one list decides both.
func refusalCode(err error) (string, bool) {
	for _, r := range refusalCodes {
		if errors.Is(err, r.err) {
			return r.code, true
		}
	}
	return "", false
}

// replayedRefusal is the refusal answered before to the key's identical
// request, answered again (IsReplayedRefusal).
type replayedRefusal struct{ refusal error }

func (r *replayedRefusal) Error() string { return r.refusal.Error() }
func (r *replayedRefusal) Unwrap() error { return r.refusal }

func replayRefusal(code string) error {
	for _, r := range refusalCodes {
		if r.code == code {
			return &replayedRefusal{refusal: r.err}
		}
	}
	return fmt.Errorf("sales: a key is bound to an unknown refusal %q", code)
}

// IsReplayedRefusal reports whether err is a refusal given before to the
// key's identical request (a 404 or 409 is final for its key, as a 200 is).
func IsReplayedRefusal(err error) bool {
	var r *replayedRefusal
	return errors.As(err, &r)
}

// decodeReplay is a stored response as its replay answers it: the stored
// result, marked idempotent_replay (spec 4.7 rule 2). A fresh result is never
// read back from its record (written.result builds it), so every decoded one
// is a replay.
func decodeReplay(stored []byte) (Result, error) {
	var r Result
	if err := json.Unmarshal(stored, &r); err != nil {
		return Result{}, fmt.Errorf("sales: stored response: %w", err)
	}
	r.ConfirmedAt, r.CanceledAt = r.ConfirmedAt.UTC(), r.CanceledAt.UTC()
	r.IdempotentReplay = true
	return r, nil
}
