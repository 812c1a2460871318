package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
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

// writeError is the one place where an error becomes an HTTP answer; it
// returns the error code it sent. Anything unknown is a 500 whose real cause
// is logged here, once, and never sent.
func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error) string {
	requestID := httpserver.RequestID(r)
	var re *requestError
	if errors.As(err, &re) {
		envelope.WriteError(w, http.StatusBadRequest, re.code, re.message, requestID)
		return re.code
	}
	for _, m := range callerErrors {
		if errors.Is(err, m.err) {
			envelope.WriteError(w, m.status, m.code, m.err.Error(), requestID)
			return m.code
		}
	}
	if errors.Is(err, httpserver.ErrBodyTooLarge) {
		const code = "payload_too_large"
		envelope.WriteError(w, http.StatusRequestEntityTooLarge, code,
			fmt.Sprintf("the body must be at most %d bytes", maxBodyBytes), requestID)
		return code
	}
	if errors.Is(err, httpserver.ErrBodyAbandoned) {
		// The caller closed the connection before its body was whole:
		// nothing was applied, and no one reads this answer (499, as for a
		// caller that leaves while the sale runs; a 400 counted it as a
		// bad request).
		envelope.WriteError(w, httpserver.StatusClientClosed, httpserver.CodeClientClosed,
			"the caller closed the request before sending its body whole; nothing was applied", requestID)
		return httpserver.CodeClientClosed
	}
	for _, m := range saleErrors {
		if errors.Is(err, m.err) {
			message := m.err.Error()
			if sales.IsReplayedRefusal(err) {
				httpserver.AnnotateFlag(w, r, "idempotent_replay")
				message += replayedRefusalNote
			}
			envelope.WriteError(w, m.status, m.code, message, requestID)
			return m.code
		}
	}
	if postgres.QueryCanceled(err) && !errors.Is(err, errCanceledEarly) || errors.Is(err, context.DeadlineExceeded) {
		// SALES_WRITER_QUERY_TIMEOUT ran out: PostgreSQL cancelled the
		// statement and rolled it back (QueryCanceled), or the server did
		// not answer within the grace after it, when a commit may have
		// raced the end. A retry with the key settles it either way.
		// Only the call's own deadline ends in DeadlineExceeded (a
		// hang-up first would have made it Canceled), so it is the
		// timeout even if the caller has left since.
		if postgres.NothingSent(err) {
			// The deadline came before any statement was sent: the
			// call waited for a pool connection while every one was in
			// use (postgres.AcquireError; the error says so), or it met
			// the deadline in pgx before a byte went out.
			h.log.ErrorContext(r.Context(), "sale call timed out before reaching the database (SALES_WRITER_QUERY_TIMEOUT): nothing was applied", "error", err)
			envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
				"the sale store did not answer in time; nothing was applied: retry with backoff and the same Idempotency-Key", requestID)
			return "unavailable"
		}
		if postgres.QueryCanceled(err) {
			// PostgreSQL's own statement_timeout cancelled the statement:
			// an error answered for a statement rolls back the
			// transaction it runs in (the call's statements and their
			// commit share one), and the timeout ends before the commit
			// starts. A sales platform need not reconcile.
			h.log.ErrorContext(r.Context(), "sale call timed out in the database (SALES_WRITER_QUERY_TIMEOUT) and was rolled back: an item locked by a long transaction, or the database overloaded", "error", err)
			envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
				"the sale store did not answer in time and rolled the sale back; nothing was applied: retry with backoff and the same Idempotency-Key", requestID)
			return "unavailable"
		}
		h.log.ErrorContext(r.Context(), "sale call timed out in the database (SALES_WRITER_QUERY_TIMEOUT): an item locked by a long transaction, or the database overloaded", "error", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
			"the sale store did not answer in time; the sale may have been applied: retry with backoff and the same Idempotency-Key", requestID)
		return "unavailable"
	}
	if httpserver.CutOff(r, err) {
		// The drain ran out of time and cut this call off: the writer's
		// doing, not its caller's. The statement either was cancelled or
		// committed; no one reads this answer (the gateway sees the
		// connection close).
		h.log.WarnContext(r.Context(), "sale call cut off: the shutdown's drain timed out; it may have been applied", "error", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
			"the sale writer is shutting down; the sale may have been applied: retry with backoff and the same Idempotency-Key", requestID)
		return "unavailable"
	}
	if httpserver.CallerGone(r, err) {
		// The caller (the gateway, past its upstream timeout) hung up. The
		// statement either was cancelled or committed: the log, the metrics
		// and the span say so rather than report a failure (499, as nginx
		// names a request its client closed; no one reads the answer).
		h.log.InfoContext(r.Context(), "sale call abandoned by the caller: it may have been applied; a retry with the same Idempotency-Key replays it if so", "error", err)
		envelope.WriteError(w, httpserver.StatusClientClosed, httpserver.CodeClientClosed, "the caller closed the request; the sale may have been applied", requestID)
		return httpserver.CodeClientClosed
	}
	if postgres.Unreachable(err) {
		// An outage, not a bug. The connection may have broken after the
		// commit, so the answer says how to find out safely; unless it was
		// never opened (refused by the system, or no connection slot
		// left), when nothing was applied: "may have been" sent a sales
		// platform reconciling for nothing.
		h.log.ErrorContext(r.Context(), "sale store unreachable", "error", err, postgres.CauseAttr(err))
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
			"the sale store is unreachable; "+applied(err)+": retry with backoff and the same Idempotency-Key", requestID)
		return "unavailable"
	}
	if postgres.Unavailable(err) {
		// PostgreSQL answered that it cannot do the work now and rolled
		// it back: read-only (a failover sent the writer to a standby, or
		// the primary is fenced), out of connections or disk, a deadlock,
		// or a statement cancelled before the query timeout
		// (errCanceledEarly); or it refused a new connection (a password
		// changed, the database renamed) or failed in its own storage,
		// which the operator puts right (cause says how). Nothing was
		// applied; the answer says so where no statement was sent (a new
		// connection refused), and still says how to settle it with the
		// key, as every 503 of the writer does.
		h.log.ErrorContext(r.Context(), "sale store unavailable", "error", err, postgres.CauseAttr(err))
		message := "the sale store cannot take this call now; retry with backoff and the same Idempotency-Key"
		if postgres.NothingSent(err) || postgres.QueryCanceled(err) {
			// No statement reached PostgreSQL, or one did and an operator
			// cancelled it, which rolls back its transaction.
			message = "the sale store cannot take this call now; nothing was applied: retry with backoff and the same Idempotency-Key"
		}
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", message, requestID)
		return "unavailable"
	}
	// Spec 7's 500: a temporary error, retried with backoff and reported
	// by its request id. Whether the sale was applied is not known here,
	// so the answer says how to retry it safely, as every 503 does.
	h.log.ErrorContext(r.Context(), "sale call failed", "error", err)
	envelope.WriteError(w, http.StatusInternalServerError, "internal_error", InternalErrorMessage, requestID)
	return "internal_error"
}

// InternalErrorMessage is the message of every 500 of the writer, a failure
// nobody foresaw or a handler's panic (httpserver.Config.PanicMessage):
// spec 7's 500 is retried with backoff and reported by its request id, and
// as the platform cannot know whether the sale was applied, it says how to
// retry it safely, as every 503 of the writer does.
const InternalErrorMessage = "internal error; the sale may have been applied: retry with backoff and the same Idempotency-Key, and quote meta.request_id if it persists"

// applied says what a call that failed for want of the database did: when
// no statement reached it (postgres.NothingSent), nothing; else the sale
// may have been applied (a connection lost after the commit).
func applied(err error) string {
	if postgres.NothingSent(err) {
		return "nothing was applied"
	}
	return "the sale may have been applied"
}
