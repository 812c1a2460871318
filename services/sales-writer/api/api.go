// Package api is the HTTP face of the sales writer: the two routes of spec
// 4.5 and 4.6, the validation of their input, and the one mapping of errors
// to statuses and error codes.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/prometheus/client_golang/prometheus"
)

// Writer executes validated sale calls; *sales.Writer is the real one.
type Writer interface {
	Execute(ctx context.Context, req sales.Request) (sales.Result, error)
}

// Routes registers every route of the service on mux and its outcome counter
// on reg. queryTimeout is the pool's statement_timeout
// (postgres.StatementTimeout): a statement that waits longer (its item
// locked by a long transaction, the database overloaded) is rolled back by
// PostgreSQL and the call answered 503 well before the gateway's
// UPSTREAM_READ_TIMEOUT, instead of holding its caller, and the gateway's
// repeat of it to another instance, for the whole of both. The timeout
// counts per statement, and a call runs a few (the key's lock, the sale,
// perhaps an explanation and a run again), so the call's context ends
// queryTimeoutGrace past one timeout: a call waiting statement after
// statement, or on a server that does not answer, ends there, answered
// the same 503 (the sale may then have been applied).
func Routes(mux *http.ServeMux, writer Writer, log *slog.Logger, reg prometheus.Registerer, queryTimeout time.Duration) {
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sales_writer_outcomes_total",
		Help: "Sale calls by operation and outcome: executed; replayed (a 200 answered again to its Idempotency-Key); " +
			"replayed_refusal (a 404 or 409 answered again to its Idempotency-Key); or the error code of a refusal or failure decided by this call.",
	}, []string{"operation", "outcome"})
	reg.MustRegister(outcomes)
	h := &handler{writer: writer, log: log, outcomes: outcomes, queryTimeout: queryTimeout}
	mux.HandleFunc("POST /v1/export/items/{item_id}/sales/confirm", h.serve(sales.Confirm))
	mux.HandleFunc("POST /v1/export/items/{item_id}/sales/cancel", h.serve(sales.Cancel))
}

// queryTimeoutGrace is how long past the statement timeout a call waits
// for PostgreSQL's own cancel before it gives up on the server.
const queryTimeoutGrace = 2 * time.Second

// CallBound is the longest a sale call runs once its request is read: the
// statement timeout and the grace past it (see Routes).
func CallBound(queryTimeout time.Duration) time.Duration { return queryTimeout + queryTimeoutGrace }

// errCanceledEarly marks PostgreSQL's cancel of a statement (57014, which
// a statement_timeout's and an operator's pg_cancel_backend share) in a
// call that has not yet run for queryTimeout, so no statement of it can
// have run into SALES_WRITER_QUERY_TIMEOUT: another session cancelled it,
// or DATABASE_URL sets a shorter statement_timeout. writeError then says
// what PostgreSQL refused, not that the timeout ran out.
var errCanceledEarly = errors.New("cancelled in the database before SALES_WRITER_QUERY_TIMEOUT")

// canceledEarly reports whether err is PostgreSQL's cancel of a statement
// in a call that has not run for queryTimeout yet: ctx, which ends
// queryTimeoutGrace past that, has more than the grace left. Read on the
// error path only, it costs the common path no clock reading.
func canceledEarly(ctx context.Context, err error) bool {
	deadline, _ := ctx.Deadline()
	return postgres.QueryCanceled(err) && time.Until(deadline) > queryTimeoutGrace
}

type handler struct {
	writer       Writer
	log          *slog.Logger
	outcomes     *prometheus.CounterVec
	queryTimeout time.Duration
}

// serve decodes and validates the call, executes it and encodes the result.
func (h *handler) serve(op sales.Operation) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// A panic's 500 says what was applied, as every 5xx of a sale
		// does: nothing until the call is given a connection (sent).
		callCtx, sent := postgres.TrackSent(r.Context())
		httpserver.AnswerPanicWith(w, func() (string, map[string]string) { return panicAnswer(sent) })
		// A platform's support quotes a request id; what it must reconcile
		// is the item and the order, and which call a key was bound to:
		// each is in the access line and the span as soon as it is read,
		// so a refused call names them too (decode adds the key).
		httpserver.AnnotateClientValue(w, r, "item_id", r.PathValue("item_id"))
		req, err := decode(w, r, op)
		if err != nil {
			h.countOutcome(op, err, h.writeError(w, r, err))
			return
		}
		httpserver.AnnotateClientValue(w, r, "external_order_id", req.ExternalOrderID)
		res, err := h.execute(callCtx, req)
		if err != nil {
			h.countOutcome(op, err, h.writeError(w, r, err))
			return
		}
		// One owner's sale: no cache may keep it, nor replay it to another.
		w.Header().Set("Cache-Control", envelope.PrivateCacheControl)
		envelope.WriteDataJSON(w, http.StatusOK, res.AppendJSON, envelope.Meta{RequestID: httpserver.RequestID(r)})
		outcome := outcomeExecuted
		if res.IdempotentReplay {
			// A replayed 200 reads like a fresh one everywhere else.
			httpserver.AnnotateFlag(w, r, "idempotent_replay")
			outcome = outcomeReplayed
		}
		h.outcomes.WithLabelValues(string(op), outcome).Inc()
	}
}

// execute runs the sale call within its deadline, queryTimeoutGrace past
// the statement timeout (see Routes), and marks PostgreSQL's cancel of a
// statement that came before that timeout could have run out
// (errCanceledEarly), for writeError.
func (h *handler) execute(ctx context.Context, req sales.Request) (sales.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, CallBound(h.queryTimeout))
	defer cancel()
	res, err := h.writer.Execute(ctx, req)
	if err != nil && canceledEarly(ctx, err) {
		err = fmt.Errorf("%w: %w", errCanceledEarly, err)
	}
	return res, err
}

// The outcomes of sales_writer_outcomes_total other than an error code.
const (
	outcomeExecuted = "executed"
	outcomeReplayed = "replayed"
	// outcomeReplayedRefusal is a 404 or 409 answered again to its key's
	// identical request. Counted under its code, a platform's retries of
	// one refused call read as refusals decided again, each one.
	outcomeReplayedRefusal = "replayed_refusal"
)

// countOutcome counts a call answered err, whose error code was code.
func (h *handler) countOutcome(op sales.Operation, err error, code string) {
	if sales.IsReplayedRefusal(err) {
		code = outcomeReplayedRefusal
	}
	h.outcomes.WithLabelValues(string(op), code).Inc()
}
