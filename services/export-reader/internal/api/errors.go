package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/services/export-reader/internal/export"
)

// fail is the service's one error-to-HTTP mapping. Only unexpected errors
// are logged, once, here; their bodies say "internal error" and carry the
// request id.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	requestID := httpserver.RequestID(r)
	var pe *paramError
	switch {
	case errors.As(err, &pe):
		envelope.WriteError(w, http.StatusBadRequest, pe.Code, pe.Message, requestID)
	case errors.Is(err, export.ErrInvalidCursor):
		envelope.WriteError(w, http.StatusBadRequest, "invalid_cursor",
			"cursor is invalid or belongs to another query; pass meta.next_cursor unchanged with the same status and updated_after", requestID)
	case errors.Is(err, export.ErrNotFound):
		// The same body for a missing item and another owner's item.
		envelope.WriteError(w, http.StatusNotFound, "not_found", "export item not found", requestID)
	case errors.Is(err, errNoKey):
		envelope.WriteError(w, http.StatusUnauthorized, "unauthenticated", "an API key is required", requestID)
	case errors.Is(err, errNoScope):
		envelope.WriteError(w, http.StatusForbidden, "forbidden", "the API key lacks the export:read scope", requestID)
	case errors.Is(err, context.DeadlineExceeded):
		a.log.ErrorContext(r.Context(), "export read timed out", "err", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the export store did not answer in time; retry with backoff", requestID)
	case httpserver.CallerGone(r, err):
		// The caller (the gateway, after UPSTREAM_READ_TIMEOUT) went away:
		// nobody reads this answer, and it is no failure of the reader's.
		a.log.InfoContext(r.Context(), "client canceled", "err", err)
		envelope.WriteError(w, httpserver.StatusClientClosed, httpserver.CodeClientClosed, "the caller closed the request", requestID)
	case postgres.Unreachable(err):
		// An outage, not a bug: the client retries, and the on-call
		// engineer looks at PostgreSQL rather than at this code.
		a.log.ErrorContext(r.Context(), "export store unreachable", "err", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the export store is unreachable; retry with backoff", requestID)
	default:
		a.log.ErrorContext(r.Context(), "export read failed", "err", err)
		envelope.WriteError(w, http.StatusInternalServerError, "internal_error", "internal error", requestID)
	}
}
