package prestashop

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/textproto"
	"strconv"
	"strings"

	"golang.org/x/net/http2"
)

// The faults of a shop's server below the webservice (TLS, HTTP/1.1,
// HTTP/2) are read from the types of Go's errors or, where Go exports
// none, from the words Go writes before any bytes of the shop's that an
// error quotes. A status line, a header name and a GOAWAY's debug data are
// the shop's to write, and Go quotes them: matched anywhere in the text, a
// status line holding "tls: server selected unsupported protocol version"
// made a shop's broken answer shop_tls_error (TestShopWordsDoNotSteerTheLabel).

// goWords returns the rest of the text of an error of err's chain that
// wraps no other and begins with prefix: Go's own words, which come
// before anything of the shop's an error quotes.
func goWords(err error, prefix string) (string, bool) {
	switch e := err.(type) {
	case nil:
		return "", false
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			return goWords(inner, prefix)
		}
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if rest, ok := goWords(inner, prefix); ok {
				return rest, true
			}
		}
		return "", false
	}
	return strings.CutPrefix(err.Error(), prefix)
}

// goSays reports whether an error of err's chain that wraps no other
// begins with prefix (goWords).
func goSays(err error, prefix string) bool {
	_, ok := goWords(err, prefix)
	return ok
}

// Go's words, each the start of an error's text, for faults it has no
// exported error type for. TestShopWordsDoNotSteerTheLabel and the tests
// of each fault fail if a Go release rewords them.
const (
	// crypto/tls, for a ServerHello of a version older than the client's
	// minimum, TLS 1.2: a server too old to know the version asked for
	// answers with its own instead of an alert (an old OpenSSL or IIS).
	serverPickedOldTLS = "tls: server selected unsupported protocol version "
	// net/http, for an HTTP/1.1 answer whose headers exceed the
	// transport's MaxResponseHeaderBytes.
	headersTooLarge = "net/http: server response headers exceeded "
	// net/http, for an HTTP/1.1 status line that does not parse
	// ("malformed HTTP response", "... status code", "... version").
	malformedStatusLine = "malformed HTTP "
	// net/http's HTTP/2 client: a GOAWAY with an error code aborting the
	// requests it does not cover; a GOAWAY after which the server closed
	// the connection, the code before the debug data; the connection
	// ended by the client's reader; a frame over the size it allows.
	goAwayReceived = "http2: Transport received GOAWAY from server ErrCode:"
	goAwayClosed   = "http2: server sent GOAWAY and closed the connection; LastStreamID="
	h2ConnError    = "connection error: "
	h2FrameTooBig  = "http2: frame too large"
	// The whole text of the cause of a stream error: the server reset the
	// stream, or the answer's headers overflowed the limit in the last
	// frame of their block (Go's reader takes them and ends the stream).
	h2FromPeer           = "received from peer"
	h2HeaderListTooLarge = "http2: response header list larger than advertised limit"
)

// reasonHeadersTooLarge names answer headers over MaxResponseHeaderBytes.
const reasonHeadersTooLarge = "the shop's answer headers are larger than 64 KiB"

// reasonOldTLS names a server that speaks only TLS 1.0 or 1.1.
const reasonOldTLS = "the shop's server speaks only TLS versions older than 1.2, which are not used: it must offer TLS 1.2 or 1.3"

// The TLS alerts (RFC 8446 §6, RFC 6066) a server that refuses a client
// sends; crypto/tls exports no names for them.
const (
	alertHandshakeFailure       tls.AlertError = 40
	alertBadCertificate         tls.AlertError = 42
	alertUnsupportedCertificate tls.AlertError = 43
	alertCertificateRevoked     tls.AlertError = 44
	alertCertificateExpired     tls.AlertError = 45
	alertCertificateUnknown     tls.AlertError = 46
	alertUnknownCA              tls.AlertError = 48
	alertAccessDenied           tls.AlertError = 49
	alertProtocolVersion        tls.AlertError = 70
	alertInsufficientSecurity   tls.AlertError = 71
	alertInternalError          tls.AlertError = 80
	alertUnrecognizedName       tls.AlertError = 112
	alertCertificateRequired    tls.AlertError = 116
)

// tlsAlertOp is the Op of the *net.OpError crypto/tls returns for an
// alert the server sent.
const tlsAlertOp = "remote error"

// remoteAlert returns the TLS alert the shop's server sent. crypto/tls
// (Go 1.26) returns it as a *net.OpError "remote error" holding its
// unexported alert type: tls.AlertError, its exported twin, is what QUIC
// connections return, and errors.As finds none in a TCP connection's error
// (golang/go#35234). Both write the same text, crypto/tls's name for the
// alert number, so the number is found by that text (alertsByText), from
// Go's own table: a shop sends an alert's number, never its words.
func remoteAlert(err error) (tls.AlertError, bool) {
	var opErr *net.OpError
	if !errors.As(err, &opErr) || opErr.Op != tlsAlertOp || opErr.Err == nil {
		return 0, false
	}
	var alert tls.AlertError
	if errors.As(opErr.Err, &alert) {
		return alert, true
	}
	alert, ok := alertsByText[opErr.Err.Error()]
	return alert, ok
}

// alertsByText maps each TLS alert's text, as crypto/tls writes it
// ("tls: handshake failure", "tls: alert(200)"), to its number.
var alertsByText = func() map[string]tls.AlertError {
	m := make(map[string]tls.AlertError, 256)
	for n := range 256 {
		m[tls.AlertError(n).Error()] = tls.AlertError(n)
	}
	return m
}()

// alertReason says what a TLS alert from the shop's server means for the
// merchant, naming it as crypto/tls does ("handshake failure").
func alertReason(alert tls.AlertError) string {
	name := fmt.Sprintf("TLS alert %q", strings.TrimPrefix(alert.Error(), "tls: "))
	switch alert {
	case alertProtocolVersion:
		return reasonOldTLS
	case alertHandshakeFailure, alertInsufficientSecurity:
		// Go's server and OpenSSL under TLS 1.2 also send it to a client
		// without the certificate they require.
		return "the shop's server refused the TLS handshake (" + name + "): it shares no cipher suite with a current client (it must offer TLS 1.2 with ECDHE key exchange, or TLS 1.3), or it asks every client for a client certificate, which the service has none of"
	case alertBadCertificate, alertUnsupportedCertificate, alertCertificateRevoked, alertCertificateExpired,
		alertCertificateUnknown, alertUnknownCA, alertCertificateRequired:
		// A server judges no certificate but the client's, and the
		// service sends none.
		return "the shop's server asks for a client certificate (" + name + "), which the service has none of: the webservice must accept clients without one"
	case alertUnrecognizedName:
		return "the shop's server has no site for base_url's host name (" + name + "): base_url must name the host the shop is served under"
	case alertInternalError:
		return "the shop's server failed in the TLS handshake (" + name + "): a fault of its TLS set-up (its certificate or key), for its host to fix"
	case alertAccessDenied:
		return "the shop's server refused the connection (" + name + "): an access rule of the server, or of a firewall in front of it, refuses this service"
	}
	return "the shop's server broke off the TLS handshake (" + name + "): its TLS set-up does not work with a current client"
}

// http2Fault classifies what ended an HTTP/2 request, or reports false for
// an error that is not HTTP/2's. The shop's server was reached: a code it
// sent is labelled as the status it stands for would be (INTERNAL_ERROR a
// 500, ENHANCE_YOUR_CALM a 429: shop_unavailable; NO_ERROR a connection
// closed before the answer: shop_unreachable; any other shop_bad_response),
// and answer headers over the limit are shop_too_large, as over HTTP/1.1.
func http2Fault(err error) (Kind, string, bool) {
	var streamErr http2.StreamError // net/http's own converts to it (h2_error.go)
	if errors.As(err, &streamErr) {
		kind, reason := streamFault(streamErr)
		return kind, reason, true
	}
	if code, ok := goAwayCode(err); ok {
		kind, reason := sentByServer(code)
		return kind, reason, true
	}
	if name, ok := goWords(err, h2ConnError); ok {
		kind, reason := endedByReader(name)
		return kind, reason, true
	}
	if goSays(err, h2FrameTooBig) {
		return KindBadResponse, "the shop's server broke HTTP/2 (a frame larger than the client allows)", true
	}
	return 0, "", false
}

// streamFault labels one request's stream ended by the server (its
// RST_STREAM) or by Go's reader over the answer's headers.
func streamFault(streamErr http2.StreamError) (Kind, string) {
	cause := ""
	if streamErr.Cause != nil {
		cause = streamErr.Cause.Error()
	}
	switch cause {
	case h2FromPeer:
		return sentByServer(streamErr.Code)
	case h2HeaderListTooLarge:
		return KindTooLarge, reasonHeadersTooLarge
	case "":
		// Go's reader gives no cause for a frame the server may not send
		// where it did (DATA before the answer's HEADERS or after its
		// end, a padding longer than the frame): no header is at fault.
		return KindBadResponse, "the shop's server broke HTTP/2 (a frame out of place or malformed)"
	}
	return KindBadResponse, "the shop's server sent a malformed HTTP/2 answer (a header that does not parse)"
}

// goAwayCode returns the error code of a GOAWAY that ended the request:
// Go writes it, by name, before the debug data, which is the shop's.
func goAwayCode(err error) (http2.ErrCode, bool) {
	if name, ok := goWords(err, goAwayReceived); ok {
		return errCodeNamed(name)
	}
	rest, ok := goWords(err, goAwayClosed)
	if !ok {
		return 0, false
	}
	_, rest, _ = strings.Cut(rest, ", ErrCode=")
	name, _, ok := strings.Cut(rest, ", debug=")
	if !ok {
		return 0, false
	}
	return errCodeNamed(name)
}

// errCodeNamed is the HTTP/2 error code Go names so (ErrCode.String).
func errCodeNamed(name string) (http2.ErrCode, bool) {
	for code := http2.ErrCodeNo; code <= http2.ErrCodeHTTP11Required; code++ {
		if code.String() == name {
			return code, true
		}
	}
	if hex, ok := strings.CutPrefix(name, "unknown error code 0x"); ok {
		if n, err := strconv.ParseUint(hex, 16, 32); err == nil {
			return http2.ErrCode(n), true
		}
	}
	return 0, false
}

// sentByServer labels an HTTP/2 error code the shop's server ended a
// request with (RST_STREAM or GOAWAY) as the status it stands for.
func sentByServer(code http2.ErrCode) (Kind, string) {
	switch code {
	case http2.ErrCodeNo:
		return KindUnreachable, "the shop's server closed the connection before answering"
	case http2.ErrCodeInternal:
		return KindUnavailable, "the shop's server failed while answering (HTTP/2 error INTERNAL_ERROR)"
	case http2.ErrCodeEnhanceYourCalm:
		return KindUnavailable, "the shop's server refused the request as one too many (HTTP/2 error ENHANCE_YOUR_CALM); retry later"
	}
	return KindBadResponse, "the shop's server ended the request with " + errCodeName(code) + ": its HTTP/2 does not work with a current client, or it refuses HTTP/2 for the webservice"
}

// endedByReader labels a connection Go's HTTP/2 reader ended over what the
// shop sent. COMPRESSION_ERROR is one header longer than the 64 KiB
// allowed, PROTOCOL_ERROR headers that go on past it in more frames: a
// server's mature HPACK and framing leave those the likely cause, though
// a header block that does not decode ends so too, as the message says.
func endedByReader(name string) (Kind, string) {
	code, ok := errCodeNamed(name)
	switch {
	case !ok:
		return KindBadResponse, "the shop's server broke HTTP/2"
	case code == http2.ErrCodeCompression || code == http2.ErrCodeProtocol:
		return KindTooLarge, reasonHeadersTooLarge + ", or malformed (" + errCodeName(code) + ")"
	}
	return KindBadResponse, "the shop's server broke HTTP/2 (" + errCodeName(code) + ")"
}

// errCodeName names an HTTP/2 error code, within a fixed set of words.
func errCodeName(code http2.ErrCode) string {
	if code > http2.ErrCodeHTTP11Required {
		return "an HTTP/2 error of an unknown code"
	}
	return "HTTP/2 error " + code.String()
}

// unreadableFraming lists net/http's words (transfer.go) for an HTTP/1.1
// answer whose body's framing cannot be read: a Content-Length that is not
// a number or empty, two that differ, a Transfer-Encoding other than one
// chunked.
var unreadableFraming = []string{
	"bad Content-Length ",
	"invalid empty Content-Length ",
	"http: message cannot contain multiple Content-Length headers",
	"unsupported transfer encoding: ",
	"too many transfer encodings: ",
}

// framingUnreadable reports whether err is net/http's for an HTTP/1.1
// answer whose body's framing cannot be read (unreadableFraming).
func framingUnreadable(err error) bool {
	for _, words := range unreadableFraming {
		if goSays(err, words) {
			return true
		}
	}
	return false
}

// malformedHTTP1 reports whether err is net/http's for an HTTP/1.1 answer
// that does not parse: its status line (an unexported type, so Go's
// words) or a header line (textproto.ProtocolError).
func malformedHTTP1(err error) bool {
	var headerErr textproto.ProtocolError
	return goSays(err, malformedStatusLine) || errors.As(err, &headerErr)
}
