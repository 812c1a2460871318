package edge

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/gateway/lingerclose"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/valyala/fasthttp"
)

// A connection accepted while GATEWAY_MAX_CONNECTIONS are open
// (conncap.Listener) never reaches fasthttp: it is answered here with the
// envelope, 503 unavailable with Retry-After and Connection: close, and
// closed in stages (lingerclose), so that a client still sending its
// request reads the answer instead of a reset. fasthttp's own bound,
// Server.Concurrency, would answer a plain-text 503.

const (
	// refusalWait is how long a refused connection is given to send the
	// start of its request before it is answered. An answer that comes
	// before the request can reach the client as one it never asked for:
	// Go's Transport reads a new connection before it has written on it,
	// and bytes that come before it counts on an answer are logged
	// "Unsolicited response received on idle HTTP channel" and the
	// connection closed: its caller gets an error instead of the 503 (a
	// race the request usually wins; the tests could not make it lose on
	// loopback, so TestARefusalWaitsForTheRequest checks the wait itself).
	// A client that sends nothing is answered once the wait is over, as
	// a 408 would be.
	refusalWait = time.Second
	// maxRefusalsWaiting bounds the refused connections waiting at once,
	// a goroutine and a small buffer each (a few MiB in all); past it a
	// connection is answered at once.
	maxRefusalsWaiting = 256
	// maxRefusalsLingering bounds the refused connections lingering at
	// their close at once (lingerclose, 16 KiB and a goroutine each, ~6
	// MiB in all), apart from the 1,024 of the gateway's other closes: on
	// those, a flood of refused clients that keep their end open would
	// take every place, and a 413 of a body still arriving would be closed
	// at once, its client reading a reset instead of the envelope. Past it
	// a refused connection is closed at once, a reset only for a client
	// still sending more than the refusal read.
	maxRefusalsLingering = 256
	// refusalWriteTimeout bounds the answer's write: on a new connection
	// the kernel's send buffer takes it whole at once.
	refusalWriteTimeout = time.Second
	// refusedLogInterval is how often a flood of refusals is logged: one
	// WARN at most, saying how many there were since the last.
	refusedLogInterval = 10 * time.Second
)

// refuseConnection answers c, a connection over GATEWAY_MAX_CONNECTIONS,
// and closes it, without blocking the accepting goroutine.
func (g *Gateway) refuseConnection(c net.Conn) {
	g.metrics.connectionsRefused.Inc()
	if !g.refusals.startWaiting() {
		g.answerRefused(c)
		return
	}
	go func() {
		defer g.refusals.endWaiting()
		g.refusals.awaitRequest(c, g.refusalWait)
		g.answerRefused(c)
	}()
}

// refusals are the refused connections waiting for their request. The
// shutdown answers them at once (end): left waiting, they would be closed
// unanswered by the process's exit, their clients reading an end of
// stream.
type refusals struct {
	mu    sync.Mutex
	ended bool
	// count is how many wait now, done tells when each has ended.
	count atomic.Int64
	done  sync.WaitGroup
	// stopped is cancelled by end, waking the waits.
	stopped context.Context
	stop    context.CancelFunc
}

func newRefusals() *refusals {
	r := &refusals{}
	r.stopped, r.stop = context.WithCancel(context.Background())
	return r
}

// waiting is how many refused connections wait for their request now.
func (r *refusals) waiting() int64 { return r.count.Load() }

// startWaiting takes a waiting place, unless maxRefusalsWaiting are taken
// or the gateway is stopping: the refusal is then answered at once.
func (r *refusals) startWaiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended || r.count.Load() >= maxRefusalsWaiting {
		return false
	}
	r.count.Add(1)
	r.done.Add(1)
	return true
}

func (r *refusals) endWaiting() {
	r.count.Add(-1)
	r.done.Done()
}

// awaitRequest waits, at most wait and no longer than the gateway runs,
// for c's client to send something, and throws away what it read: the
// connection is answered without reading its request, and the rest is
// drained at the close.
func (r *refusals) awaitRequest(c net.Conn, wait time.Duration) {
	if c.SetReadDeadline(time.Now().Add(wait)) != nil {
		return
	}
	// Registered after the wait's own deadline, which would replace the
	// past one a stop sets.
	defer context.AfterFunc(r.stopped, func() { _ = c.SetReadDeadline(aLongTimeAgo) })()
	var discard [512]byte
	_, _ = c.Read(discard[:])
}

// aLongTimeAgo is a deadline already past: it wakes a blocked Read.
var aLongTimeAgo = time.Unix(1, 0)

// end answers the refusals still waiting, and any later one at once, and
// returns once each was answered and closed (its write bounded by
// refusalWriteTimeout), or when ctx ends.
func (r *refusals) end(ctx context.Context) {
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
	r.stop()
	ended := make(chan struct{})
	go func() {
		r.done.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-ctx.Done():
	}
}

// answerRefused writes the refusal's envelope on c, logs it (throttled)
// and closes c.
func (g *Gateway) answerRefused(c net.Conn) {
	requestID := httpserver.RandomRequestID()
	if ok, skipped := g.refusedLog.Allow("refused"); ok {
		// The peer is the one refused connection's (an ingress in front
		// is its own): with a cap shared by all clients, what tells a
		// flood from one client from growth in all of them.
		g.log.Warn("connection refused: GATEWAY_MAX_CONNECTIONS connections are open",
			"max_connections", g.cfg.MaxConnections, "refused_since_last_line", skipped+1, "request_id", requestID,
			"peer_ip", peerIP(c))
	}
	_ = c.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
	_ = writeRefusal(c, requestID) // a client already gone: nothing to do
	_ = g.closeRefused(c)
}

// closeRefused closes c lingering on the refusals' own budget. c is what
// conncap accepted from lingerclose: a *lingerclose.Conn, unless the
// connection is not TCP.
func (g *Gateway) closeRefused(c net.Conn) error {
	if lc, ok := c.(*lingerclose.Conn); ok {
		return lc.CloseOn(g.refusalsLingering)
	}
	return c.Close()
}

// writeRefusal writes the whole answer to a refused connection on w, in
// one write. The response and its buffer are fasthttp's pooled ones: a
// flood is answered on the accepting goroutine, and Response.String's
// fresh buffers made 6.9 KB of garbage an answer (BenchmarkRefusalAnswer).
func writeRefusal(w io.Writer, requestID string) error {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	setErrorAnswer(resp, errTooManyConnections, requestID)
	resp.Header.Set(envelope.RequestIDHeader, requestID)
	_, err := resp.WriteTo(w)
	return err
}

// peerIP is c's remote address without its port, or "" if it has none.
func peerIP(c net.Conn) string {
	if tcp, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return ""
}
