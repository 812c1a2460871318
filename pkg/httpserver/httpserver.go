// Package httpserver runs the net/http services behind the gateway. It wraps a
// service's routes with what is the same for each of them: an OpenTelemetry
// server span continuing the gateway's trace, verification of the identity
// the gateway signed, the error envelope for unknown routes, wrong methods and
// panics, one access log line per request, Prometheus metrics on a separate
// admin listener, and a graceful shutdown.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/pkg/acceptretry"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// Config describes one service's server.
type Config struct {
	Service   string // e.g. "export-reader"; names the spans, logs and metrics
	Addr      string // main listener, reached only by the gateway
	AdminAddr string // /metrics and /debug/pprof listener; empty disables it
	Log       *slog.Logger
	Signer    *identity.Signer
	// Ready reports whether the service can serve (e.g. a PostgreSQL ping);
	// GET /healthz answers 503 when it fails. Nil means always ready.
	Ready func(context.Context) error
	// ShutdownTimeout bounds the drain of in-flight requests
	// (DefaultShutdownTimeout when zero).
	ShutdownTimeout time.Duration
	// ShutdownDelay is how long the service serves on after the stop
	// signal, before the drain closes its listener: GET /healthz answers
	// 503 from the signal on, and every connection closes after its next
	// answer (idle ones at once), so that no connection is left idle for
	// the drain to close under a request just sent on it (serveOn). Zero:
	// none. Skipped when no connection is open at the signal.
	ShutdownDelay time.Duration
	// TracerProvider makes the server spans; nil means the global one.
	TracerProvider trace.TracerProvider
	// PanicMessage is the message of the 500 answered for a handler that
	// panicked; "internal error" when empty. A service whose calls change
	// state says how to retry one that may have been done (sales-writer).
	PanicMessage string
	// PanicNotes are recorded on that 500's access line and span, as
	// Annotate records them: what its message claims, where the service
	// records the claim of its other answers (sales-writer's sale_applied).
	// A handler that knows better answers its panic itself
	// (AnswerPanicWith).
	PanicNotes map[string]string
}

// Server is a service's HTTP server.
type Server struct {
	cfg      Config
	routes   *http.ServeMux
	registry *prometheus.Registry
	metrics  *httpMetrics
	tracer   trace.Tracer
	handler  http.Handler
	// refusedLog lets through one "identity refused" and one "not ready"
	// warning per interval: every request of a gateway whose secret
	// differs is refused, and so is anything that reaches the port without
	// the gateway; every gateway probes an instance that is out 4 times a
	// second.
	refusedLog *logging.Throttle
	// logUnread logs the answers net/http gave before routing (unread).
	logUnread UnreadFunc
	// inFlight counts the requests being served, for the shutdown's log
	// lines (how many a drain waits for, and how many it cut off) and its
	// wait for those it cut off (awaitCutOff).
	inFlight atomic.Int64
	// conns counts the main listener's open connections (serveOn).
	conns atomic.Int64
	// stopping is set at the stop signal: /healthz answers 503 from then.
	stopping atomic.Bool
	// listen opens a listener (net.Listen; tests make one fail).
	listen func(network, addr string) (net.Listener, error)
}

// DefaultShutdownTimeout is how long a service drains its in-flight
// requests after the stop signal, unless its Config says otherwise: each
// service sets a drain that outlasts its calls (DrainOutlasting), this one
// at least. A pod's or container's grace period must outlast the drain and
// the last flush of spans (each binary's settings test holds the manifests
// to its own: Binary.Stop in pkg/envdoc).
const DefaultShutdownTimeout = 10 * time.Second

// DefaultShutdownDelay is the ShutdownDelay of the services that serve on
// after the stop signal (sales-writer, export-reader): a gateway's probe
// interval and its wait for the answer (UPSTREAM_PROBE_INTERVAL, 2 s, and
// 1 s), so that by its end every gateway has heard the 503 and sends the
// instance nothing more.
const DefaultShutdownDelay = 3 * time.Second

// AnswerWriteMargin is the time a drain leaves a call's answer to be
// written once the call has ended by its own bound (DrainOutlasting).
const AnswerWriteMargin = 2 * time.Second

// DrainOutlasting is the ShutdownTimeout of a service whose calls end by
// their own bound, call: the longest call in flight at the stop signal
// and the writing of its answer, never less than DefaultShutdownTimeout.
// A drain no longer than a call's bound cuts off the call that started
// just before the signal and took its whole bound, where the call would
// have answered (its result, or its own timeout's answer) a moment later.
func DrainOutlasting(call time.Duration) time.Duration {
	return max(call+AnswerWriteMargin, DefaultShutdownTimeout)
}

// refusedLogInterval is how often at most each throttled warning is
// logged: a refused identity, not ready (refusedLog), and each error code
// of an answer net/http gave before routing (LogUnread).
const refusedLogInterval = 10 * time.Second

// New wraps routes. Register every route of the service on routes before
// calling Handler or Run; patterns use Go 1.22 syntax ("GET /v1/x/{id}").
func New(cfg Config, routes *http.ServeMux) *Server {
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	s := &Server{cfg: cfg, routes: routes, registry: reg, metrics: newHTTPMetrics(reg),
		tracer:     tp.Tracer("github.com/coinexport/export/pkg/httpserver"),
		refusedLog: &logging.Throttle{Interval: refusedLogInterval}, logUnread: LogUnread(cfg.Log),
		listen: net.Listen}
	s.handler = s.counted(s.traced(s.dispatch()))
	return s
}

// Registry is where the service registers metrics of its own.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Handler is the service's whole HTTP handler, for tests through httptest.
func (s *Server) Handler() http.Handler { return s.handler }

// Run serves until ctx is done, or until a listener fails (its error,
// naming it, is returned), then drains in-flight requests.
func (s *Server) Run(ctx context.Context) error {
	// Every request's context descends from base, so that the requests a
	// drain cuts off are cancelled with ErrCutOff as their cause (CutOff),
	// not taken for requests whose caller hung up; so are any still served
	// when Run returns.
	base, cutOff := context.WithCancelCause(context.Background())
	defer cutOff(ErrCutOff)
	servers := s.servers(base)
	listeners, err := s.listenAll(servers)
	if err != nil {
		return err
	}
	failures := make(chan error, len(servers))
	names := []string{"main", "admin"}
	for i, srv := range servers {
		s.cfg.Log.Info("listening", "addr", listeners[i].Addr().String())
		go func() {
			// Serve returns before the drain only on an accept error it
			// cannot wait out (acceptretry waits out a shortage).
			if err := srv.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				failures <- fmt.Errorf("httpserver: %s listener %s stopped serving: %w", names[i], listeners[i].Addr(), err)
			}
		}()
	}
	// A listener that fails stops the process, drained as on a stop
	// signal: returning with the other one still serving left a service
	// without metrics, or metrics without a service, until main exited,
	// and cut off the requests in flight undrained.
	var failed error
	select {
	case failed = <-failures:
		s.cfg.Log.Error("listener failed: stopping", "error", failed)
	case <-ctx.Done():
		failed = s.serveOn(servers[0], failures)
	}
	return errors.Join(failed, s.drain(servers, cutOff))
}

// servers are the main server, whose requests' contexts descend from base,
// and the admin one when the Config has an AdminAddr, in that order.
func (s *Server) servers(base context.Context) []*http.Server {
	main := &http.Server{
		Addr:              s.cfg.Addr,
		Handler:           s.handler,
		BaseContext:       func(net.Listener) context.Context { return base },
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    32 << 10,
		ErrorLog:          slog.NewLogLogger(s.cfg.Log.Handler(), slog.LevelWarn),
		// "OPTIONS *" goes to the handler too (an envelope), not to
		// net/http's own empty 200.
		DisableGeneralOptionsHandler: true,
		ConnState:                    s.countConn,
	}
	if s.cfg.AdminAddr == "" {
		return []*http.Server{main}
	}
	return []*http.Server{main, {
		Addr:                         s.cfg.AdminAddr,
		Handler:                      AdminHandler(s.registry),
		ReadHeaderTimeout:            5 * time.Second,
		MaxHeaderBytes:               32 << 10,
		DisableGeneralOptionsHandler: true,
	}}
}

// listenAll opens a listener for each server, in order, or none: every
// address is taken before any is served, so that a second one taken
// already does not leave the first serving after Run returned.
func (s *Server) listenAll(servers []*http.Server) ([]net.Listener, error) {
	listeners := make([]net.Listener, 0, len(servers))
	for _, srv := range servers {
		ln, err := s.listen("tcp", srv.Addr)
		if err != nil {
			for _, open := range listeners {
				open.Close()
			}
			return nil, fmt.Errorf("httpserver: listen %s: %w", srv.Addr, err)
		}
		// net/http waits out a shortage of descriptors itself, but logs
		// each failed accept, once a second for as long as it lasts.
		ln = acceptretry.New(ln, acceptretry.LogRetries(s.cfg.Log))
		listeners = append(listeners, UnreadAsEnvelope(ln, s.unread))
	}
	return listeners, nil
}

// countConn keeps conns, the main listener's open connections.
func (s *Server) countConn(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		s.conns.Add(1)
	case http.StateClosed, http.StateHijacked:
		s.conns.Add(-1)
	}
}

// serveOn serves on for the ShutdownDelay after the stop signal, unready
// and closing every connection after its answer, so that the drain finds
// none idle. The drain closes the listener, then the idle connections: a
// gateway that had just sent a sale on one found it closed unread, sent
// it again on a new connection, found the listener closed too, and
// answered 502 "the sale may have been applied" for a sale never read
// (20 of about 35,000 calls over 10 restarts of a lone writer). Closed
// here, while the listener is open, such a connection's repeat is served;
// and the gateways' probes, answered 503, stop new calls coming before
// the listener closes and resets any connection not yet accepted. With no
// connection open there is none to close under a request, and the drain
// starts at once (make run's Ctrl-C, which stops the gateway first).
func (s *Server) serveOn(main *http.Server, failures <-chan error) error {
	s.stopping.Store(true)
	if s.cfg.ShutdownDelay <= 0 {
		return nil
	}
	open := s.conns.Load()
	main.SetKeepAlivesEnabled(false) // closes the idle connections now
	if open == 0 {
		s.cfg.Log.Info("stop signal: no connection open, draining at once")
		return nil
	}
	s.cfg.Log.Info("stop signal: serving on, unready, each connection closed after its answer", "delay", s.cfg.ShutdownDelay.String(), "connections", open)
	select {
	case <-time.After(s.cfg.ShutdownDelay):
		return nil
	case err := <-failures:
		s.cfg.Log.Error("listener failed: stopping", "error", err)
		return err
	}
}

// drain shuts the servers down, waiting for their requests in flight for
// at most the ShutdownTimeout, and cuts off (cutOff, then Close) those
// still running then.
func (s *Server) drain(servers []*http.Server, cutOff context.CancelCauseFunc) error {
	// Said at once: a drain may take the whole ShutdownTimeout, and a log
	// silent until "stopped" reads as a hung process.
	s.cfg.Log.Info("draining", "in_flight", s.inFlight.Load(), "timeout", s.cfg.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	var firstErr error
	for _, srv := range servers {
		if err := srv.Shutdown(shutdownCtx); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("httpserver: shutdown: %w", err)
		}
	}
	if firstErr != nil {
		// Shutdown leaves the requests it gave up on running: cancelled,
		// their queries stop and give their connections back, and closed,
		// their connections end. Left running, they held the pool, whose
		// Close (deferred by main) waited for them, up to a query timeout
		// past the drain and so past the grace period a supervisor allows.
		// Their clients see the connection close without an answer, or
		// the service's 503 when a handler answered between its
		// cancellation and the close (cancelled first, so that the cause
		// is ErrCutOff, not a closed connection's); their access lines, if
		// written before the process ends, carry that 503 (CutOff), not a
		// 499 of a caller that left.
		cutOff(ErrCutOff)
		for _, srv := range servers {
			srv.Close()
		}
		s.cfg.Log.Warn("drain timed out: requests cut off", "cut_off", s.inFlight.Load(), "timeout", s.cfg.ShutdownTimeout.String())
		s.awaitCutOff()
	}
	s.cfg.Log.Info("stopped")
	return firstErr
}

// CutOffWait bounds the wait for the handlers of requests cut off to return
// once cancelled: a handler whose query is cancelled returns within
// milliseconds, and a hung one is not waited for longer than this, kept
// small beside the last flush of spans. It counts in a service's stop
// after SIGTERM, which its grace periods must outlast (each service's
// TestSettingsAsDocumentedAndDeployed adds it).
const CutOffWait = 500 * time.Millisecond

// awaitCutOff waits, for CutOffWait at most, for the handlers of the
// requests cut off to return, so that their access lines and server spans
// are written before Run returns and main flushes the spans and exits.
// Without it the process would log "stopped" first and exit without their
// server spans: their traces would hold the spans of their queries and
// shop requests without the parent.
func (s *Server) awaitCutOff() {
	deadline := time.Now().Add(CutOffWait)
	for s.inFlight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// counted counts the requests in flight (inFlight) around next, the span's
// end included.
func (s *Server) counted(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inFlight.Add(1)
		defer s.inFlight.Add(-1)
		next.ServeHTTP(w, r)
	})
}
