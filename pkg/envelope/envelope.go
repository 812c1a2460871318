// Package envelope writes the response envelope of spec 2.1 and 7: every body
// is {"data": ..., "meta": {...}} or {"error": {...}, "meta": {...}}.
package envelope

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/coinexport/export/pkg/jsonw"
)

// Meta is the meta object every response carries.
type Meta struct {
	RequestID  string  `json:"request_id"`
	NextCursor *string `json:"next_cursor,omitempty"`
}

// ErrorBody is the error object of an error response.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type dataEnvelope struct {
	Data any  `json:"data"`
	Meta Meta `json:"meta"`
}

type errorEnvelope struct {
	Error ErrorBody `json:"error"`
	Meta  Meta      `json:"meta"`
}

// ContentType is sent with every envelope.
const ContentType = "application/json; charset=utf-8"

// RequestIDHeader repeats meta.request_id on every response.
const RequestIDHeader = "X-Request-Id"

// ErrorCodeHeader repeats error.code on every error response. The access
// lines and server spans of the services and of the gateway (which relays
// the services' answers unread) take the code from it, so that a failed
// call found by its request id says why it failed; and the answer to a
// HEAD, which has no body, still says it.
const ErrorCodeHeader = "X-Error-Code"

// WellFormedCode reports whether code, read from another process's
// ErrorCodeHeader, is shaped like this project's error codes: 1 to 64
// lower-case letters, digits and underscores ("rate_limited", "shop_401").
// Only such a code is quoted in a log line or used as a metric label as it
// is: one sent by a service of another build, or by something that is not
// a service of ours, could hold any text, and a label value nobody chose
// grows a series.
func WellFormedCode(code []byte) bool {
	if len(code) == 0 || len(code) > maxCodeLength {
		return false
	}
	for _, c := range code {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// maxCodeLength is the longest code WellFormedCode accepts.
const maxCodeLength = 64

// DataBytes encodes a success envelope.
func DataBytes(data any, meta Meta) ([]byte, error) {
	return json.Marshal(dataEnvelope{Data: data, Meta: meta})
}

// ErrorBytes encodes an error envelope. It cannot fail: every field is a string.
func ErrorBytes(code, message, requestID string) []byte {
	b, _ := json.Marshal(errorEnvelope{Error: ErrorBody{Code: code, Message: message}, Meta: Meta{RequestID: requestID}})
	return b
}

// WriteData writes a success envelope with the given status.
func WriteData(w http.ResponseWriter, status int, data any, meta Meta) {
	body, err := DataBytes(data, meta)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, "internal_error", "internal error", meta.RequestID)
		return
	}
	writeBody(w, status, body, meta.RequestID)
}

// WriteDataJSON writes a success envelope around the data that appendData
// appends: JSON encoded without reflection, valid and compact, written
// straight into the envelope's buffer. For the sales writer's answer,
// WriteData's encoding/json (reflection, then re-validating the value's
// MarshalJSON output) was 8 % of the service's CPU.
func WriteDataJSON(w http.ResponseWriter, status int, appendData func(dst []byte) []byte, meta Meta) {
	body := make([]byte, 0, 384)
	body = append(body, `{"data":`...)
	body = appendData(body)
	next := ""
	if meta.NextCursor != nil {
		next = *meta.NextCursor
	}
	body = AppendMeta(body, meta.RequestID, false, next)
	writeBody(w, status, append(body, '}'), meta.RequestID)
}

// AppendMeta appends the envelope's "meta" member: request_id and, for a
// list, next_cursor, the cursor or null on the last page (always present,
// so a client can test it). The caller closes the envelope.
func AppendMeta(dst []byte, requestID string, list bool, nextCursor string) []byte {
	dst = append(dst, `,"meta":{"request_id":`...)
	dst = jsonw.String(dst, requestID)
	switch {
	case nextCursor != "":
		dst = append(dst, `,"next_cursor":`...)
		dst = jsonw.String(dst, nextCursor)
	case list:
		dst = append(dst, `,"next_cursor":null`...)
	}
	return append(dst, '}')
}

// WriteError writes an error envelope with the given status, its code also
// in X-Error-Code, and a 503 with Retry-After unless one is set. No cache
// may keep it (a 404 is cacheable by default, and the item may exist a
// moment later).
func WriteError(w http.ResponseWriter, status int, code, message, requestID string) {
	w.Header().Set("Cache-Control", ErrorCacheControl)
	w.Header().Set(ErrorCodeHeader, code)
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", unavailableRetryAfterSeconds)
	}
	writeBody(w, status, ErrorBytes(code, message, requestID), requestID)
}

// UnavailableRetryAfter is the Retry-After of every 503 (RFC 9110 10.2.3):
// the earliest a retry is worth it, so that a client that honours the
// header does not retry at once, into an outage; it backs off from there.
const UnavailableRetryAfter = time.Second

// unavailableRetryAfterSeconds is UnavailableRetryAfter as the header says it.
var unavailableRetryAfterSeconds = strconv.Itoa(int(UnavailableRetryAfter / time.Second))

// ErrorCacheControl is the Cache-Control of every error envelope.
const ErrorCacheControl = "no-store"

// PrivateCacheControl is the Cache-Control of every 200 that holds one
// caller's data: an owner's items (export-reader), a sale's result
// (sales-writer), a shop's schema read with its ws_key (shop-schema). No
// cache may keep it; "private" adds nothing for a cache that honours
// "no-store" (RFC 9111 5.2.2.5), and is there so that every such answer
// carries one value, the one export-reader's pages always had.
const PrivateCacheControl = "private, no-store"

func writeBody(w http.ResponseWriter, status int, body []byte, requestID string) {
	h := w.Header()
	h.Set("Content-Type", ContentType)
	if requestID != "" {
		h.Set(RequestIDHeader, requestID)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Parsed is an envelope as a client reads it; tests, testenv, loadgen and
// salescheck decode responses into it. (The reference sync client,
// syncclient, declares its own: it imports nothing of this repository.)
type Parsed struct {
	Data  json.RawMessage `json:"data"`
	Error *ErrorBody      `json:"error"`
	Meta  Meta            `json:"meta"`
}
