// Package api is the HTTP face of the sales writer: the two routes of spec
// 4.5 and 4.6, the validation of their input, and the one mapping of errors
// to statuses and error codes.
package api

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/services/sales-writer/sales"
)

// Writer executes validated sale calls; *sales.Writer is the real one.
type Writer interface {
	Execute(ctx context.Context, req sales.Request) (sales.Result, error)
}

// Routes registers every route of the service on mux.
func Routes(mux *http.ServeMux, writer Writer, log *slog.Logger) {
	h := &handler{writer: writer, log: log}
	mux.HandleFunc("POST /v1/export/items/{item_id}/sales/confirm", h.serve(sales.Confirm))
	mux.HandleFunc("POST /v1/export/items/{item_id}/sales/cancel", h.serve(sales.Cancel))
}

type handler struct {
	writer Writer
	log    *slog.Logger
}

// serve decodes and validates the call, executes it and encodes the result.
func (h *handler) serve(op sales.Operation) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, err := decode(w, r, op)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		res, err := h.writer.Execute(r.Context(), req)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		envelope.WriteData(w, http.StatusOK, res, envelope.Meta{RequestID: httpserver.RequestID(r)})
	}
}
