package sales

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// A sale transaction can succeed while PostgreSQL warns: above all when
// someone other than the writer ends its COMMIT's wait for a synchronous
// standby (an operator's pg_cancel_backend on a session waiting in
// SyncRep, to release commits stuck behind a lost standby). The COMMIT
// then succeeds with a WARNING (syncrep.c): committed on the primary,
// perhaps not on the standby, and a failover to that standby loses it.
// Its calls are answered as done (true on the primary, and a retry would
// replay that answer from it), so the writer tells the SRE which calls
// those were, to reconcile with their platforms after a failover: one
// WARN line per call and transaction, naming what the call did (its
// outcome), a count, an event on each traced call's span. A backend
// terminated in that wait warns too (57P01), committed locally, and closes
// the connection: its calls, answered that the sale may have been applied,
// are told of alike, their line saying the transaction may have
// committed. Any WARNING counts, told apart by its SQLSTATE (a trigger's,
// the approach of wraparound: rare, and cheaper read than missed); its
// text is not relied on, as lc_messages translates it.

// commitWarnings tells of the sale transactions that committed with a
// WARNING. Set before the writer's first call (ReportWarnedCommits), read
// only after.
type commitWarnings struct {
	log   *slog.Logger
	calls prometheus.Counter
}

// newCommitWarnings tells nobody, until ReportWarnedCommits.
func newCommitWarnings() *commitWarnings {
	return &commitWarnings{log: slog.New(slog.DiscardHandler), calls: prometheus.NewCounter(warnedCallsOpts)}
}

var warnedCallsOpts = prometheus.CounterOpts{
	Name: "sales_writer_commit_warned_calls_total",
	Help: "Sale calls whose transaction committed while PostgreSQL sent a WARNING, or ended in an error after one, most often a commit's wait for a " +
		"synchronous standby ended by someone else (pg_cancel_backend; a terminated backend, whose connection then closes): committed on the primary, " +
		"perhaps not on the standby. Each call is named, with its outcome, in a WARN line 'sale transaction committed with a PostgreSQL warning' " +
		"(or 'sale transaction ended after a PostgreSQL warning').",
}

// ReportWarnedCommits has w tell of each sale transaction that committed
// while PostgreSQL warned: a line at WARN on log, and its calls counted in
// sales_writer_commit_warned_calls_total on reg. Called once, before w's
// first call; without it, w tells nobody.
func (w *Writer) ReportWarnedCommits(log *slog.Logger, reg prometheus.Registerer) {
	reg.MustRegister(w.warned.calls)
	w.warned.log = log
}

var (
	attrWarningCode      = attribute.Key("db.response.status_code")
	attrWarningSeverity  = attribute.Key("app.postgresql.warning_severity")
	attrWriterSentCancel = attribute.Key("app.commit.writer_sent_cancel")
)

// warnedEvent is the span event of a transaction that committed with a
// warning, on each traced call's span and on its group's: make trace of
// a request id shows it. It names no call's key, order or owner, as no
// span does (the group's sits in one call's trace).
const warnedEvent = "sale transaction committed with a PostgreSQL warning"

// warnedAttrs are warnedEvent's attributes.
func warnedAttrs(first postgres.Warning, writerSentCancel bool, calls int) []attribute.KeyValue {
	return []attribute.KeyValue{attrWarningCode.String(first.Code), attrWarningSeverity.String(first.Severity),
		attrWriterSentCancel.Bool(writerSentCancel), attrGroupCalls.Int(calls)}
}

// warnedTransaction is a transaction of a call during which PostgreSQL
// warned without an ERROR.
type warnedTransaction struct {
	first postgres.Warning
	// writerSentCancel: the writer itself sent the transaction a cancel
	// request (a call of its group left during its commit; its calls are
	// then answered ErrCommitUnconfirmed, and the warning is most likely
	// that cancel's).
	writerSentCancel bool
	calls            int  // the calls committed in it
	binding          bool // a refusal's binding (bindRefusedSQL), not a sale's statement
	// lost: the transaction ended in an error after the warning (its
	// connection lost, its deadline met: postgres.WarnedError), not in a
	// plain commit. It may have committed: a session terminated while its
	// COMMIT waits for a synchronous standby warns (57P01), committed
	// locally, and closes the connection.
	lost bool
}

// warnedOf is the warnedTransaction of calls (writerSentCancel as said
// there) whose batch ended with err while warnings were recorded, and err
// as the caller is to be answered it; ok is false when PostgreSQL did not
// warn, or when err says the transaction committed nothing (an ERROR, or
// PostgreSQL's FATAL of a terminated session, sent only before a commit).
// An error after a warning is wrapped in postgres.WarnedError, so that the
// line answering it names the warning: a session terminated in its commit's
// wait was logged as "unexpected EOF".
func warnedOf(warnings *postgres.Warnings, err error, calls int, writerSentCancel bool) (warnedTransaction, error, bool) {
	if warnings == nil || !warnings.Heard() || postgres.RolledBack(err) || postgres.Terminated(err) {
		return warnedTransaction{}, err, false
	}
	tx := warnedTransaction{first: warnings.First(), writerSentCancel: writerSentCancel, calls: calls}
	if err != nil && !errors.Is(err, ErrCommitUnconfirmed) {
		tx.lost = true
		err = &postgres.WarnedError{Warning: tx.first, Err: err}
	}
	return tx, err, true
}

// callTold is one call as commitWarnings tells of it: its transactions
// during which PostgreSQL warned, each told of in a line once the call's
// outcome is known (answer), so that the line says what the call did: an
// SRE reading it for a request id could not tell whether that call sold,
// replayed or was refused in the transaction.
type callTold struct {
	cw  *commitWarnings
	ctx context.Context // the call's: its request id and span
	req Request

	mu       sync.Mutex
	pending  []warnedTransaction
	answered bool
	// What the call was answered, read by outcome when a line is told:
	// kept as is, as every call is answered and few have a line to tell.
	res      Result
	err      error
	panicked bool
}

// call is the callTold of req, called in ctx.
func (cw *commitWarnings) call(ctx context.Context, req Request) *callTold {
	return &callTold{cw: cw, ctx: ctx, req: req}
}

// heard records tx, during which PostgreSQL warned: an event on the call's
// span at once, and a line once the call is answered, or at once if it has
// been (a call that left its commit group in flight, answered before the
// group ended).
func (c *callTold) heard(tx warnedTransaction) {
	if span := trace.SpanFromContext(c.ctx); span.IsRecording() {
		span.AddEvent(warnedEvent, trace.WithAttributes(warnedAttrs(tx.first, tx.writerSentCancel, tx.calls)...))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answered {
		c.cw.tell(c, tx)
		return
	}
	c.pending = append(c.pending, tx)
}

// answer tells of the call's warned transactions, now that it is known
// to have been answered res, err. The line's outcome (outcomeOf) is built
// only when there is a line to tell: a call with nothing warned, nearly
// every one, allocates nothing here and formats no error's text.
func (c *callTold) answer(res Result, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answered, c.res, c.err = true, res, err
	c.tellPending()
}

// answerPanic is answer for a call that panicked, which its caller answers
// 500.
func (c *callTold) answerPanic() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answered, c.panicked = true, true
	c.tellPending()
}

// tellPending tells of the transactions heard before the call was
// answered; c.mu is held.
func (c *callTold) tellPending() {
	for _, tx := range c.pending {
		c.cw.tell(c, tx)
	}
	c.pending = nil
}

// outcome is what the call's lines say it did: outcomeOf its answer, or
// panicked.
func (c *callTold) outcome() []slog.Attr {
	if c.panicked {
		return []slog.Attr{slog.String("outcome", outcomePanicked)}
	}
	return outcomeOf(c.res, c.err)
}

// The outcomes a warned transaction's line gives its call (outcomeOf).
const (
	outcomeExecuted        = "executed"         // sold or canceled: item_status is the item's status after it
	outcomeReplayed        = "replayed"         // the key's stored result answered again
	outcomeRefused         = "refused"          // refused now: refusal is why
	outcomeReplayedRefusal = "replayed_refusal" // the key's refusal answered again
	outcomeFailed          = "failed"           // a 5xx or 499: error is why, sale_applied in its access line says what of it
	outcomePanicked        = "panicked"         // the call panicked: its answer is a 500
)

// outcomeOf is what the call answered res, err did, as its warned lines
// say it: outcome, and the item's status after an executed or replayed
// call, the refusal's code (the one its key is bound to, as
// idempotency_refusals keeps it), or the error.
func outcomeOf(res Result, err error) []slog.Attr {
	if err == nil {
		outcome := outcomeExecuted
		if res.IdempotentReplay {
			outcome = outcomeReplayed
		}
		return []slog.Attr{slog.String("outcome", outcome), slog.String("item_status", res.Status)}
	}
	outcome := outcomeRefused
	if IsReplayedRefusal(err) {
		outcome = outcomeReplayedRefusal
	}
	if code, ok := refusalCode(err); ok {
		return []slog.Attr{slog.String("outcome", outcome), slog.String("refusal", code)}
	}
	switch {
	case errors.Is(err, ErrIdempotencyConflict):
		return []slog.Attr{slog.String("outcome", outcome), slog.String("refusal", "idempotency_conflict")}
	case errors.Is(err, ErrInProgress):
		return []slog.Attr{slog.String("outcome", outcome), slog.String("refusal", "request_in_progress")}
	}
	return []slog.Attr{slog.String("outcome", outcomeFailed), slog.String("error", err.Error())}
}

// The messages of a warned transaction's line.
const (
	warnedCommitMessage = "sale transaction committed with a PostgreSQL warning: " +
		"it may not be on a synchronous standby, and a failover to one would lose it; reconcile this call with its platform after one"
	warnedLostMessage = "sale transaction ended after a PostgreSQL warning: it may have committed on the primary only " +
		"(a session terminated while its commit waited for a synchronous standby has), and a failover to a standby would lose it; " +
		"reconcile this call with its platform after one"
)

// tell logs the line of the call's transaction tx and counts it: its
// request id at the top level, as on every line of the call, so that a
// search of the logs by the request id an SRE was given finds it (a
// group's calls named in one line were found by a grep, not by a query
// of the JSON's request_id); transaction_calls says how many calls the
// transaction held. The line is logged outside the call's context, its
// request_id set here: the logger would add the trace's id as another
// request_id.
func (cw *commitWarnings) tell(c *callTold, tx warnedTransaction) {
	cw.calls.Inc()
	message, transaction := warnedCommitMessage, "sale"
	if tx.lost {
		message = warnedLostMessage
	}
	if tx.binding {
		transaction = "refusal_binding"
	}
	attrs := append([]slog.Attr{slog.String("request_id", requestID(c.ctx)),
		slog.String("sqlstate", tx.first.Code), slog.String("severity", tx.first.Severity), slog.String("message", tx.first.Message),
		slog.Bool("writer_sent_cancel", tx.writerSentCancel), slog.Int("transaction_calls", tx.calls),
		slog.String("transaction", transaction)}, c.outcome()...)
	attrs = append(attrs, slog.String("owner_id", c.req.OwnerID), slog.String("operation", string(c.req.Operation)),
		slog.String("item_id", httpserver.LoggableClientValue(c.req.ItemID)),
		slog.String("platform_id", c.req.PlatformID),
		slog.String("external_order_id", httpserver.LoggableClientValue(c.req.ExternalOrderID)),
		slog.String("idempotency_key", httpserver.LoggableClientValue(c.req.IdempotencyKey)))
	cw.log.LogAttrs(context.Background(), slog.LevelWarn, message, attrs...)
}

// requestID is the request id of the call in ctx: the one the gateway
// signed, else its trace id (which the gateway's request id is), as
// httpserver.RequestID reads it.
func requestID(ctx context.Context) string {
	if id, ok := identity.FromContext(ctx); ok && id.RequestID != "" {
		return id.RequestID
	}
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}
