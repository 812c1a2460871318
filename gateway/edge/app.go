package edge

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// clientWriteBufferSize is the buffer fasthttp writes an answer through
// (its default): a held page decides by it whether its connection holds a
// write (relayedStream.WriteTo), and a held write is at most one buffer.
const clientWriteBufferSize = 4096

// newApp builds the Fiber app: one handler per line of the routing table
// and a catch-all that answers 404 or 405.
func (g *Gateway) newApp() *fiber.App {
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

		ReadBufferSize:  g.cfg.MaxHeaderBytes,
		WriteBufferSize: clientWriteBufferSize,
		ReadTimeout:     g.cfg.ReadTimeout,
		WriteTimeout:    g.cfg.WriteTimeout,
		IdleTimeout:     g.cfg.IdleTimeout,
		// Errors Fiber raises before a handler runs (413, 431, 408, and
		// 400, a network error's 502 included: fromFiber). A client that
		// left mid-request is answered 499 before them
		// (answerUnreadableRequests).
		ErrorHandler: g.serverError,
	})
	for _, rt := range servedRoutes {
		app.Add(rt.Method, rt.Path, g.handler(rt))
	}
	serveUnmatched := g.unmatchedHandler()
	app.Use(serveUnmatched)
	g.answerUnknownMethods(app, serveUnmatched)
	g.refuseLargeBodiesBeforeContinue(app)
	g.answerUnreadableRequests(app)
	g.noteUnreadableUserInfo(app)
	g.closeConnectionsWhileDraining(app)
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
			g.noteContinue(rctx)
			return fasthttp.StatusContinue
		}
		c := app.AcquireCtx(rctx)
		defer app.ReleaseCtx(c)
		g.refuseTooLarge(c, errTooLarge)
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
	defer c.Request().ReleaseBody(keptBodyBufferBytes)
	g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	rq := g.beginRecorded(c, name, time.Time{}, !rt.HealthCheck)
	defer g.requests.remove(g.requests.add(rq))
	defer g.end(c, rq, rm)
	if err := g.guardedServe(c, rq, rt); err != nil {
		g.writeError(c, rq, err)
	}
}

// keptBodyBufferBytes is the largest request body buffer a connection
// keeps once its request is answered. fasthttp keeps a kept-alive
// connection's buffer until its next request (all of them, unless
// ReduceMemoryUsage, which is off: gateway README, "Connections"): one that
// carried a body near BodyLimit held 85 KB idle instead of ~21 KB, and
// 4,096 of them 398 MB, past the pod's memory limit that
// GATEWAY_MAX_CONNECTIONS is sized for (TestAnIdleConnectionHoldsNoRequestBody).
// A larger buffer is left to the collector; the next body takes one from
// fasthttp's pool.
const keptBodyBufferBytes = 4 << 10

// serverError answers the errors Fiber raises before routing (body too
// large, headers too large, read timeout, a request that could not be
// read); the request gets its own trace all the same.
func (g *Gateway) serverError(c *fiber.Ctx, err error) error {
	if bodyTooLarge(err) && c.Request().Header.ContentLength() > BodyLimit {
		// Refused on its declared length once its headers were read whole:
		// named after its route, as the 413 with Expect is. A chunked body
		// passing the limit comes with the request reset (fasthttp's
		// ReadBody), its method and path lost: unrouted, below.
		g.refuseTooLarge(c, err)
		return nil
	}
	g.unreadable(c, err, notedUnreadReason(c.Context()), "")
	return nil
}

// refuseTooLarge answers a body over BodyLimit refused before its route
// ran, named as that route would name it: the route, the key when the
// cache knows it, and a sale's item and Idempotency-Key, which the line of
// every other sale the gateway answers names (no writer's line does).
func (g *Gateway) refuseTooLarge(c *fiber.Ctx, err error) {
	name := routeNameOf(c.Method(), c.Path())
	rq := g.begin(c, name)
	defer g.end(c, rq, g.routeMetrics[name])
	g.nameKnownKey(c, rq)
	if item, ok := saleItemOf(c.Method(), c.Path()); ok {
		rq.noteSaleOf(item, c)
	}
	g.writeError(c, rq, err)
}

// unreadable answers (and logs, and counts) a request that could not be
// read whole. fasthttp hands it over with the request reset or partly
// read, so its method and path are then its defaults (GET /), not the
// client's: it is unrouted. A 400 names reason, the part that could not
// be read (unreadReason); a 408, 413, 431 or 499 says it by its status.
// authFailure, if not "", goes on its access line (key_in_url: a key may
// have travelled in its user info).
func (g *Gateway) unreadable(c *fiber.Ctx, err error, reason, authFailure string) {
	rq := g.beginAt(c, "unrouted", readStart(c.Context(), time.Time{}))
	rq.method, rq.path, rq.authFailure = httpserver.MethodOther, "", authFailure
	defer g.end(c, rq, g.unroutedMetrics)
	g.writeError(c, rq, err)
	if c.Response().StatusCode() == fiber.StatusBadRequest {
		rq.unreadReason = reason
	}
}

// answerUnreadableRequests answers a request whose client closed or reset the
// connection before sending it whole (a client killed or timed out
// mid-upload, a load balancer's TCP check) as a client that left: 499
// client_closed_request, the services' and nginx's status for it, which no
// one reads. Fiber's own handler made it a 502 (a network error) or a 400
// with the error's text, which the gateway answered 400 bad_request, a
// client's fault it had not made. Every other error goes to Fiber's handler
// without its text unless it is a timeout (untold): Fiber takes any error
// whose text has "timeout" for one, and fasthttp's text quotes the bytes it
// could not read, so a malformed request saying "timeout" was answered and
// logged 408 request_timeout. Its chain stays, so that Fiber's checks by
// type before the text (an oversized head's 431, a body's 413) still hold.
func (g *Gateway) answerUnreadableRequests(app *fiber.App) {
	server := app.Server()
	fiberErrors := server.ErrorHandler
	server.ErrorHandler = func(rctx *fasthttp.RequestCtx, err error) {
		if !clientLeft(err) {
			noteUnreadReason(rctx, err)
			if !timedOut(err) {
				err = untold{err}
			}
			fiberErrors(rctx, err)
			return
		}
		c := app.AcquireCtx(rctx)
		defer app.ReleaseCtx(c)
		g.unreadable(c, errClientLeft, "", "")
	}
}

// untold is an error without its text: fasthttp's quotes the request's
// bytes, which Fiber's handler reads for the word "timeout".
type untold struct{ err error }

func (u untold) Error() string { return "the request could not be read" }
func (u untold) Unwrap() error { return u.err }

// timedOut reports whether err, fasthttp's for a request it could not
// read, is its connection's read deadline passing. fasthttp wraps most
// such errors, but two come without the net.Error: a chunk's size line
// cut short (ErrBrokenChunk, which does not unwrap: its text quotes at
// most one byte of the request, so "timeout" there is its read's) and a
// chunked body's missing trailer (its own ErrTimeout). Both are a client
// that stopped sending: a 408 (TestAClientThatStopsSendingIsA408WhereverItStops).
func timedOut(err error) bool {
	var ne net.Error
	var brokenChunk fasthttp.ErrBrokenChunk
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, fasthttp.ErrTimeout) ||
		errors.As(err, &brokenChunk)
}

// noteUnreadableUserInfo answers a request whose URL fasthttp could not
// read (urlUnreadable), and whose authority holds user info
// (userInfoSent), with the advice to revoke a key that may have travelled
// in it (errUnreadableUserInfo): user info with a character a URL's may
// not hold, or readable user info before a host fasthttp cannot read,
// fails fasthttp's parse before any route, and was answered "the request
// could not be read" alone, where a readable URL with a key is refused
// with that advice (keyInUserInfo). So is a header value or a request
// target fasthttp refused for a control byte or DEL in it (before any URL
// is read: a Host "user:<key>\x7f@gw", a target
// "http://user:<key>\x01@gw/...") whose user info looks like it holds a
// key (keyLikeUserInfoRefused); one that does not is no more told apart
// from any other header or target refused so. The access line says key_in_url when the
// user info looks like it holds a key (keyLikeUserInfo). Nothing of the
// user info is kept, logged or traced: urlUnreadable's parse drops it
// with its error.
func (g *Gateway) noteUnreadableUserInfo(app *fiber.App) {
	server := app.Server()
	otherErrors := server.ErrorHandler
	server.ErrorHandler = func(rctx *fasthttp.RequestCtx, err error) {
		h := &rctx.Request.Header
		keyLike := keyLikeUserInfoRefused(err)
		authority, sent := userInfoSent(h)
		if !keyLike && (!sent || !urlUnreadable(h)) {
			otherErrors(rctx, err)
			return
		}
		authFailure := ""
		if keyLike || keyLikeUserInfo(authority) {
			authFailure = authFailureKeyInURL
		}
		c := app.AcquireCtx(rctx)
		defer app.ReleaseCtx(c)
		g.unreadable(c, errUnreadableUserInfo, unreadUserInfo, authFailure)
	}
}

// keyLikeUserInfoRefused reports whether err is fasthttp's refusal of a
// header value or of the request target (a control byte or DEL in it),
// which its text quotes after refusedValuePrefix or refusedTargetPrefix,
// that holds user info looking like it holds a key (keyLikeUserInfo).
// fasthttp's text names no field, so in a value the '@' before which
// keyLikeUserInfo looks is what says user info; in a target, its
// authority's (targetAuthority).
func keyLikeUserInfoRefused(err error) bool {
	for link := err; link != nil; link = errors.Unwrap(link) {
		text := link.Error()
		if value, found := strings.CutPrefix(text, refusedValuePrefix); found {
			return keyLikeUserInfo(unquotePrefix(value))
		}
		if target, found := strings.CutPrefix(text, refusedTargetPrefix); found {
			authority, _ := targetAuthority(unquotePrefix(target))
			return keyLikeUserInfo(authority)
		}
	}
	return false
}

// unquotePrefix is the Go-quoted string text starts with, unquoted (what
// fasthttp quotes with %q, before its own words may go on), or nil.
func unquotePrefix(text string) []byte {
	quoted, err := strconv.QuotedPrefix(text)
	if err != nil {
		return nil
	}
	unquoted, err := strconv.Unquote(quoted)
	if err != nil {
		return nil
	}
	return []byte(unquoted)
}

// urlUnreadable reports whether fasthttp cannot read the URL of the
// request h heads, which then failed on it: fasthttp reads the URL as soon
// as the head is whole, before the body, and hands its error handler a
// request it could not read whole (a read timeout, a client that left)
// with an empty head. Its error alone does not say: ErrorInvalidURI for
// user info or a control character, errors of their own for a host it
// cannot read (a port that is not digits, a '[' without ']', a bad
// %-escape). Only requests that failed with user info sent pay for the
// parse.
func urlUnreadable(h *fasthttp.RequestHeader) bool {
	var u fasthttp.URI
	return u.Parse(h.Host(), h.RequestURI()) != nil
}

// userInfoSent reports an '@' in the authority of the request's URL as
// fasthttp takes it (URI.parse, splitHostURI), and returns that authority:
// the Host header, but for a target not in origin-form that holds "://",
// or any without a Host header, the target's, between "//" and its path,
// query or fragment.
func userInfoSent(h *fasthttp.RequestHeader) (authority []byte, sent bool) {
	target, authority := h.RequestURI(), h.Host()
	originForm := len(target) > 1 && target[0] == '/' && target[1] != '/'
	if len(authority) == 0 || (!originForm && bytes.Contains(target, []byte("://"))) {
		if own, found := targetAuthority(target); found {
			authority = own
		}
	}
	return authority, bytes.IndexByte(authority, '@') >= 0
}

// targetAuthority is the authority of a request target, as fasthttp takes
// it: between the "//" that no '/' comes before and the path, query or
// fragment; found is false for a target without one.
func targetAuthority(target []byte) (authority []byte, found bool) {
	scheme, rest, found := bytes.Cut(target, []byte("//"))
	if !found || bytes.IndexByte(scheme, '/') >= 0 {
		return nil, false
	}
	if end := bytes.IndexAny(rest, "/?#"); end >= 0 {
		rest = rest[:end]
	}
	return rest, true
}

// closeConnectionsWhileDraining answers Connection: close from the stop
// signal on (Drain, through GATEWAY_SHUTDOWN_DELAY), where fasthttp's
// CloseOnShutdown says it only from the drain after the delay. A client
// that keeps connections (nginx's keepalive to its upstreams) then lets
// each go at its next answer; told nothing, it held them idle until the
// drain closed them, and a POST it sent on one as it closed was lost
// unanswered, which nginx does not send again: its 502, 1 of 928 calls
// while a gateway stopped (TestTheREADMEsIngressSetUps). Set after the
// handler, so that every answer it writes, Fiber's error handler's
// included, says it.
func (g *Gateway) closeConnectionsWhileDraining(app *fiber.App) {
	server := app.Server()
	serve := server.Handler
	server.Handler = func(rctx *fasthttp.RequestCtx) {
		serve(rctx)
		if g.draining.Load() {
			rctx.Response.SetConnectionClose()
		}
	}
}

// clientLeft reports whether err, fasthttp's for a request it could not
// read, is its connection closed (at its end) or reset before the request
// was whole: not a timeout, nor a request malformed or too large.
func clientLeft(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || chunkCutByClient(err)
}

// chunkCutByClient reports fasthttp's error for a chunked body whose
// client closed or reset its connection in a chunk's size line or in the
// trailer, every chunk sent: an ErrBrokenChunk around the read's io.EOF or
// ECONNRESET, or io.ErrUnexpectedEOF alone (Request.ReadLimitBody), which
// does not unwrap (its field is unexported), so told by the end of its
// text, the read error's. fasthttp's own words before it quote at most one
// byte of the request, never at the end (invalid character 'x' after
// chunk size), so the request's bytes cannot pass for it. Missed, such a
// close was answered and logged 400 chunked_body, a malformed request,
// where every other close mid-request is a 499
// (TestAResetConnectionIsNoServerError).
func chunkCutByClient(err error) bool {
	var brokenChunk fasthttp.ErrBrokenChunk
	if !errors.As(err, &brokenChunk) {
		return false
	}
	text := brokenChunk.Error()
	return text == io.ErrUnexpectedEOF.Error() || strings.HasSuffix(text, ": "+io.EOF.Error()) ||
		strings.HasSuffix(text, ": "+syscall.ECONNRESET.Error())
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

// guardedServe serves the route, turning a panic into a 500
// (panicError), logged with its stack once.
func (g *Gateway) guardedServe(c *fiber.Ctx, rq *request, rt route) (err error) {
	defer func() {
		if r := recover(); r != nil {
			g.metrics.panics.Inc()
			g.log.ErrorContext(rq.ctx, "panic while serving", "panic", fmt.Sprint(r), "stack", string(debug.Stack()),
				"may_have_sent", rq.mayHaveSent)
			err = panicError(c, rq, rt)
		}
	}()
	return g.serve(c, rq, rt)
}

// panicError is the 500 of a panic while serving rq. On a sale sent with
// an Idempotency-Key it says what is known of the sale: nothing was
// applied while the request had not gone upstream, else it may have been,
// and the retry under the same key settles it. It said "internal error"
// alone, which told a platform neither to keep the key nor that it need
// not reconcile.
func panicError(c *fiber.Ctx, rq *request, rt route) *apiError {
	switch {
	case !isIdempotentSale(c, rt):
		return errInternal
	case rq.mayHaveSent:
		return errSaleInternal
	}
	return errSaleInternalNothingSent
}

// serve runs the route's steps: the refusals of what cannot be served as
// read, then the pipeline of a keyless route or of a keyed one (key, scope,
// the owner's requests in flight, limit per key, proxy).
func (g *Gateway) serve(c *fiber.Ctx, rq *request, rt route) error {
	if err := refuseUnservable(c, rt); err != nil {
		if err == errHostUserInfo && keyLikeUserInfo(c.Request().Header.Host()) {
			// The key travelled in a URL's authority: the access line says
			// so, as for a target's user info, for the SRE who looks for
			// the owner that is to revoke it.
			rq.authFailure = authFailureKeyInURL
		}
		return err
	}
	if rt.RepeatWithIdempotencyKey { // the sale routes
		rq.noteSale(c)
	}
	if rq.keyInPath || keyInQuery(c) || keyInUserInfo(c) {
		if err := g.refuseKeyInURL(rq, rt); err != nil {
			return err
		}
	}
	if err := refuseTargetUserInfo(c, rq); err != nil {
		return err
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
	if err := g.takeOwnerSlot(rq, rt); err != nil {
		return err
	}
	if rt.StreamsLargeAnswers {
		return g.serveUntilRelayed(c, rq, rt)
	}
	// These routes' answers are read whole before they are relayed (a
	// sale's: a few hundred bytes): the slot is held while the upstream
	// works, not while a slow client reads.
	defer rq.endCall()
	if err := g.limit(rq, rt.Class, "key:", rq.key.ID); err != nil {
		return err
	}
	return g.proxy(c, rq, rt)
}

// serveUntilRelayed is the rest of serve for a route whose answers may be
// large (StreamsLargeAnswers: list pages, items): the owner's slot taken
// is held until an answer over smallAnswerBytes has left the gateway, so
// that an owner's clients, however slowly they read, have at most its
// share of the export routes' large answers in the gateway and
// export-reader's connections at once.
// Released when the upstream had answered, as for the other routes, the
// slot let one key hold a 5 MB page in the gateway for each request it
// sent: 100 connections reading large pages slowly held 850 MB there
// (gateway README, "Answers of large items").
func (g *Gateway) serveUntilRelayed(c *fiber.Ctx, rq *request, rt route) error {
	return g.limitThenRelay(c, rq, rt, "key:", rq.key.ID, rq)
}

// limitThenRelay asks the route's rate limit for who, then proxies until
// the answer has left (proxyUntilRelayed), which ends the call taken
// before it (end: an owner's slot, an address's shop schema slot). Until
// then the call is ended here, on a refusal or on a panic, which
// guardedServe answers: released on the refusal alone, a panic there would
// hold the slot for the process's life.
func (g *Gateway) limitThenRelay(c *fiber.Ctx, rq *request, rt route, kind, who string, end callEnd) error {
	handedOver := false
	defer func() {
		if !handedOver {
			end.endCall()
		}
	}()
	if err := g.limit(rq, rt.Class, kind, who); err != nil {
		return err
	}
	handedOver = true
	return g.proxyUntilRelayed(c, rq, rt, end)
}

// serveKeyless serves a route that takes no key (spec 5: health, shop
// schema), limited per client address; a shop schema call also holds one
// of the address's slots until its answer has left.
func (g *Gateway) serveKeyless(c *fiber.Ctx, rq *request, rt route) error {
	address := addressBucket(rq.clientIP)
	if rt.Class == classShopSchema {
		return g.serveShopSchema(c, rq, rt, address)
	}
	if rt.Upstream == "" && g.clientAddr.isProxy(rq.clientIP) {
		// A load balancer's own health check: every check of every
		// gateway from its one address spent that address's budget, shared
		// in Redis, and 10 gateways checked each second (HAProxy's inter
		// 1s) used RATE_LIMIT_ANONYMOUS' 600 a minute: the checks got 429
		// and took every gateway out.
		return g.serveHealth(c, rq)
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
	return g.limitThenRelay(c, rq, rt, "ip:", address, endFunc(release))
}
