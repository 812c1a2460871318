package edge

import (
	"bytes"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// refuseUnservable returns the refusal of a request that no step may act
// on, or nil: another HTTP version, a head a proxy in front could read
// otherwise (misreadHead), a path no route has (404, or 405 with Allow),
// or a path the services would read otherwise than the routing did
// (checkPath).
func refuseUnservable(c *fiber.Ctx, rt route) error {
	if !http1(c.Request().Header.Protocol()) {
		return errHTTPVersion
	}
	if err := misreadHead(&c.Request().Header); err != nil {
		return err
	}
	if rt == unmatched {
		if allow := allowedMethods(c.Path()); len(allow) > 0 {
			return errMethodNotAllowed(strings.Join(allow, ", "))
		}
		return errNotFound
	}
	return checkPath(c.Request().URI().PathOriginal())
}

// http1 reports whether a request line's version is HTTP/1.x; fasthttp has
// checked its shape ("HTTP/", digit, ".", digit). A minor version above 1
// is served, with HTTP/1.0's rules (fasthttp reads only "HTTP/1.1" as 1.1):
// no chunked body, the connection closed after the answer.
func http1(proto []byte) bool { return len(proto) == len("HTTP/1.1") && proto[5] == '1' }

// misreadHead returns the refusal of a header section that a proxy in
// front could read otherwise than fasthttp did, or nil. Each is refused
// with a 400 (too many header lines: a 431) and the connection closed
// (RFC 9112 6.1 requires the close after a framing refusal; the others get
// it too, as the bytes after such a head cannot be trusted to start a
// request), but for several Content-Type lines, a Host that is no
// host[:port] and a Connection naming a field, whose framing is clear:
//
//   - a bare LF ending a header line, or the empty line that ends the
//     head: fasthttp takes it as a line's end (RFC 9112 2.2 lets it), a
//     proxy that reads it as part of the value sees one field where
//     fasthttp sees two, so a Content-Length, Transfer-Encoding or
//     X-API-Key behind it is seen by one and not the other
//     (errBareLineFeed);
//   - a line starting with a space or tab (obs-fold): fasthttp joins it to
//     the field above, a proxy that does not sees a field of its own
//     (errObsFold; RFC 9112 5.2 lets a server refuse it with a 400);
//   - a field name with a space inside it (errSpaceInFieldName): fasthttp
//     refuses one before the colon (RFC 9112 5.1) but takes "X-API Key" or
//     "Transfer Encoding" as a name of its own, where a proxy that reads a
//     space there as a "-" sees X-API-Key or Transfer-Encoding; a field
//     name is a token (RFC 9110 5.1);
//   - Transfer_Encoding or Content_Length: fasthttp ignores them for
//     framing, a proxy that maps "_" to "-" (as CGI-style front ends do)
//     frames the body by them (errFramingLookalike);
//   - a length two parsers could read differently (framing.ambiguous);
//   - more than one Content-Type line (errSeveralContentTypes): fasthttp
//     keeps the last alone, and the services are sent that one, where
//     anything in front that checks the type reads the first, and the
//     sales-writer refuses the two in one line ("text/plain,
//     application/json", RFC 9110 5.3); the same type twice too, as the
//     duplicate X-API-Key and Idempotency-Key are;
//   - more than maxHeaderFields header lines (errTooManyHeaderFields);
//   - a Host that is no host[:port] (errInvalidHost, errHostUserInfo):
//     RFC 9112 3.2 requires a 400 for it; the framing is clear, so the
//     connection stays open;
//   - a Connection field that names Idempotency-Key or Content-Type as an
//     option (refuseEndToEndOptions): a proxy in front that honours it
//     removes the field (RFC 9110 7.6.1), one that does not sends it on.
//
// The raw headers are read, not fasthttp's parsed ones: after an empty
// chunked body fasthttp sets the length to 0 and keeps no trace of the
// chunks. The scan looks at each line's first and last bytes and at its
// name, and reads the value only of lines starting with "t", "c" or "h".
func misreadHead(h *fasthttp.RequestHeader) error {
	var f framing
	fields := 0
	raw := h.RawHeaders() // the bytes as received, each line ended by its LF
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
			if len(line) == 0 || line[len(line)-1] != '\r' {
				return errBareLineFeed
			}
			line = line[:len(line)-1]
		} else {
			raw = nil
		}
		if len(line) == 0 { // the empty line that ends the head
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			return errObsFold
		}
		if fields++; fields > maxHeaderFields {
			return errTooManyHeaderFields
		}
		if spaceInName(line) {
			return errSpaceInFieldName
		}
		if err := f.read(line); err != nil {
			return err
		}
	}
	if f.ambiguous(h) {
		return errAmbiguousFraming
	}
	if f.typed > 1 {
		return errSeveralContentTypes
	}
	return nil
}

// spaceInName reports a space in the name of a raw header line (not
// empty, not folded: those are refused above). fasthttp has refused a line
// without a colon, and a space just before it. Every line of every request
// comes here: the first space of a usual line follows its colon, which one
// look at the byte before it tells.
func spaceInName(line []byte) bool {
	space := bytes.IndexByte(line, ' ')
	return space > 0 && line[space-1] != ':' && bytes.IndexByte(line[:space], ':') < 0
}

// maxHeaderFields is how many header lines a request may carry, as many
// as Apache's LimitRequestFields allows by default: a client sends a dozen
// or two, and an ingress adds a few. Past it, what a request costs grows
// with the square of its fields: scrubHeaders deletes each field a service
// is not sent by name, and fasthttp's delete walks every field left, so
// 880 one-letter fields within GATEWAY_MAX_HEADER_BYTES cost the gateway
// 1.7 ms of CPU a request, 8 times the same bytes in one field, for any
// holder of a key.
const maxHeaderFields = 100

// framing is what a header section says of the body's length, and how
// many times it names the body's type.
type framing struct {
	codings, sized int  // Transfer-Encoding and Content-Length lines
	chunked        bool // the last Transfer-Encoding line is "chunked"
	typed          int  // Content-Type lines
}

// read counts a raw header line (not empty, without its line end) if it
// frames the body, refuses a look-alike of a framing field's name, and
// checks a Host.
func (f *framing) read(line []byte) error {
	if c := line[0] | 0x20; c != 't' && c != 'c' && c != 'h' { // ASCII lower case
		return nil
	}
	// fasthttp has refused a space before the colon, obs-fold lines and
	// names with a space are refused above: the name is the bytes before
	// the colon.
	name, value, found := bytes.Cut(line, []byte(":"))
	if !found {
		return nil
	}
	switch {
	case bytes.EqualFold(name, []byte("host")):
		return checkHost(value)
	case bytes.EqualFold(name, []byte("transfer-encoding")):
		f.codings++
		f.chunked = bytes.EqualFold(bytes.TrimSpace(value), []byte("chunked"))
	case bytes.EqualFold(name, []byte("content-length")):
		f.sized++
	case bytes.EqualFold(name, []byte("content-type")):
		f.typed++
	case bytes.EqualFold(name, []byte("connection")):
		return refuseEndToEndOptions(value)
	case lookalike(name, "transfer-encoding"), lookalike(name, "content-length"):
		return errFramingLookalike
	}
	return nil
}

// refuseEndToEndOptions returns the refusal of a Connection field's value
// that names as an option (a field for this hop alone, which an
// intermediary removes: RFC 9110 7.6.1) a field without which the request
// means something else, or nil. Sent on without its Idempotency-Key, a
// sale would be one that is not safe to retry (the sales-writer refuses
// it, 400, naming a header the client sent), and a body without its
// Content-Type one read as another; a proxy in front that honours the
// option has sent them so. The other forwarded fields, preferences and
// conditions, are dropped (scrubHeaders): the service answers in full, in
// its defaults.
func refuseEndToEndOptions(value []byte) error {
	if len(value) < shortestRefusedOption { // keep-alive, close: every request's, the search skipped
		return nil
	}
	for option := range connectionOptions(value) {
		switch {
		case bytes.EqualFold(option, []byte(idempotencyKeyHeader)):
			return errConnectionNamesIdempotencyKey
		case bytes.EqualFold(option, []byte(fiber.HeaderContentType)):
			return errConnectionNamesContentType
		}
	}
	return nil
}

// shortestRefusedOption is the length of the shortest option
// refuseEndToEndOptions refuses: a shorter value names none of them. A
// name added to its switch goes here too.
const shortestRefusedOption = min(len(idempotencyKeyHeader), len(fiber.HeaderContentType))

// lookalike reports whether name reads as the framing field's name, in any
// case, once each "_" in it is read as "-" (a name with a space is refused
// before, errSpaceInFieldName; fasthttp refuses a tab in a name itself).
func lookalike(name []byte, field string) bool {
	if len(name) != len(field) {
		return false
	}
	for i, ch := range name {
		switch {
		case ch == '_':
			ch = '-'
		case 'A' <= ch && ch <= 'Z':
			ch += 'a' - 'A'
		}
		if ch != field[i] {
			return false
		}
	}
	return true
}

// ambiguous reports a request whose length two parsers could read
// differently: one with a Transfer-Encoding and a Content-Length (fasthttp
// frames it by the chunks), with a Transfer-Encoding in HTTP/1.0, which
// has none, with a Transfer-Encoding other than one "chunked" (fasthttp
// reads no body after "identity", and takes the body for the next
// request), or with trailer fields (hasTrailerFields). A proxy in front
// that framed it otherwise would take the rest of the body for another
// request, or the other way round: request smuggling. RFC 9112 6.1 allows
// refusing a Transfer-Encoding with a Content-Length, or in HTTP/1.0, and
// requires a 400 for a final coding other than chunked.
func (f framing) ambiguous(h *fasthttp.RequestHeader) bool {
	if f.codings == 0 {
		return false
	}
	return f.codings > 1 || !f.chunked || f.sized > 0 || !h.IsHTTP11() || hasTrailerFields(h)
}

// checkHost refuses a Host value (as sent, between spaces or tabs) that is
// no uri-host [":" port] (RFC 9112 3.2, RFC 3986 3.2.2): a byte that no
// reg-name, IP literal or port holds; user info (an '@') is named, as it
// may have carried a key, also beside another such byte before it
// ("user:<key><@gw" was an invalid Host, without the advice to revoke). fasthttp refuses a space, a '/', a port that is
// not digits or a '[' without ']' itself (its URL parse), but serves
// "u@gw", "g<w" or UTF-8. The gateway routes by no Host and sends the
// services its own, so the check is RFC 9112's 400 and what an ingress
// would otherwise see differently, not a routing matter.
func checkHost(value []byte) error {
	host := trimBlanks(value)
	for _, ch := range host {
		if hostBytes[ch] {
			continue
		}
		if bytes.IndexByte(host, '@') >= 0 {
			return errHostUserInfo
		}
		return errInvalidHost
	}
	return nil
}

// trimBlanks is b without the spaces and tabs around it (bytes.Trim builds
// its set of bytes on every call).
func trimBlanks(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// hostBytes are the bytes a Host may hold: a reg-name's (unreserved,
// %-escapes, sub-delims), an IP literal's brackets and colons, a port's
// digits.
var hostBytes = func() (table [256]bool) {
	for _, ch := range []byte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~%!$&'()*+,;=:[]") {
		table[ch] = true
	}
	return table
}()

// hasTrailerFields reports whether a chunked request brought fields after
// its last chunk. fasthttp keeps them in a trailer section of their own,
// but Peek and PeekAll read that section after the header section, so the
// key lookup, the Idempotency-Key and whatever reads headers would take
// them for fields of the header section, which anything in front (a WAF,
// an edge rule) inspected without them; RFC 9110 6.5.1 forbids that merge,
// and no route here has a use for trailers, so they are refused.
// TrailerHeader writes that section out, one line per field received,
// also one with an empty value (against its doc comment; TestHasTrailerFields
// holds it to that), and ends it with the blank line; a Trailer field in
// the header section only announces names and adds none.
func hasTrailerFields(h *fasthttp.RequestHeader) bool {
	return len(h.TrailerHeader()) > len("\r\n")
}

// checkPath refuses the raw paths that the services would read otherwise
// than the gateway's routing did: like Go's ServeMux behind it, the routing
// matches raw segments (so "a%2Fb" is one), but a "." or ".." segment names
// no route there (pkg/httpserver answers an unclean path 404), and Go's HTTP
// server refuses a "%" without two hex digits with a bare 400, no envelope.
// No item id is "." or "..", and none needs a broken escape.
func checkPath(path []byte) error {
	for segment := range bytes.SplitSeq(path, []byte("/")) {
		if string(segment) == "." || string(segment) == ".." {
			return errNotFound
		}
	}
	for i, ch := range path {
		if ch == '%' && (i+2 >= len(path) || !isHex(path[i+1]) || !isHex(path[i+2])) {
			return errBadPathEscape
		}
	}
	return nil
}

func isHex(ch byte) bool {
	return '0' <= ch && ch <= '9' || 'a' <= ch && ch <= 'f' || 'A' <= ch && ch <= 'F'
}
