package httpserver

import "net/http"

// MethodOther stands for any method outside the known ones, as
// OpenTelemetry's http.request.method does.
const MethodOther = "_OTHER"

// StableMethod returns m if it is a method of RFC 9110 or PATCH, and
// MethodOther for any other token: the client chooses the token, and metric
// labels, span attributes and log fields must not take on any value it
// sends. The result is always a constant, never m itself, so that it may
// outlive m's buffer (fasthttp reuses a request's bytes for the next).
func StableMethod(m string) string {
	switch m {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodHead:
		return http.MethodHead
	case http.MethodPost:
		return http.MethodPost
	case http.MethodPut:
		return http.MethodPut
	case http.MethodDelete:
		return http.MethodDelete
	case http.MethodConnect:
		return http.MethodConnect
	case http.MethodOptions:
		return http.MethodOptions
	case http.MethodTrace:
		return http.MethodTrace
	case http.MethodPatch:
		return http.MethodPatch
	}
	return MethodOther
}
