package edge

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/saleclaim"
	"github.com/gofiber/fiber/v2"
)

// apiError is an answer the gateway gives itself. Its message is shown to
// clients, so it never carries an internal address or a raw error.
type apiError struct {
	Status  int
	Code    string
	Message string
	// RetryAfter, for 429, is when a request would pass; for 503, when a
	// retry is first worth it.
	RetryAfter time.Duration
	// Allow, for 405, lists the route's methods.
	Allow string
	// Close ends the connection after the answer: what follows on it
	// cannot be trusted to be a request of its own.
	Close bool
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.Status, e.Code) }

// revokeAdvice ends the refusals of user info, which may have carried a
// key whatever else it held.
const revokeAdvice = "API keys are accepted in the X-API-Key header only, and a key sent elsewhere is exposed: revoke it and use a new one"

var (
	errUnauthenticated = &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated",
		Message: "missing, invalid or revoked API key"}
	errKeyInURL = &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated",
		Message: "API keys are accepted in the X-API-Key header only, never in the URL; a key sent in a URL is exposed: revoke it and use a new one"}
	errKeyInQueryOfKeylessRoute = &apiError{Status: http.StatusBadRequest, Code: "invalid_parameter",
		Message: "this route reads no query parameters and takes no API key; a key sent in a URL is exposed: revoke it and use a new one"}
	errSeveralKeys = &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated",
		Message: "send one X-API-Key header, not several"}
	errPlatformRequired = &apiError{Status: http.StatusForbidden, Code: "platform_required",
		Message: "this route needs an API key bound to a platform"}
	errNotFound = &apiError{Status: http.StatusNotFound, Code: "not_found",
		Message: "route not found"}
	errBadPathEscape = &apiError{Status: http.StatusBadRequest, Code: "invalid_path",
		Message: "the path has a % not followed by two hexadecimal digits"}
	errTooLarge = &apiError{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large",
		Message: "the request body exceeds 64 KiB"}
	// Bodies are read as sent, never decompressed (no inflating of untrusted
	// input, and the 64 KiB limit means what it says), so a compressed one
	// is refused by name rather than failing as malformed JSON at the
	// service.
	errEncodedBody = &apiError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_content_encoding",
		Message: "request bodies are accepted uncompressed only: send no Content-Encoding (or identity)"}
	// fasthttp reads the request line and the headers into one buffer and
	// cannot say which overflowed it, so a long URL gets this 431 too, not
	// a 414; the message says so.
	errHeadersTooLarge = &apiError{Status: http.StatusRequestHeaderFieldsTooLarge, Code: "headers_too_large",
		Message: "the request line (with its URL) and headers are too large together"}
	errTooManyHeaderFields = &apiError{Status: http.StatusRequestHeaderFieldsTooLarge, Code: "headers_too_large",
		Message: "the request has more than " + strconv.Itoa(maxHeaderFields) + " header fields", Close: true}
	errRequestTimeout = &apiError{Status: http.StatusRequestTimeout, Code: "request_timeout",
		Message: "the request was not received in time"}
	errBadRequest = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the request could not be read"}
	// A URL whose user info fasthttp could not read (noteUnreadableUserInfo):
	// as unreadable as any, and as exposed as a key in a readable one
	// (errKeyInURL).
	errUnreadableUserInfo = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the request could not be read: its URL holds credentials (user info), which are refused; API keys are accepted in the X-API-Key header only, never in the URL, and a key sent in a URL is exposed: revoke it and use a new one"}
	// A client that closed or reset its connection mid-request: no one
	// reads this (answerUnreadableRequests), but the access line and metrics
	// say 499, as the services and nginx do, not a client's bad request.
	errClientLeft = &apiError{Status: httpserver.StatusClientClosed, Code: httpserver.CodeClientClosed,
		Message: "the client closed the connection before sending its request whole", Close: true}
	errAmbiguousFraming = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the request's length is ambiguous: send Content-Length or Transfer-Encoding: chunked, not both (HTTP/1.0: no Transfer-Encoding), and no trailer fields after the chunks",
		Close:   true}
	errBareLineFeed = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "end every header line with CRLF: a bare LF is refused", Close: true}
	errObsFold = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "a header line starts with a space or tab (obs-fold): send each field on one line", Close: true}
	// fasthttp keeps the last of several Content-Type lines alone, and the
	// services are sent that one: the framing is clear, so the connection
	// stays open.
	errSeveralContentTypes = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "send one Content-Type header, not several"}
	errFramingLookalike = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "a field named like Transfer-Encoding or Content-Length (Transfer_Encoding, Content_Length) is refused: send Transfer-Encoding or Content-Length", Close: true}
	// A field name is a token (RFC 9110 5.1), and a proxy in front may read
	// "X-API Key" as X-API-Key where fasthttp reads a name of its own.
	errSpaceInFieldName = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "a header field name holds a space: field names are tokens, without spaces (X-API-Key, not X-API Key)", Close: true}
	// RFC 9112 3.2: a Host that is no host[:port] is a 400. Its framing is
	// clear, so the connection stays open.
	errInvalidHost = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the Host header is not a valid host[:port]"}
	// A Host with user info: as exposed as a key in a URL's (errKeyInURL).
	errHostUserInfo = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the Host header holds user info (user@host), which is refused; " + revokeAdvice}
	// A request target with user info but no key (refuseTargetUserInfo):
	// RFC 9110 4.2.4, and as exposed as the Host's.
	errTargetUserInfo = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the request's URL holds user info (http://user@host/...), which is refused; " + revokeAdvice}
	// RFC 9110 7.6.1: a field named in Connection is for one hop, and an
	// intermediary removes it. A sale without its Idempotency-Key is no
	// longer safe to retry, and a body without its Content-Type is read
	// as another; a proxy in front that honours the option sent neither.
	// So the client is told, not served another request.
	errConnectionNamesIdempotencyKey = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the Connection header names Idempotency-Key, which makes it a field for the first hop alone, removed before the request goes on (RFC 9110 7.6.1): remove Idempotency-Key from Connection"}
	errConnectionNamesContentType = &apiError{Status: http.StatusBadRequest, Code: "bad_request",
		Message: "the Connection header names Content-Type, which makes it a field for the first hop alone, removed before the request goes on (RFC 9110 7.6.1): remove Content-Type from Connection"}
	// fasthttp reads a request line of any HTTP/d.d, and the services'
	// net/http would refuse one of another major version than 1 with a 505
	// of its own request id. The gateway answers it, 400: the contract's
	// action for a request to fix, where a 5xx reads "retry later". The
	// connection is closed, as its framing cannot be trusted.
	errHTTPVersion = &apiError{Status: http.StatusBadRequest, Code: "http_version_not_supported",
		Message: "send HTTP/1.1 or HTTP/1.0", Close: true}
	errInternal = &apiError{Status: http.StatusInternalServerError, Code: "internal_error",
		Message: "internal error"}
	// A panic on a sale sent with an Idempotency-Key (panicError) says
	// what is known of the sale, as the writer's own 500 does.
	errSaleInternalNothingSent = &apiError{Status: http.StatusInternalServerError, Code: "internal_error",
		Message: saleclaim.InternalNothingApplied}
	errSaleInternal = &apiError{Status: http.StatusInternalServerError, Code: "internal_error",
		Message: saleclaim.InternalMayHaveBeenApplied}
	errDraining = &apiError{Status: http.StatusServiceUnavailable, Code: "unavailable",
		Message: "this gateway instance is shutting down; other instances answer", RetryAfter: envelope.UnavailableRetryAfter}
	// errTooManyConnections answers a connection accepted while
	// GATEWAY_MAX_CONNECTIONS are open (refuseConnection), before any
	// request on it is read: it is closed after the answer.
	errTooManyConnections = &apiError{Status: http.StatusServiceUnavailable, Code: "unavailable",
		Message:    "this gateway instance has as many connections open as it serves; retry later, or on a connection already open",
		RetryAfter: envelope.UnavailableRetryAfter, Close: true}
	// errAnswersHeldFull is an answer without a length the gateway would
	// read whole (relayWithoutLength) while other answers hold the bytes
	// it may hold (heldAnswersLimit): not the service's failure.
	errAnswersHeldFull = &apiError{Status: http.StatusServiceUnavailable, Code: "unavailable",
		Message: "the gateway holds as many answers as it may; retry later", RetryAfter: envelope.UnavailableRetryAfter}
	errAuthUnavailable = &apiError{Status: http.StatusServiceUnavailable, Code: "unavailable",
		Message: "the API key could not be checked; retry later", RetryAfter: envelope.UnavailableRetryAfter}
	// errSaleAuthUnavailable is errAuthUnavailable to a sale with an
	// Idempotency-Key: sent nowhere, and saying so, as the gateway's
	// other answers of a sale say what they know of it.
	errSaleAuthUnavailable = &apiError{Status: http.StatusServiceUnavailable, Code: "unavailable",
		Message: "the API key could not be checked; " + saleclaim.NothingApplied + ": " + saleclaim.RetryWithTheKey, RetryAfter: envelope.UnavailableRetryAfter}
	errUpstreamUnavailable = &apiError{Status: http.StatusServiceUnavailable, Code: "upstream_unavailable",
		Message: "the service is temporarily unavailable; retry later", RetryAfter: envelope.UnavailableRetryAfter}
	errSaleUpstreamUnavailable = &apiError{Status: http.StatusServiceUnavailable, Code: "upstream_unavailable",
		Message: "the service is temporarily unavailable; " + saleclaim.NothingApplied + ": " + saleclaim.RetryWithTheKey, RetryAfter: envelope.UnavailableRetryAfter}
	errBadGateway = &apiError{Status: http.StatusBadGateway, Code: "bad_gateway",
		Message: "the service failed to answer; retry later"}
	errSaleBadGateway = &apiError{Status: http.StatusBadGateway, Code: "bad_gateway",
		Message: "the service failed to answer; " + saleclaim.MayHaveBeenApplied + ": retry it with the same Idempotency-Key"}
	errGatewayRefused = &apiError{Status: http.StatusBadGateway, Code: "bad_gateway",
		Message: "the service refused the gateway's request; the fault is ours: quote the request id"}
	errUpstreamTimeout = &apiError{Status: http.StatusGatewayTimeout, Code: "upstream_timeout",
		Message: "the service did not answer in time"}
	errSaleTimeout = &apiError{Status: http.StatusGatewayTimeout, Code: "upstream_timeout",
		Message: "the service did not answer in time; " + saleclaim.MayHaveBeenApplied + ": retry it with the same Idempotency-Key"}
)

// saleClaims are what the gateway's own answers to a sale say of it: the
// access line's and span's sale_applied, under the writer's key, so that
// the SRE tracing a sale the writer has no line of reads it there. "maybe"
// where the message says the sale may have been applied, "no" where it
// says nothing was applied, or, for a sale sent without an
// Idempotency-Key answered upstream_unavailable, where the README says
// nothing was sent (its message, shared with every route, says only to
// retry; salescheck.SaysNothingApplied reads it by its code), and for a
// sale with an Idempotency-Key whose key could not be checked, refused
// before anything was sent.
var saleClaims = map[*apiError]string{
	errSaleBadGateway: saleclaim.Maybe, errSaleTimeout: saleclaim.Maybe, errSaleInternal: saleclaim.Maybe,
	errUpstreamUnavailable: saleclaim.Nothing, errSaleUpstreamUnavailable: saleclaim.Nothing, errSaleInternalNothingSent: saleclaim.Nothing,
	errSaleAuthUnavailable: saleclaim.Nothing,
}

func errRateLimited(retryAfter time.Duration) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Code: "rate_limited",
		Message: "rate limit exceeded; retry after the time in Retry-After", RetryAfter: retryAfter}
}

// errTooManyInFlight is the 429 of a call over its address's slots; a
// retry is worth it once one of its calls ends.
func errTooManyInFlight(limit int) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Code: "rate_limited",
		Message:    fmt.Sprintf("too many shop schema reads in flight from this client address (at most %d at once); retry when one ends", limit),
		RetryAfter: time.Second}
}

// errOwnerTooManyInFlight is the 429 of a keyed request over its owner's
// slots on the routes of one service (routes: export, sale), whichever of
// the owner's keys sent it; a retry is worth it once one of the owner's
// requests there ends.
func errOwnerTooManyInFlight(limit int, routes string) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Code: "rate_limited",
		Message:    fmt.Sprintf("too many requests in flight for this owner on the %s routes, all of its keys together (at most %d at once); retry when one ends", routes, limit),
		RetryAfter: time.Second}
}

// errAuthThrottled is the 429 of a key that was not even looked up: its
// client's address is over its guess budget (unknown keys tried). It says so,
// as a valid key refused this way would otherwise look limited for no
// reason (its X-RateLimit-* are that budget's, not the key's).
func errAuthThrottled(retryAfter time.Duration) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Code: "rate_limited",
		Message:    "too many failed authentications from this address; this key was not checked: retry after the time in Retry-After",
		RetryAfter: retryAfter}
}

// errGuessesInLookup is the 429 of an uncached key not looked up because
// its address has as many keys in lookup as its guess budget has left:
// no failed authentication is over any budget yet, and a retry a second
// later finds those lookups ended.
var errGuessesInLookup = &apiError{Status: http.StatusTooManyRequests, Code: "rate_limited",
	Message:    "too many keys from this address are being checked at once; this key was not checked: retry after the time in Retry-After",
	RetryAfter: time.Second}

// errMissingScope is the 403 of a key without the route's scope; it names
// the scope needed and the key's, so that a client holding a read key and
// a write key sees which one it sent.
func errMissingScope(needed string, has []string) *apiError {
	return &apiError{Status: http.StatusForbidden, Code: "forbidden",
		Message: fmt.Sprintf("this route needs an API key with the %s scope; this key has %s", needed, scopeList(has))}
}

func scopeList(scopes []string) string {
	if len(scopes) == 0 {
		return "none"
	}
	return strings.Join(scopes, ", ")
}

func errMethodNotAllowed(allow string) *apiError {
	return &apiError{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
		Message: "method not allowed on this route", Allow: allow}
}

// toAPIError is the gateway's one mapping from errors to answers. logged
// reports whether the error is worth a log line (the cause of a 5xx).
func toAPIError(err error) (ae *apiError, logged bool) {
	var fe *fiber.Error
	switch {
	case errors.As(err, &ae):
		// The gateway's own answers are not worth a line, but for the one
		// 5xx that has a cause of its own: its figures (heldPageEnd.refuse).
		return ae, ae == errAnswersHeldFull
	case errors.Is(err, keystore.ErrUnauthenticated):
		return errUnauthenticated, false
	case errors.Is(err, errKeyLookup) && errors.Is(err, errSaleNothingApplied):
		return errSaleAuthUnavailable, true
	case errors.Is(err, errSaleNothingApplied):
		return errSaleUpstreamUnavailable, true
	case nothingSent(err):
		// Nothing applied (every instance out, refused, or no connection
		// free; or a safe request's repeat refused): a retry cannot apply
		// anything twice, and Retry-After says when it is worth it.
		return errUpstreamUnavailable, true
	case errors.Is(err, errSaleMayBeApplied) && errors.Is(err, upstream.ErrTimeout):
		return errSaleTimeout, true
	case errors.Is(err, errSaleMayBeApplied):
		return errSaleBadGateway, true
	case errors.Is(err, upstream.ErrTimeout):
		return errUpstreamTimeout, true
	case errors.Is(err, upstream.ErrClosed), errors.Is(err, upstream.ErrBadResponse):
		return errBadGateway, true
	case errors.Is(err, errIdentityRefused):
		return errGatewayRefused, true
	case errors.Is(err, errKeyLookup):
		return errAuthUnavailable, true
	case errors.As(err, &fe):
		return fromFiber(fe), false
	}
	return errInternal, true
}

// errKeyLookup wraps a failure to reach the key store.
var errKeyLookup = errors.New("key lookup failed")

// fromFiber maps the errors Fiber raises before a handler runs: each is a
// request the server could not read whole. Fiber's server error handler
// gives a network error while reading 502, a proxy's status: the client's
// failure, not the gateway's, so it is a 400 like any other request that
// could not be read, not a 5xx that would page on-call. A client that
// closed or reset its connection never comes here: its 499 is answered
// before Fiber's handler (answerUnreadableRequests).
// Fiber's 404 and 405 never come here: the catch-all answers every path
// and method (unmatchedHandler, answerUnknownMethods).
func fromFiber(fe *fiber.Error) *apiError {
	switch fe.Code {
	case fiber.StatusRequestEntityTooLarge:
		return errTooLarge
	case fiber.StatusRequestHeaderFieldsTooLarge:
		return errHeadersTooLarge
	case fiber.StatusRequestTimeout:
		return errRequestTimeout
	}
	return errBadRequest
}
