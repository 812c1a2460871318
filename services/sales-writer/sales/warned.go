package sales

import (
	"context"
	"log/slog"

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
// SyncRep, to release commits stuck behind a lost standby; a backend
// terminated while waiting). The COMMIT then succeeds with a WARNING
// (syncrep.c): committed on the primary, perhaps not on the standby, and a
// failover to that standby loses it. Its calls are answered as done (true
// on the primary, and a retry would replay that answer from it), so the
// writer tells the SRE which calls those were, to reconcile with their
// platforms after a failover: one WARN line per transaction naming each
// call, a count, an event on each traced call's span. Any WARNING counts,
// told apart by its SQLSTATE (a trigger's, the approach of wraparound:
// rare, and cheaper read than missed); its text is not relied on, as
// lc_messages translates it.

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
	Help: "Sale calls whose transaction committed while PostgreSQL sent a WARNING, most often a commit's wait for a " +
		"synchronous standby ended by someone else (pg_cancel_backend, a terminated backend): committed on the primary, " +
		"perhaps not on the standby. Each transaction's calls are named in a WARN line 'sale transaction committed with a PostgreSQL warning'.",
}

// ReportWarnedCommits has w tell of each sale transaction that committed
// while PostgreSQL warned: a line at WARN on log, and its calls counted in
// sales_writer_commit_warned_calls_total on reg. Called once, before w's
// first call; without it, w tells nobody.
func (w *Writer) ReportWarnedCommits(log *slog.Logger, reg prometheus.Registerer) {
	reg.MustRegister(w.warned.calls)
	w.warned.log = log
}

// warnedCall is one call of a transaction that committed with a warning.
type warnedCall struct {
	ctx context.Context // the call's: its request id and span
	req Request
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

// report tells of a transaction of calls that committed while PostgreSQL
// warned (first, the first warning), to which the writer itself sent a
// cancel request or not (writerSentCancel: a call of its group left during
// its commit; its calls are then answered ErrCommitUnconfirmed, and the
// warning is most likely that cancel's; the others' as done): a WARN line
// per call, with its request id at the top
// level as on every line of the call, so that a search of the logs by
// the request id an SRE was given finds it (a group's calls named in one
// line were found by a grep, not by a query of the JSON's request_id);
// transaction_calls says how many calls the transaction held. The lines
// are logged outside the calls' contexts, their request_id set here: the
// logger would add the trace's id as another request_id.
func (cw *commitWarnings) report(calls []warnedCall, first postgres.Warning, writerSentCancel bool) {
	cw.calls.Add(float64(len(calls)))
	for _, call := range calls {
		if span := trace.SpanFromContext(call.ctx); span.IsRecording() {
			span.AddEvent(warnedEvent, trace.WithAttributes(warnedAttrs(first, writerSentCancel, len(calls))...))
		}
		cw.log.LogAttrs(context.Background(), slog.LevelWarn, "sale transaction committed with a PostgreSQL warning: "+
			"it may not be on a synchronous standby, and a failover to one would lose it; reconcile this call with its platform after one",
			slog.String("request_id", requestID(call.ctx)),
			slog.String("sqlstate", first.Code), slog.String("severity", first.Severity), slog.String("message", first.Message),
			slog.Bool("writer_sent_cancel", writerSentCancel), slog.Int("transaction_calls", len(calls)),
			slog.String("owner_id", call.req.OwnerID), slog.String("operation", string(call.req.Operation)),
			slog.String("item_id", httpserver.LoggableClientValue(call.req.ItemID)),
			slog.String("platform_id", call.req.PlatformID),
			slog.String("external_order_id", httpserver.LoggableClientValue(call.req.ExternalOrderID)),
			slog.String("idempotency_key", httpserver.LoggableClientValue(call.req.IdempotencyKey)))
	}
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
