package edge

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// An answer cut short at its client: fasthttp writes an answer after the
// handler has returned, after its access line, and drops a failed write
// ("broken pipe", "reset by peer", its write deadline passing) without a
// word. Each client connection is wrapped (answerConn) so that it knows the
// answer it is writing, and a failed write is logged and counted under
// that answer's request id (cutAnswer).

// cutCause is why an answer was cut short: its name (cutCauses) is the
// cause label of gateway_answers_cut_total and the cause field of its line.
type cutCause int

const (
	cutClientLeft   cutCause = iota // the client closed or reset its connection, or the kernel gave up on it
	cutWriteTimeout                 // GATEWAY_WRITE_TIMEOUT passed: the client had stopped reading
	cutOther                        // any other write error (none seen: kept for what a kernel or Go may add)
)

var cutCauses = [...]string{cutClientLeft: "client_left", cutWriteTimeout: "write_timeout", cutOther: "other"}

// causeOf names err, a failed write to a client's connection. Only the
// deadline's own error is the write timeout: ETIMEDOUT, the kernel giving
// up on a client that stopped acknowledging, says Timeout() too, and is a
// client gone (TestAnAnswerIsCutByTheWriteTimeoutOnlyWhenItPassed).
func causeOf(err error) cutCause {
	switch {
	case errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ETIMEDOUT):
		return cutClientLeft
	case errors.Is(err, os.ErrDeadlineExceeded):
		return cutWriteTimeout
	}
	return cutOther
}

// answerListener hands out answerConns that report a cut through cut.
type answerListener struct {
	net.Listener
	cut func(a *answerNote, sent int64, err error)
}

func (l *answerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &answerConn{Conn: c, cut: l.cut}, nil
}

// answerConn is a client's connection that knows the answer it is writing.
// fasthttp serves a connection's requests and writes their answers on one
// goroutine, the one that runs the handler: no lock is needed.
type answerConn struct {
	net.Conn
	cut func(a *answerNote, sent int64, err error)
	// sent is the bytes the socket has taken, answers' heads included.
	sent   int64
	answer answerNote
	// hold has the next write held (holdNextWrite); held is what it
	// took, nil when nothing is held; bufs and vec are the writev that
	// sends it with the write after it, kept here so that it allocates
	// nothing.
	hold bool
	held *[]byte
	bufs net.Buffers
	vec  [2][]byte
}

// answerNote is the answer being written: set when its request ends (end),
// before fasthttp writes it; cleared once a write failed, or when fasthttp
// writes something that is not it (a later request's 100 Continue).
type answerNote struct {
	set           bool
	span          trace.SpanContext // the request id's
	method, route string
	status        int
	cuts          *[len(cutCauses)]prometheus.Counter
	// from is sent when the request ended. The answer before it was flushed
	// whole by then (noteAnswer), so every byte written from there on is
	// this answer's.
	from int64
}

// Write writes, and reports a failure to the answer it cut. A write to
// hold (holdNextWrite) is only kept, and leaves with the next one.
func (c *answerConn) Write(p []byte) (int, error) {
	switch {
	case c.hold && len(p) <= maxHeldWrite:
		c.hold = false
		c.held = heldWrites.Get().(*[]byte)
		*c.held = append((*c.held)[:0], p...)
		return len(p), nil
	case c.held != nil:
		return c.writeAfterHeld(p)
	}
	c.hold = false // not a write it can hold: the writes are not the ones expected
	n, err := c.Conn.Write(p)
	c.took(int64(n), err)
	return n, err
}

// took counts n bytes the socket took, and reports err, the failure of
// the write that took them, to the answer it cut.
func (c *answerConn) took(n int64, err error) {
	c.sent += n
	if err != nil && c.answer.set {
		c.answer.set = false
		c.cut(&c.answer, c.sent-c.answer.from, err)
	}
}

// noteAnswer tells the connection of c, if it is an answerConn, the answer
// about to be written (and a page held whole, its connection: to leave in
// one writev, relayedStream.WriteTo), and has fasthttp flush it on its own: a handler
// that sets the write deadline makes fasthttp flush each answer once
// written. Without it, an answer to a pipelined request (the next one
// already read) waits in fasthttp's write buffer, to go with the next
// answer's first bytes: a write that failed then cut two answers, and the
// bytes written from the second's start counted the first's.
func (g *Gateway) noteAnswer(c *fiber.Ctx, rq *request, status int, rm *routeMetrics) {
	rctx := c.Context()
	ac, ok := rctx.Conn().(*answerConn)
	if !ok {
		return
	}
	g.setWriteDeadline(rctx)
	if status == httpserver.StatusClientClosed {
		// Its client left before its request was whole (answerUnreadableRequests),
		// as its access line says: the answer is written to no one, and a
		// line for it would repeat that for each load balancer's TCP check.
		ac.answer.set = false
		return
	}
	ac.answer = answerNote{set: true, span: rq.span.SpanContext(), method: rq.method, route: rq.route, status: status,
		cuts: &rm.cuts, from: ac.sent}
	if page, ok := c.Response().BodyStream().(*relayedStream); ok {
		page.client = ac
	}
}

// noteContinue tells the connection of rctx, if it is an answerConn, that
// what it writes next is a 100 Continue, not the last answer noted (which
// was flushed by then), and gives it a write deadline.
func (g *Gateway) noteContinue(rctx *fasthttp.RequestCtx) {
	if ac, ok := rctx.Conn().(*answerConn); ok {
		ac.answer.set = false
		g.setWriteDeadline(rctx)
	}
}

// setWriteDeadline gives what fasthttp writes next on rctx's connection
// GATEWAY_WRITE_TIMEOUT from now, the deadline fasthttp sets itself before
// a handler's answer alone. Once a deadline the handler set has served its
// answer, fasthttp clears it: a write after it that the gateway gives none
// (a 100 Continue, a 499) had none, and to a client that reads nothing
// could block for as long as that client kept its connection
// (TestEveryWriteToAClientHasADeadline).
func (g *Gateway) setWriteDeadline(rctx *fasthttp.RequestCtx) {
	// GATEWAY_WRITE_TIMEOUT is at least a millisecond (LoadConfig).
	_ = rctx.SetWriteDeadline(time.Now().Add(g.cfg.WriteTimeout)) // fails only on a connection already closed
}

// cutAnswer logs and counts answer a, cut short by err once its client's
// connection had taken sent bytes of it (its head included; the client got
// at most these: a reset drops what it had not read). No header or byte
// of the request is logged, nor the error's text (it names addresses).
func (g *Gateway) cutAnswer(a *answerNote, sent int64, err error) {
	cause := causeOf(err)
	a.cuts[cause].Inc()
	ctx := trace.ContextWithSpanContext(context.Background(), a.span)
	g.log.LogAttrs(ctx, slog.LevelWarn, "answer cut short",
		slog.String("method", a.method), slog.String("route", a.route), slog.Int("status", a.status),
		slog.String("cause", cutCauses[cause]), slog.Int64("answer_bytes_sent", sent))
}
