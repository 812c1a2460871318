package edge

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// newApp builds the Fiber app: one handler per line of the routing table
// and a catch-all that answers 404 or 405.
func (g *Gateway) newApp() *fiber.App {
	g.unroutedMetrics = g.metrics.forRoute("unrouted")
	g.routeMetrics = map[string]*routeMetrics{}
	for _, name := range routeNames() {
		g.routeMetrics[name] = g.metrics.forRoute(name)
	}
	g.decisionMetrics = g.metrics.forDecisions([]string{classExportRead, classSalesWrite, classAnonymous,
		classShopSchema, classAuthFailures})
	g.shopSlotDecisions = g.metrics.forSlots(classShopSchemaInFlight)
	g.ownerSlotDecisions = g.metrics.forSlots(classOwnerInFlight)
	g.metrics.forUpstreams(g.upstreams)
	app := fiber.New(fiber.Config{
		AppName:               "gateway",
		DisableStartupMessage: true,
		// Values read from Fiber's buffers are copied where they outlive the
		// handler (cache keys are hashes; span and log fields are cloned),
		// so the zero-copy mode stays on.
		Immutable:     false,
		CaseSensitive: true,
		StrictRouting: true,
		// fasthttp refuses a longer body (serverError's 413) on its declared
		// length, or once a chunked one passes it, unread: the connection is
		// then closed in stages (lingerclose), so that a client still
		// sending it reads the 413.
		BodyLimit: BodyLimit,
		// A multipart/form-data body is read by its Content-Length like any
		// other. fasthttp would parse the form while reading it and stop at
		// its last boundary, as far as its 4 KiB buffer had read, and read
		// the rest of the body (an epilogue) as the next request: request
		// smuggling past anything in front (FuzzFraming). No route takes a
		// form.
		DisablePreParseMultipartForm: true,

		ReadBufferSize: g.cfg.MaxHeaderBytes,
		ReadTimeout:    g.cfg.ReadTimeout,
		WriteTimeout:   g.cfg.WriteTimeout,
		IdleTimeout:    g.cfg.IdleTimeout,
		// Errors Fiber raises before a handler runs (413, 431, 408, 400,
		// and 502 for a connection the client reset: fromFiber).
		ErrorHandler: g.serverError,
	})
	for _, rt := range servedRoutes {
		app.Add(rt.Method, rt.Path, g.handler(rt))
	}
	serveUnmatched := g.unmatchedHandler()
	app.Use(serveUnmatched)
	g.answerUnknownMethods(app, serveUnmatched)
	g.refuseLargeBodiesBeforeContinue(app)
	// An answer written while the gateway drains says Connection: close:
	// fasthttp closes the connection after it all the same, and a client
	// told nothing sends its next request into the closing connection,
	// where a POST is lost without an answer (TestDrainedAnswerClosesItsConnection).
	app.Server().CloseOnShutdown = true
	return app
}

// refuseLargeBodiesBeforeContinue answers a request that asks
// "Expect: 100-continue" for a body over BodyLimit with the 413 envelope at
// once, instead of the 100 Continue that would have the client send it
// only to be refused after it. fasthttp then calls no handler
// and closes the connection (the client may send the body anyway); the
// envelope is written into the response it sends, and the request is named
// after the route its headers ask for, as the same 413 is when the body
// comes without Expect. fasthttp's doc says the
// handler must not modify the response; as of v1.78 it sends it as left
// here, and TestExpectContinueIsRefusedForABodyOverTheLimit fails (no
// envelope) if an upgrade changes that.
func (g *Gateway) refuseLargeBodiesBeforeContinue(app *fiber.App) {
	app.Server().ExpectHandler = func(rctx *fasthttp.RequestCtx) int {
		if rctx.Request.Header.ContentLength() <= BodyLimit {
			return fasthttp.StatusContinue
		}
		c := app.AcquireCtx(rctx)
		defer app.ReleaseCtx(c)
		name := routeNameOf(c.Method(), c.Path())
		rq := g.begin(c, name)
		defer g.end(c, rq, g.routeMetrics[name])
		g.nameKnownKey(c, rq)
		g.writeError(c, rq, errTooLarge)
		return errTooLarge.Status // fasthttp sets the answer's status to this
	}
}

// answerUnknownMethods gives a request whose method Fiber does not know
// (FOO, or get in lower case) the catch-all's answer, as for any method a
// route lacks: 405 with Allow on a known path, 404 elsewhere. Fiber itself
// would answer it with a bare text 400 before any handler runs, without an
// envelope or a request id.
func (g *Gateway) answerUnknownMethods(app *fiber.App, serveUnmatched fiber.Handler) {
	server := app.Server()
	serve := server.Handler
	server.Handler = func(rctx *fasthttp.RequestCtx) {
		if knownMethod(rctx.Method()) {
			serve(rctx)
			return
		}
		c := app.AcquireCtx(rctx)
		defer app.ReleaseCtx(c)
		_ = serveUnmatched(c) // the handler answers every error itself
	}
}

// knownMethod reports whether Fiber routes method (the app sets no
// RequestMethods of its own, so Fiber's DefaultMethods).
func knownMethod(method []byte) bool {
	return httpserver.StableMethod(string(method)) != httpserver.MethodOther
}

// handler serves the route's requests (serveAs), named after it.
func (g *Gateway) handler(rt route) fiber.Handler {
	name := rt.Name()
	rm := g.routeMetrics[name]
	return func(c *fiber.Ctx) error {
		g.serveAs(c, rt, name, rm)
		return nil
	}
}

// unmatched stands for every route the routing table lacks.
var unmatched = route{Method: "*", Path: unmatchedName}

// unmatchedHandler answers what no route serves: 404, or 405 on a known
// path. A 405 is named after its path (routeNameOf), so that its access
// line, span and metrics say which path was sent the wrong method.
func (g *Gateway) unmatchedHandler() fiber.Handler {
	return func(c *fiber.Ctx) error {
		name := routeNameOf(c.Method(), c.Path())
		g.serveAs(c, unmatched, name, g.routeMetrics[name])
		return nil
	}
}

// serveAs wraps every request the same way: a server span whose trace id
// is the request id, panic recovery, the one error mapper, then headers,
// the access log line and metrics, under the name given.
func (g *Gateway) serveAs(c *fiber.Ctx, rt route, name string, rm *routeMetrics) {
	g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	rq := g.begin(c, name)
	defer g.end(c, rq, rm)
	if err := g.guardedServe(c, rq, rt); err != nil {
		g.writeError(c, rq, err)
	}
}

// serverError answers the errors Fiber raises before routing (body too
// large, headers too large, read timeout, a request that could not be
// read); the request gets its own trace all the same.
func (g *Gateway) serverError(c *fiber.Ctx, err error) error {
	if bodyTooLarge(err) && c.Request().Header.ContentLength() > BodyLimit {
		// Refused on its declared length once its headers were read whole:
		// named after its route, as the 413 with Expect is. A chunked body
		// passing the limit comes with the request reset (fasthttp's
		// ReadBody), its method and path lost: unrouted, below.
		name := routeNameOf(c.Method(), c.Path())
		rq := g.begin(c, name)
		defer g.end(c, rq, g.routeMetrics[name])
		g.nameKnownKey(c, rq)
		g.writeError(c, rq, err)
		return nil
	}
	rq := g.begin(c, "unrouted")
	// fasthttp hands the other errors over with the request reset or
	// partly read, so its method and path are then its defaults (GET /),
	// not the client's.
	rq.method, rq.path = httpserver.MethodOther, ""
	rq.start = readStart(c.Context(), rq.start)
	defer g.end(c, rq, g.unroutedMetrics)
	g.writeError(c, rq, err)
	return nil
}

// readStart is when the server began to read a request it could not read,
// if that is known: the start of its connection when it was the
// connection's first (fasthttp counts a request only once read whole), so
// that a 408 reads as the whole wait its client made it, not as the
// moment it took to answer. fasthttp keeps no record of when a later
// request on a kept-alive connection began (its read timeout runs from
// that request's first byte), so that one keeps otherwise, when the
// answer began.
func readStart(rctx *fasthttp.RequestCtx, otherwise time.Time) time.Time {
	if rctx.ConnRequestNum() == 0 && !rctx.ConnTime().IsZero() {
		return rctx.ConnTime()
	}
	return otherwise
}

// bodyTooLarge reports Fiber's 413, which fasthttp raises only after the
// request's headers were read whole (ErrBodyTooLarge).
func bodyTooLarge(err error) bool {
	var fe *fiber.Error
	return errors.As(err, &fe) && fe.Code == fiber.StatusRequestEntityTooLarge
}

// guardedServe serves the route, turning a panic into errInternal, logged
// with its stack once.
func (g *Gateway) guardedServe(c *fiber.Ctx, rq *request, rt route) (err error) {
	defer func() {
		if r := recover(); r != nil {
			g.metrics.panics.Inc()
			g.log.ErrorContext(rq.ctx, "panic while serving", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = errInternal
		}
	}()
	return g.serve(c, rq, rt)
}

// misreadHead returns the refusal of a header section that a proxy in
// front could read otherwise than fasthttp did, or nil. Each is refused
// with a 400 and the connection closed (RFC 9112 6.1 requires the close
// after a framing refusal; the others get it too, as the bytes after such
// a head cannot be trusted to start a request):
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
//   - Transfer_Encoding or Content_Length, or with a space for the "-":
//     fasthttp ignores them for framing, a proxy that maps "_" to "-" (as
//     CGI-style front ends do), or reads a space there, frames the body by
//     them (errFramingLookalike);
//   - a length two parsers could read differently (framing.ambiguous).
//
// The raw headers are read, not fasthttp's parsed ones: after an empty
// chunked body fasthttp sets the length to 0 and keeps no trace of the
// chunks. The scan looks at each line's first and last bytes, and cuts
// only lines starting with "t" or "c" at their colon.
func misreadHead(h *fasthttp.RequestHeader) error {
	var f framing
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
		if err := f.read(line); err != nil {
			return err
		}
	}
	if f.ambiguous(h) {
		return errAmbiguousFraming
	}
	return nil
}

// framing is what a header section says of the body's length.
type framing struct {
	codings, sized int  // Transfer-Encoding and Content-Length lines
	chunked        bool // the last Transfer-Encoding line is "chunked"
}

// read counts a raw header line (not empty, without its line end) if it
// frames the body, and refuses a look-alike of a framing field's name.
func (f *framing) read(line []byte) error {
	if c := line[0] | 0x20; c != 't' && c != 'c' { // ASCII lower case
		return nil
	}
	// fasthttp has refused a space before the colon, and obs-fold lines
	// are refused above: the name is the bytes before the colon.
	name, value, found := bytes.Cut(line, []byte(":"))
	if !found {
		return nil
	}
	switch {
	case bytes.EqualFold(name, []byte("transfer-encoding")):
		f.codings++
		f.chunked = bytes.EqualFold(bytes.TrimSpace(value), []byte("chunked"))
	case bytes.EqualFold(name, []byte("content-length")):
		f.sized++
	case lookalike(name, "transfer-encoding"), lookalike(name, "content-length"):
		return errFramingLookalike
	}
	return nil
}

// lookalike reports whether name reads as the framing field's name, in any
// case, once each "_" or space in it is read as "-" (fasthttp takes
// "Transfer Encoding" as a name of its own, as it does "Transfer_Encoding";
// it refuses a tab in a name itself).
func lookalike(name []byte, field string) bool {
	if len(name) != len(field) {
		return false
	}
	for i, ch := range name {
		switch {
		case ch == '_' || ch == ' ':
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

// http1 reports whether a request line's version is HTTP/1.x; fasthttp has
// checked its shape ("HTTP/", digit, ".", digit). A minor version above 1
// is served, with HTTP/1.0's rules (fasthttp reads only "HTTP/1.1" as 1.1):
// no chunked body, the connection closed after the answer.
func http1(proto []byte) bool { return len(proto) == len("HTTP/1.1") && proto[5] == '1' }

func isHex(ch byte) bool {
	return '0' <= ch && ch <= '9' || 'a' <= ch && ch <= 'f' || 'A' <= ch && ch <= 'F'
}

// serve runs the route's steps: the refusals of what cannot be served as
// read, then the pipeline of a keyless route or of a keyed one (key, scope,
// the owner's requests in flight, limit per key, proxy).
func (g *Gateway) serve(c *fiber.Ctx, rq *request, rt route) error {
	if err := refuseUnservable(c, rt); err != nil {
		return err
	}
	if rt.RepeatWithIdempotencyKey { // the sale routes
		rq.noteSale(c)
	}
	if rq.keyInPath || keyInQuery(c) {
		if err := g.refuseKeyInURL(rq, rt); err != nil {
			return err
		}
	}
	if rt.Scope == "" {
		return g.serveKeyless(c, rq, rt)
	}
	if err := g.authenticate(c, rq, rt); err != nil {
		return err
	}
	// The owner's cap before the key's budget: it is decided in the
	// process, so a request it refuses spends no token of its key and no
	// Redis round trip (an owner at its cap, retrying every second, used
	// up its keys' budgets on requests that did no work, each counted
	// allowed by the route's limit and limited by the cap).
	if err := g.takeOwnerSlot(rq); err != nil {
		return err
	}
	// The keyed routes' answers are read whole before they are relayed:
	// the slot is held while the upstream works, not while a slow client
	// reads.
	defer g.releaseOwnerSlot(rq)
	if err := g.limit(rq, rt.Class, "key:", rq.key.ID); err != nil {
		return err
	}
	return g.proxy(c, rq, rt)
}

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

// serveKeyless serves a route that takes no key (spec 5: health, shop
// schema), limited per client address; a shop schema call also holds one
// of the address's slots until its answer has left.
func (g *Gateway) serveKeyless(c *fiber.Ctx, rq *request, rt route) error {
	address := addressBucket(rq.clientIP)
	if rt.Class == classShopSchema {
		return g.serveShopSchema(c, rq, rt, address)
	}
	if err := g.limit(rq, rt.Class, "ip:", address); err != nil {
		return err
	}
	if rt.Upstream == "" {
		return g.serveHealth(c, rq)
	}
	return g.proxy(c, rq, rt)
}

// serveShopSchema takes the address's slot before its rate limit, as
// serve takes the owner's: the slot is decided in the process, so a call
// it refuses spends none of the address's 30 calls a minute (an address
// at its cap, retrying after each Retry-After, used them up on calls that
// did no work, and was then refused for the rest of the minute). The slot
// is held until the answer has left: it is streamed.
func (g *Gateway) serveShopSchema(c *fiber.Ctx, rq *request, rt route, address string) error {
	release, err := g.takeShopSlot(rq, address)
	if err != nil {
		return err
	}
	if err := g.limit(rq, rt.Class, "ip:", address); err != nil {
		release()
		return err
	}
	return g.proxyUntilRelayed(c, rq, rt, release)
}
