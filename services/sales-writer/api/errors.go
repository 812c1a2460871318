package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/saleclaim"
	"github.com/coinexport/export/services/sales-writer/sales"
)

// requestError is a 400 with its own error.code: input that decode refuses
// before the sale logic runs.
type requestError struct {
	code    string
	message string
}

func (e *requestError) Error() string { return e.message }

func badRequest(code, message string) error {
	return &requestError{code: code, message: message}
}

// callerErrors maps each refusal of the caller's key to its status and
// code; the message is the error's text.
var callerErrors = []struct {
	err    error
	status int
	code   string
}{
	{errNoKey, http.StatusUnauthorized, "unauthenticated"},
	{errNoScope, http.StatusForbidden, "forbidden"},
	{errNoPlatform, http.StatusForbidden, "forbidden"},
	{errNoOwner, http.StatusForbidden, "forbidden"},
}

// saleErrors maps each error of the sale logic to its status and code.
var saleErrors = []struct {
	err    error
	status int
	code   string
}{
	{sales.ErrNotFound, http.StatusNotFound, "not_found"},
	{sales.ErrAlreadySoldToThisOrder, http.StatusConflict, "item_already_sold"}, // before ErrAlreadySold, which it wraps
	{sales.ErrAlreadySold, http.StatusConflict, "item_already_sold"},
	{sales.ErrNotAvailable, http.StatusConflict, "item_not_available"},
	{sales.ErrNotCancelable, http.StatusConflict, "sale_not_cancelable"},
	{sales.ErrIdempotencyConflict, http.StatusConflict, "idempotency_conflict"},
	{sales.ErrInProgress, http.StatusConflict, "request_in_progress"},
}

// replayedRefusalNote ends the message of a refusal answered again to its
// key: the item may have changed since, and the platform that still means
// the sale must know that this key will not try again.
const replayedRefusalNote = " (the answer given before to this Idempotency-Key, which keeps it: " +
	"to try again, send the call with a new key)"

// errorAnswer is what the writer sends for an error: status, code, message,
// and, for a call that failed, what its message says of the sale (applied;
// the zero saleClaim where it says nothing of it).
type errorAnswer struct {
	status  int
	code    string
	message string
	applied saleClaim
}

// saleClaim is what a failed call's answer says of the sale: the words its
// message says it in (said), which the drill reads from the answer
// (salescheck.SaysNothingApplied), and the value its access line and span
// record as sale_applied (note), for the SRE who traces its request id.
// The two are kept together here so that no message can say one and its
// line the other. The README's "What each answer of a sale says was
// applied" lists every answer's claim, the gateway's included.
type saleClaim struct{ said, note string }

var (
	nothingApplied     = saleClaim{said: saleclaim.NothingApplied, note: saleclaim.Nothing}
	mayHaveBeenApplied = saleClaim{said: saleclaim.MayHaveBeenApplied, note: saleclaim.Maybe}
)

// logged is the claim as a failure's log line says it. Where the sale may
// have been applied, the line also says how that is settled; after
// "nothing was applied" that note read as the line contradicting itself.
func (c saleClaim) logged() string {
	if c.note == saleclaim.Maybe {
		return c.said + "; a retry with the same Idempotency-Key replays it if so"
	}
	return c.said
}

// saleAppliedKey names the claim on the access line and span (app.sale_applied).
const saleAppliedKey = saleclaim.Key

// writeError is the one place where an error becomes an HTTP answer; it
// returns the error code it sent. A refusal (4xx) is answered as decided;
// a failure (5xx, 499) is logged here, once, its cause never sent.
func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error) string {
	a, refused := refusal(err)
	if !refused {
		a = h.failure(r, err)
	}
	if sales.IsReplayedRefusal(err) {
		httpserver.AnnotateFlag(w, r, "idempotent_replay")
	}
	if a.applied.note != "" {
		httpserver.Annotate(w, r, saleAppliedKey, a.applied.note)
	}
	envelope.WriteError(w, a.status, a.code, a.message, httpserver.RequestID(r))
	return a.code
}

// refusal is the answer to a call refused as sent (its input, its key,
// its body) or for the state of its item or sale, and whether err is one.
func refusal(err error) (errorAnswer, bool) {
	var re *requestError
	if errors.As(err, &re) {
		return errorAnswer{status: http.StatusBadRequest, code: re.code, message: re.message}, true
	}
	for _, m := range callerErrors {
		if errors.Is(err, m.err) {
			return errorAnswer{status: m.status, code: m.code, message: m.err.Error()}, true
		}
	}
	if errors.Is(err, httpserver.ErrBodyTooLarge) {
		return errorAnswer{status: http.StatusRequestEntityTooLarge, code: "payload_too_large",
			message: fmt.Sprintf("the body must be at most %d bytes", maxBodyBytes)}, true
	}
	if errors.Is(err, httpserver.ErrBodyAbandoned) {
		// The caller closed the connection before its body was whole:
		// nothing was applied, and no one reads this answer (499, as for a
		// caller that leaves while the sale runs; a 400 counted it as a
		// bad request).
		return errorAnswer{status: httpserver.StatusClientClosed, code: httpserver.CodeClientClosed,
			message: "the caller closed the request before sending its body whole; " + nothingApplied.said, applied: nothingApplied}, true
	}
	for _, m := range saleErrors {
		if errors.Is(err, m.err) {
			message := m.err.Error()
			if sales.IsReplayedRefusal(err) {
				message += replayedRefusalNote
			}
			return errorAnswer{status: m.status, code: m.code, message: message}, true
		}
	}
	return errorAnswer{}, false
}

// failure answers a call that failed: the database out of reach or
// refusing it, its time run out, the drain or its caller ending it, or a
// cause nobody foresaw. It logs the cause once.
func (h *handler) failure(r *http.Request, err error) errorAnswer {
	switch {
	case queryTimeoutRanOut(err):
		return h.timedOut(r, err)
	case httpserver.CutOff(r, err):
		return h.cutOff(r, err)
	case httpserver.CallerGone(r, err):
		return h.abandoned(r, err)
	case errors.Is(err, sales.ErrCommitUnconfirmed):
		return h.unconfirmed(r, err)
	case postgres.Unreachable(err):
		return h.unreachable(r, err)
	case postgres.Unavailable(err):
		return h.unavailable(r, err)
	}
	// Spec 7's 500: a temporary error, retried with backoff and reported
	// by its request id. The answer says how to retry it safely, as every
	// 503 does, and that nothing was applied where nothing ran or
	// PostgreSQL answered an ERROR, which rolls back the transaction the
	// call's statements and commit share (as unavailable's).
	h.log.ErrorContext(r.Context(), "sale call failed", "error", err)
	if postgres.NothingDone(err) || postgres.RolledBack(err) {
		return errorAnswer{status: http.StatusInternalServerError, code: "internal_error", message: internalErrorNothingApplied, applied: nothingApplied}
	}
	return errorAnswer{status: http.StatusInternalServerError, code: "internal_error", message: InternalErrorMessage, applied: mayHaveBeenApplied}
}

// queryTimeoutRanOut reports whether SALES_WRITER_QUERY_TIMEOUT ran out: PostgreSQL
// cancelled the statement (QueryCanceled; not an operator's cancel,
// errCanceledEarly), or the call's own deadline ended it. Only that
// deadline ends in DeadlineExceeded (a hang-up first would have made it
// Canceled), so it is the timeout even if the caller has left since.
func queryTimeoutRanOut(err error) bool {
	return postgres.QueryCanceled(err) && !errors.Is(err, errCanceledEarly) || errors.Is(err, context.DeadlineExceeded)
}

// timedOut answers a call whose SALES_WRITER_QUERY_TIMEOUT ran out. A
// retry with the key settles it whatever happened.
func (h *handler) timedOut(r *http.Request, err error) errorAnswer {
	switch {
	case postgres.NothingDone(err):
		// The deadline came before any statement ran: the call waited
		// for a pool connection while every one was in use, the pool
		// full or refused one more for want of a slot on the server
		// (postgres.AcquireError; the error says so), met the deadline
		// in pgx before a byte went out, or while PostgreSQL prepared
		// its batch (held up by a lock on a table, as a migration's),
		// before pgx sends a statement to run.
		h.log.ErrorContext(r.Context(), "sale call timed out before any statement of it ran (SALES_WRITER_QUERY_TIMEOUT): nothing was applied", "error", err)
		return answer503("the sale store did not answer in time", nothingApplied)
	case postgres.QueryCanceled(err):
		// PostgreSQL's own statement_timeout cancelled the statement: an
		// error answered for a statement rolls back the transaction it
		// runs in (the call's statements and their commit share one), and
		// the timeout ends before the commit starts. A sales platform
		// need not reconcile.
		h.log.ErrorContext(r.Context(), "sale call timed out in the database (SALES_WRITER_QUERY_TIMEOUT) and was rolled back: an item locked by a long transaction, or the database overloaded", "error", err)
		return answer503("the sale store did not answer in time and rolled the sale back", nothingApplied)
	}
	// The server did not answer within the grace after the timeout: a
	// commit may have raced the end, or waited for a synchronous standby
	// (statement_timeout does not cut that wait, and pg_stat_activity
	// shows it as wait_event SyncRep); or, behind a pooler, the call
	// waited in its queue for a server connection, which the writer cannot
	// tell from a statement sent.
	h.log.ErrorContext(r.Context(), "sale call timed out in the database (SALES_WRITER_QUERY_TIMEOUT): an item locked by a long transaction, "+
		"a commit waiting for a synchronous standby (wait_event SyncRep), the database overloaded, "+
		"or, behind a pooler, no server connection free (PgBouncer's SHOW POOLS: cl_waiting)", "error", err)
	return answer503("the sale store did not answer in time", mayHaveBeenApplied)
}

// cutOff answers a call the shutdown's drain ran out of time for and
// cancelled: the writer's doing, not its caller's (503, not 499). No one
// reads the answer (the gateway sees the connection close), but the log
// line and the span say whether a statement may have committed.
func (h *handler) cutOff(r *http.Request, err error) errorAnswer {
	claim := applied(err)
	h.log.WarnContext(r.Context(), "sale call cut off: the shutdown's drain timed out; "+claim.logged(), "error", err)
	return answer503("the sale writer is shutting down", claim)
}

// abandoned answers a call whose caller (the gateway, past its upstream
// timeout) hung up: 499, as nginx names a request its client closed, so
// that the log, the metrics and the span do not report a failure; they
// say whether a statement may have committed. No one reads the answer.
func (h *handler) abandoned(r *http.Request, err error) errorAnswer {
	claim := applied(err)
	h.log.InfoContext(r.Context(), "sale call abandoned by the caller: "+claim.logged(), "error", err)
	return errorAnswer{status: httpserver.StatusClientClosed, code: httpserver.CodeClientClosed,
		message: "the caller closed the request; " + claim.said, applied: claim}
}

// unconfirmed answers a call whose commit group's commit was reached by a
// cancel request (another call of the group left it in flight) and ended
// without an ERROR but with a WARNING: committed, perhaps not on a
// synchronous standby.
func (h *handler) unconfirmed(r *http.Request, err error) errorAnswer {
	h.log.WarnContext(r.Context(), "sale call's commit unconfirmed: another call of its commit group left it in flight", "error", err)
	return answer503("the sale store could not confirm the commit", mayHaveBeenApplied)
}

// unreachable answers an outage, not a bug. The connection may have
// broken after the commit, so the answer says how to find out safely;
// unless it was never opened (refused by the system, or no connection
// slot left), or PostgreSQL ended the session before its commit
// (postgres.Terminated: pg_terminate_backend on a call waiting for a
// lock, a fast shutdown; true of the writer's batches, each one implicit
// transaction committed at its Sync), when nothing was applied: "may have
// been" sent a sales platform reconciling for nothing.
func (h *handler) unreachable(r *http.Request, err error) errorAnswer {
	if postgres.Terminated(err) {
		h.log.ErrorContext(r.Context(), "sale store ended the call's session before its commit: "+nothingApplied.logged(), "error", err, postgres.CauseAttr(err))
		return answer503("the sale store ended the call's session before its commit", nothingApplied)
	}
	h.log.ErrorContext(r.Context(), "sale store unreachable", "error", err, postgres.CauseAttr(err))
	return answer503("the sale store is unreachable", applied(err))
}

// unavailable answers PostgreSQL saying it cannot do the work now, having
// rolled it back: read-only (a failover sent the writer to a standby, or
// the primary is fenced), out of connections or disk, a deadlock, or a
// statement cancelled before the query timeout (errCanceledEarly); or it
// refused a new connection (a password changed, the database renamed) or
// failed in its own storage, which the operator puts right (cause says
// how). The answer says nothing was applied where no statement was sent
// (a new connection refused) or PostgreSQL answered the one sent with an
// ERROR, which rolls back the transaction the call's statements and commit
// share (postgres.RolledBack; the call's earlier runs changed nothing); a
// FATAL may come after the commit, and the answer says nothing of the
// sale. It still says how to settle it with the key, as every 503 of the
// writer does.
func (h *handler) unavailable(r *http.Request, err error) errorAnswer {
	h.log.ErrorContext(r.Context(), "sale store unavailable", "error", err, postgres.CauseAttr(err))
	if postgres.NothingDone(err) || postgres.RolledBack(err) {
		return answer503("the sale store cannot take this call now", nothingApplied)
	}
	return answer503("the sale store cannot take this call now", saleClaim{})
}

// answer503 is the writer's 503: what happened (situation), what it says
// of the sale (claim, or nothing: the zero saleClaim), and the retry under
// the same key that settles it whatever happened.
func answer503(situation string, claim saleClaim) errorAnswer {
	message := situation + "; " + retryWithTheKey
	if claim.said != "" {
		message = situation + "; " + claim.said + ": " + retryWithTheKey
	}
	return errorAnswer{status: http.StatusServiceUnavailable, code: "unavailable", message: message, applied: claim}
}

// retryWithTheKey ends the message of every 503 of the writer.
const retryWithTheKey = saleclaim.RetryWithTheKey

// InternalErrorMessage is the message of every 500 of the writer, a failure
// nobody foresaw or a handler's panic (httpserver.Config.PanicMessage):
// spec 7's 500 is retried with backoff and reported by its request id, and
// as the platform cannot know whether the sale was applied, it says how to
// retry it safely, as every 503 of the writer does.
const InternalErrorMessage = saleclaim.InternalMayHaveBeenApplied

// PanicNotes are what the access line and span of a panic's 500
// (httpserver.Config.PanicNotes) record of the sale: what
// InternalErrorMessage says, as for a failure's 500. They and the message
// answer a panic outside a sale call's handler; within it, panicAnswer.
var PanicNotes = map[string]string{saleAppliedKey: mayHaveBeenApplied.note}

// internalErrorNothingApplied is InternalErrorMessage for a call that
// applied nothing: the gateway's words for its own panic before a sale
// went upstream (both from saleclaim).
const internalErrorNothingApplied = saleclaim.InternalNothingApplied

var panicNothingAppliedNotes = map[string]string{saleAppliedKey: nothingApplied.note}

// panicAnswer is the 500 of a panic in a sale call
// (httpserver.AnswerPanicWith), its message and its line's notes: nothing
// was applied while the call had not been given a connection (sent: no
// statement of it can have reached PostgreSQL; a panic in decoding, or in
// the sale logic before its first statement), else the sale may have
// been applied (a panic after the commit, encoding the answer, leaves it
// applied).
func panicAnswer(sent *postgres.Sent) (string, map[string]string) {
	if sent.Nothing() {
		return internalErrorNothingApplied, panicNothingAppliedNotes
	}
	return InternalErrorMessage, PanicNotes
}

// applied is what a call that ended before its answer did to the sale:
// when no statement ran (postgres.NothingDone: no connection opened or
// taken from the pool, pgx stopped before a byte went out, or the batch
// ended while PostgreSQL prepared it), nothing; else the sale may have
// been applied (a statement cut off, or a connection lost, after the
// commit).
func applied(err error) saleClaim {
	if postgres.NothingDone(err) {
		return nothingApplied
	}
	return mayHaveBeenApplied
}
