package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/services/export-reader/internal/export"
	"github.com/coinexport/export/services/export-reader/internal/replica"
)

// fail is the service's one error-to-HTTP mapping (a client's 4xx:
// refused). What on-call must see is logged here, once: a 503's cause
// (the store out of reach or refusing, a timeout, the barrier giving up, a
// read cut off by the drain), a hang-up at INFO, and any unexpected error,
// whose body says only "internal error" with the request id. A client's
// 4xx is not logged (the access line has it) but for a run of cursors
// refused on their signature (warnCursorSignature), nor is a lagging
// replica's 503 (the monitor logs its crossings).
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	requestID := httpserver.RequestID(r)
	if a.refused(w, r, err, requestID) {
		return
	}
	switch {
	case errors.Is(err, catalog.ErrSyncBusy):
		// A writer of the owner's items stuck in flight (catalog's
		// barrier.go): not the reader's fault, and over once it ends.
		a.log.WarnContext(r.Context(), "sync barrier gave up: a write of the owner's items is still in flight", "error", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
			"a change to this catalog is still being written; retry this page with backoff", requestID)
	case errors.Is(err, replica.ErrBehind):
		// Not logged per page: the monitor logs when the lag crosses
		// READ_MAX_LAG and when it is back under it. The access line and
		// span say it, as no line of this request id would.
		httpserver.AnnotateFlag(w, r, "read_replica_behind")
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
			"the read replica is behind its primary; retry this page (the same cursor) later", requestID)
	case errors.Is(err, context.DeadlineExceeded):
		a.log.ErrorContext(r.Context(), "export read timed out", "error", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the export store did not answer in time; retry with backoff", requestID)
	case httpserver.CutOff(r, err):
		// The drain ran out of time and cut this read off: the reader's
		// doing, not its caller's (no one reads the answer; the gateway
		// sees the connection close).
		a.log.WarnContext(r.Context(), "export read cut off: the shutdown's drain timed out", "error", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the reader is shutting down; retry with backoff", requestID)
	case httpserver.CallerGone(r, err):
		// The caller (the gateway, after UPSTREAM_READ_TIMEOUT) went away:
		// nobody reads this answer, and it is no failure of the reader's.
		a.log.InfoContext(r.Context(), "client canceled", "error", err)
		envelope.WriteError(w, httpserver.StatusClientClosed, httpserver.CodeClientClosed, "the caller closed the request", requestID)
	case postgres.Unreachable(err):
		// An outage, not a bug: the client retries, and the on-call
		// engineer looks at PostgreSQL rather than at this code.
		a.log.ErrorContext(r.Context(), "export store unreachable", "error", err, postgres.CauseAttrOf(err, a.dsnSetting))
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the export store is unreachable; retry with backoff", requestID)
	case postgres.Unavailable(err):
		// PostgreSQL answered that it cannot do the read now: on a
		// replica (READ_DATABASE_URL) most often a query cancelled by
		// its conflict with the replay of the primary's changes; also an
		// overloaded server or an operator's cancel; or it refused a new
		// connection (a password changed, the database renamed) or failed
		// in its own storage, which the operator puts right (cause says
		// how). The same read retried passes then.
		a.log.ErrorContext(r.Context(), "export store unavailable", "error", err, postgres.CauseAttrOf(err, a.dsnSetting))
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the export store cannot serve this read now; retry with backoff", requestID)
	default:
		a.log.ErrorContext(r.Context(), "export read failed", "error", err)
		envelope.WriteError(w, http.StatusInternalServerError, "internal_error", "internal error", requestID)
	}
}

// refused answers err if it is the client's to fix (a 4xx), and reports
// whether it was.
func (a *API) refused(w http.ResponseWriter, r *http.Request, err error, requestID string) bool {
	var pe *paramError
	switch {
	case errors.As(err, &pe):
		envelope.WriteError(w, http.StatusBadRequest, pe.Code, pe.Message, requestID)
	case errors.Is(err, export.ErrInvalidCursor):
		if errors.Is(err, export.ErrCursorSignature) {
			a.warnCursorSignature(r)
		}
		envelope.WriteError(w, http.StatusBadRequest, "invalid_cursor",
			"cursor is invalid or belongs to another query; pass meta.next_cursor unchanged with the same status and updated_after", requestID)
	case errors.Is(err, export.ErrNotFound):
		// The same body for a missing item and another owner's item.
		envelope.WriteError(w, http.StatusNotFound, "not_found", "export item not found", requestID)
	case errors.Is(err, errNoKey):
		envelope.WriteError(w, http.StatusUnauthorized, "unauthenticated", "an API key is required", requestID)
	case errors.Is(err, errNoScope):
		envelope.WriteError(w, http.StatusForbidden, "forbidden", "the API key lacks the export:read scope", requestID)
	default:
		return false
	}
	return true
}

// warnCursorSignature says, at most once per interval, that a well-formed
// cursor failed its signature. A client that changed its filters or owner
// mid-sync does that too, but a run of them is the mark of readers signing
// with different CURSOR_SECRETs (a rotation done in one step instead of
// two), which answers every sync moved between them 400 invalid_cursor
// while every health check is green.
func (a *API) warnCursorSignature(r *http.Request) {
	if ok, skipped := a.signatureLog.Allow("cursor signature"); ok {
		a.log.WarnContext(r.Context(), "cursor refused: its signature does not match CURSOR_SECRET nor CURSOR_SECRET_PREVIOUS: "+
			"a client sent it with other filters or for another owner, or another reader signed it with another secret "+
			"(every reader must accept every secret in use; see the README's rotation)", "skipped_since_last", skipped)
	}
}
