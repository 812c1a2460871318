package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"

	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
	"github.com/coinexport/export/services/shop-schema/internal/shoplimit"
	"github.com/coinexport/export/services/shop-schema/internal/shopschema"
)

// shopStatus maps each kind of shop failure to its HTTP status; its error
// code is the kind's (prestashop.Kind.Code), which also names the failure
// in the shop request's span. Problems the caller can fix (the key, the
// address) are 400, as spec 4.2 lists; the shop misbehaving is 502, or 504
// when it is too slow.
var shopStatus = map[prestashop.Kind]int{
	prestashop.KindUnauthorized: http.StatusBadRequest,
	prestashop.KindForbidden:    http.StatusBadRequest,
	prestashop.KindNotAllowed:   http.StatusBadRequest,
	prestashop.KindUnreachable:  http.StatusBadGateway,
	prestashop.KindTLS:          http.StatusBadGateway,
	prestashop.KindTimeout:      http.StatusGatewayTimeout,
	prestashop.KindBadResponse:  http.StatusBadGateway,
	prestashop.KindTooLarge:     http.StatusBadGateway,
	prestashop.KindDisabled:     http.StatusBadGateway,
	prestashop.KindUnavailable:  http.StatusBadGateway,
	prestashop.KindNotFound:     http.StatusBadGateway,
	prestashop.KindNotShopRoot:  http.StatusBadRequest,
}

// writeError is the service's one error-to-HTTP mapper (a call refused as
// sent: refused). It returns the error code it answered. Messages are
// fixed phrases that at most name the IP address or port written in
// base_url: never the key, the rest of base_url, an address a name
// resolved to, or what the shop answered.
// host is the shop's host as the log may name it (shopschema.Service.Host).
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error, requestID, host string) string {
	if code, ok := refused(w, err, requestID); ok {
		return code
	}
	if httpserver.CutOff(r, err) {
		// The drain ran out of time and cut this read off, which cancelled
		// the shop's requests: neither the shop's doing nor the caller's.
		const code = "unavailable"
		h.log.WarnContext(r.Context(), "shop schema read cut off: the shutdown's drain timed out", "error", err)
		envelope.WriteError(w, http.StatusServiceUnavailable, code, "the service is shutting down; retry with backoff", requestID)
		return code
	}
	if httpserver.CallerGone(r, err) {
		// The caller (the gateway, past its upstream timeout) hung up, which
		// cancelled the shop's requests: the shop is not at fault, and no one
		// reads this answer (499, as nginx names a request its client
		// closed). Reported as a shop timeout, it sent operators after the
		// shop.
		envelope.WriteError(w, httpserver.StatusClientClosed, httpserver.CodeClientClosed, "the caller closed the request", requestID)
		return httpserver.CodeClientClosed
	}
	var shopErr *prestashop.Error
	if errors.As(err, &shopErr) && shopErr.Kind == prestashop.KindShortage {
		// This process could not open a connection to the shop (out of
		// file descriptors, memory or local ports): our shortage, which
		// passes as connections close, not the shop's fault. 503, with
		// WriteError's Retry-After.
		code := shopErr.Kind.Code()
		h.log.ErrorContext(r.Context(), "shop schema read failed: this process is out of file descriptors, memory or local ports",
			"shop_host", host, "error", shopErr.Error())
		envelope.WriteError(w, http.StatusServiceUnavailable, code, "the service is short of resources; retry with backoff", requestID)
		return code
	}
	if errors.As(err, &shopErr) {
		if status, ok := shopStatus[shopErr.Kind]; ok {
			code := shopErr.Kind.Code()
			// The full error holds the transport or decoding error for whoever
			// debugs the shop. Its URL can carry the key (a shop's redirect
			// is the shop's to write), so prestashop frees that text of the
			// key before it gets here (keyFree); a new error logged here
			// needs the same.
			h.log.WarnContext(r.Context(), "shop call failed", "shop_host", host, "code", code, "error", shopErr.Error())
			envelope.WriteError(w, status, code, shopErr.Resource+": "+shopErr.Reason, requestID)
			return code
		}
	}
	h.log.ErrorContext(r.Context(), "shop schema read failed", "error", err)
	envelope.WriteError(w, http.StatusInternalServerError, "internal_error", "internal error", requestID)
	return "internal_error"
}

// refused answers err if the call was refused as sent (too many reads at
// once, a body too large or abandoned, bad input), and returns the error
// code it answered; ok is false for any other error.
func refused(w http.ResponseWriter, err error, requestID string) (code string, ok bool) {
	if errors.Is(err, errBusy) {
		w.Header().Set("Retry-After", "1")
		envelope.WriteError(w, http.StatusTooManyRequests, busyCode,
			"too many shop schema reads in progress; retry with backoff", requestID)
		return busyCode, true
	}
	if errors.Is(err, shoplimit.ErrBusy) {
		// The shop's address, not the caller's, is at its cap: another
		// merchant's read is served meanwhile. The message names neither
		// the shop nor its address (resolved by our DNS).
		w.Header().Set("Retry-After", "1")
		envelope.WriteError(w, http.StatusTooManyRequests, busyCode,
			"too many reads of this shop are in progress; retry with backoff", requestID)
		return busyCode, true
	}
	if errors.Is(err, httpserver.ErrBodyTooLarge) {
		// 413, as the sales routes answer it.
		const code = "payload_too_large"
		envelope.WriteError(w, http.StatusRequestEntityTooLarge, code,
			fmt.Sprintf("the body must be at most %d bytes", maxBodyBytes), requestID)
		return code, true
	}
	if errors.Is(err, httpserver.ErrBodyAbandoned) {
		// The caller closed the connection before its body was whole: no
		// one reads this answer (499, as for a caller that leaves while
		// the shop is read; a 400 counted it as a bad request).
		envelope.WriteError(w, httpserver.StatusClientClosed, httpserver.CodeClientClosed,
			"the caller closed the request before sending its body whole", requestID)
		return httpserver.CodeClientClosed, true
	}
	var inputErr *shopschema.InputError
	if errors.As(err, &inputErr) {
		envelope.WriteError(w, http.StatusBadRequest, inputErr.Code, inputErr.Message, requestID)
		return inputErr.Code, true
	}
	return "", false
}
