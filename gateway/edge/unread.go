package edge

import (
	"errors"
	"strings"

	"github.com/valyala/fasthttp"
)

// The words unreadReason says which part of a request fasthttp could not
// read in: the access line's reason and the span's attrUnreadReason on a
// 400 unrouted. A fixed set, never the request's bytes.
const (
	unreadRequestLine      = "request_line"      // no method, target or protocol, or one of them malformed
	unreadURI              = "invalid_uri"       // a target or Host fasthttp cannot read as a URL
	unreadHost             = "host"              // no Host (HTTP/1.1), or several
	unreadHeader           = "header"            // a malformed header line
	unreadContentLength    = "content_length"    // several, or not a number
	unreadTransferEncoding = "transfer_encoding" // other than one chunked, or sent with HTTP/1.0
	unreadChunkedBody      = "chunked_body"      // a chunk's size line or its end
	unreadTrailer          = "trailer"           // a field after the chunks, or one declared in Trailer, fasthttp refuses
	unreadUserInfo         = "user_info"         // noteUnreadableUserInfo's
	unreadOther            = "other"
)

// unreadPrefixes are the starts of the texts of fasthttp's (v1.78) errors
// for a request it could not read that have no exported type or sentinel,
// with their word. A link of the error's chain is compared by its start
// alone: fasthttp quotes the request's bytes after its own words, never
// before them, so those bytes cannot pass for another reason. An upgrade
// that rewords one makes it "other" (TestAnUnreadableRequestSaysWhichPartCouldNotBeRead).
var unreadPrefixes = []struct{ prefix, reason string }{
	{"cannot find http request method", unreadRequestLine},
	{"unsupported http request method", unreadRequestLine},
	{"cannot find whitespace in the first line of request", unreadRequestLine},
	{"unsupported http version", unreadRequestLine},
	{"request uri cannot be empty", unreadRequestLine},
	{refusedTargetPrefix, unreadURI},
	{"missing required host header", unreadHost},
	{"too many host headers", unreadHost},
	{"invalid header key", unreadHeader},
	{refusedValuePrefix, unreadHeader},
	{"invalid headers, headers cannot start with space or tab", unreadHeader},
	{"malformed mime header", unreadHeader},
	{"cannot parse content-length", unreadContentLength},
	{"too many transfer-encoding headers", unreadTransferEncoding},
	{"unsupported transfer-encoding", unreadTransferEncoding},
	{"empty hex number", unreadChunkedBody},
	{"too large hex number", unreadChunkedBody},
	{"forbidden trailer key", unreadTrailer},
	{"invalid trailer value", unreadTrailer},
	// fasthttp reads a request's trailer with the words of a response's
	// headers (tryReadTrailer): a server reads no response.
	{"error when reading response headers", unreadTrailer},
}

// refusedValuePrefix starts fasthttp's (v1.78) text for a header value it
// refused (a control byte or DEL in it), which then quotes the value
// ("invalid header value %q").
const refusedValuePrefix = "invalid header value "

// refusedTargetPrefix starts fasthttp's (v1.78) text for a request target
// it refused (a control byte or DEL in it, ParseFirstLine), which then
// quotes the target ("invalid request uri %q", and more after it unless
// SecureErrorLogMessage is set).
const refusedTargetPrefix = "invalid request uri "

// unreadReason is the word for the part of the request h heads that
// fasthttp failed to read with err: by fasthttp's exported errors first,
// then by the start of its own words (unreadPrefixes), then by its URL
// (fasthttp reads it once the head is whole, and its errors for a host
// say nothing of their own; a head cut short holds no Host, so it says
// invalid_uri only for a target that is itself no URL). Only a request
// that could not be read pays for it.
func unreadReason(err error, h *fasthttp.RequestHeader) string {
	if reason := unreadReasonByType(err); reason != "" {
		return reason
	}
	for link := err; link != nil; link = errors.Unwrap(link) {
		text := link.Error()
		for _, p := range unreadPrefixes {
			if strings.HasPrefix(text, p.prefix) {
				return p.reason
			}
		}
	}
	if urlUnreadable(h) {
		return unreadURI
	}
	return unreadOther
}

// unreadReasonByType is unreadReason by fasthttp's exported errors, "" for
// none of them.
func unreadReasonByType(err error) string {
	var brokenChunk fasthttp.ErrBrokenChunk
	switch {
	case errors.Is(err, fasthttp.ErrorInvalidURI):
		return unreadURI
	case errors.Is(err, fasthttp.ErrMissingRequestMethod), errors.Is(err, fasthttp.ErrUnsupportedRequestMethod),
		errors.Is(err, fasthttp.ErrExtraWhitespaceInRequestLine), errors.Is(err, fasthttp.ErrEmptyRequestURI):
		return unreadRequestLine
	case errors.Is(err, fasthttp.ErrDuplicateContentLength), errors.Is(err, fasthttp.ErrNonNumericChars):
		return unreadContentLength
	case errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding):
		return unreadTransferEncoding
	case errors.Is(err, fasthttp.ErrBadTrailer):
		return unreadTrailer
	case errors.As(err, &brokenChunk):
		return unreadChunkedBody
	}
	return ""
}

// unreadReasonKey is the user value under which answerUnreadableRequests
// leaves a request's unreadReason for unreadable: Fiber's handler in
// between passes the error on without its chain.
type unreadReasonKey struct{}

// noteUnreadReason leaves err's unreadReason on the request.
func noteUnreadReason(rctx *fasthttp.RequestCtx, err error) {
	rctx.SetUserValue(unreadReasonKey{}, unreadReason(err, &rctx.Request.Header))
}

// notedUnreadReason is what noteUnreadReason left, "" if nothing.
func notedUnreadReason(rctx *fasthttp.RequestCtx) string {
	reason, _ := rctx.UserValue(unreadReasonKey{}).(string)
	return reason
}
