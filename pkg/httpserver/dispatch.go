package httpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// healthPath answers the gateway's health probe without an identity.
const healthPath = "/healthz"

// A request whose caller hung up before the answer gets nginx's status 499
// and this code: nobody reads it, but logs, metrics and spans then tell it
// from a failure of the service.
const (
	StatusClientClosed = 499
	CodeClientClosed   = "client_closed_request"
)

// AttrErrorCode is the span attribute holding the error.code of an error
// answer (the access line's error_code). OpenTelemetry's error.type is set
// too, to the same code, on a 5xx only: for a server a 4xx is no failure.
const AttrErrorCode = attribute.Key("app.error_code")

// CallerGone reports whether err is what the caller hanging up caused: the
// request's context is done and err is its cancellation. A failure of any
// other kind is itself even after a hang-up, so that a bug does not pass
// for a client that left; and so is a request the server's own drain cut
// off (CutOff), the service's doing.
func CallerGone(r *http.Request, err error) bool {
	return r.Context().Err() != nil && errors.Is(err, context.Canceled) && !CutOff(r, err)
}

// ErrCutOff is the cause of the cancellation of a request that a drain
// ran out of time for (Run): the service stopped it, not its caller.
var ErrCutOff = errors.New("httpserver: cut off by a shutdown whose drain timed out")

// CutOff reports whether err is the cancellation of a request the
// server's drain cut off. Services answer it 503 (nobody reads it; the
// gateway sees the connection close): counted as a 499 of a caller that
// left, the service's own failure hid in the 4xx. err is
// context.Canceled where it comes from a query, and ErrCutOff itself
// where it comes from net/http's client, which returns the context's
// cause (shop-schema's calls to a shop).
func CutOff(r *http.Request, err error) bool {
	return (errors.Is(err, context.Canceled) || errors.Is(err, ErrCutOff)) && errors.Is(context.Cause(r.Context()), ErrCutOff)
}

// RequestID returns the request id of the request in ctx: the one the gateway
// signed, or the current trace id when there is none.
func RequestID(r *http.Request) string {
	if id, ok := identity.FromContext(r.Context()); ok && id.RequestID != "" {
		return id.RequestID
	}
	if sc := trace.SpanContextFromContext(r.Context()); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	// Untraced paths (the health probe) still get a unique id.
	return RandomRequestID()
}

// RandomRequestID is a unique request id, shaped like a trace id, for a
// request that has no trace id to use.
func RandomRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// panicAnswer is the message of the 500 answered for a panicking handler,
// and the notes its line and span record: the handler's own
// (AnswerPanicWith), else the service's.
func (s *Server) panicAnswer(rec *statusRecorder) (message string, notes map[string]string) {
	if rec.panicAnswer != nil {
		return rec.panicAnswer()
	}
	if s.cfg.PanicMessage != "" {
		return s.cfg.PanicMessage, s.cfg.PanicNotes
	}
	return "internal error", s.cfg.PanicNotes
}

// AnswerPanicWith has a panic of the handler given w answered with the
// message and notes that answer returns when the panic comes, in place of
// Config's PanicMessage and PanicNotes: for a handler whose answer to a
// panic depends on how far it got (the sales writer's: whether a
// statement of the sale was sent to PostgreSQL, before which nothing was
// applied). answer must not panic.
func AnswerPanicWith(w http.ResponseWriter, answer func() (message string, notes map[string]string)) {
	if rec, ok := w.(*statusRecorder); ok {
		rec.panicAnswer = answer
	}
}

// dispatch verifies the caller, routes, and records the outcome.
func (s *Server) dispatch() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK,
			keepNotes: s.cfg.Log.Enabled(r.Context(), slog.LevelInfo)}
		route := "unmatched"
		defer func() {
			p := recover()
			// The status and part of the body already gone: ended
			// normally, a chunked answer would end well formed, a 200
			// holding half a document. Aborted, the caller reads a broken
			// answer (the gateway: a 502 or a cut relay), or none when all
			// of it was still in net/http's buffer (the gateway sends a GET
			// or a keyed sale again), never a whole one.
			abort := p != nil && rec.wroteHeader
			if p != nil {
				s.recovered(rec, r, p)
			}
			s.observe(r, route, rec, time.Since(start))
			if abort {
				panic(http.ErrAbortHandler)
			}
		}()

		if r.URL.Path == healthPath {
			route = healthPath
			s.serveHealthPath(rec, r)
			return
		}
		// r, from here on with the caller's identity, is also what the
		// deferred observe logs (owner_id) and a panic's answer reads.
		var verified bool
		if r, verified = s.verify(rec, r); !verified {
			return
		}
		// ServeMux would answer an unclean path ("//", "..") with a bare
		// redirect; no route of ours has such a path, so it is a 404 envelope.
		if path.Clean(r.URL.Path) != r.URL.Path {
			envelope.WriteError(rec, http.StatusNotFound, "not_found", "route not found", RequestID(r))
			return
		}
		handler, pattern := s.routes.Handler(r)
		if pattern == "" {
			noRoute(rec, r, handler)
			return
		}
		route = pattern
		nameSpan(r, pattern)
		s.routes.ServeHTTP(rec, r)
	})
}

// serveHealthPath answers the health check, to GET and HEAD alone.
func (s *Server) serveHealthPath(rec *statusRecorder, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(rec, r, "GET, HEAD")
		return
	}
	s.health(rec, r)
}

// verify checks the identity the gateway signed and returns r carrying it
// (and its span annotated with it), or answers 401 and returns false.
func (s *Server) verify(rec *statusRecorder, r *http.Request) (*http.Request, bool) {
	id, err := s.cfg.Signer.Verify(r.Header.Get, identity.RequestOf(r), time.Now())
	if err != nil {
		s.logRefused(r)
		envelope.WriteError(rec, http.StatusUnauthorized, "unauthenticated",
			"the request did not come through the gateway", RequestID(r))
		return r, false
	}
	r = r.WithContext(identity.WithContext(r.Context(), id))
	annotate(r, id)
	return r, true
}

// nameSpan names r's server span after the route pattern that serves it.
func nameSpan(r *http.Request, pattern string) {
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.SetName(pattern)
		span.SetAttributes(semconv.HTTPRoute(pattern))
	}
}

// recovered answers a handler's panic p: counted, logged with its stack,
// the span marked, and a 500 envelope (the handler's own panic answer, see
// AnswerPanicWith) unless the handler had already sent its status: a
// second one cannot follow, and dispatch aborts the answer instead.
func (s *Server) recovered(rec *statusRecorder, r *http.Request, p any) {
	s.metrics.panics.Inc()
	s.cfg.Log.ErrorContext(r.Context(), "panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	trace.SpanFromContext(r.Context()).SetStatus(codes.Error, "panic")
	if rec.wroteHeader {
		return
	}
	message, notes := s.panicAnswer(rec)
	for _, key := range slices.Sorted(maps.Keys(notes)) {
		Annotate(rec, r, key, notes[key])
	}
	envelope.WriteError(rec, http.StatusInternalServerError, "internal_error", message, RequestID(r))
}

// logRefused says why a request was refused, at most once per interval:
// during a secret rotation done in one step instead of two, this line on
// the service's side names the cause the gateway's 502 cannot.
func (s *Server) logRefused(r *http.Request) {
	if ok, skipped := s.refusedLog.Allow("identity"); ok {
		s.cfg.Log.WarnContext(r.Context(), "request refused: its identity is unsigned, signed with a secret other than "+
			"IDENTITY_SECRET and IDENTITY_SECRET_PREVIOUS (shop-schema's: the gateway signs its calls with SHOP_SCHEMA_IDENTITY_SECRET), "+
			"older than identity.MaxSkew (clocks apart), signed for "+
			"another request (a proxy between gateway and service rewrote it), or identity-v1 from a gateway of an "+
			"older build (IDENTITY_ACCEPT_UNBOUND=true while upgrading)",
			"skipped_since_last", skipped, "signed", r.Header.Get(identity.HeaderSignature) != "",
			"method", StableMethod(r.Method), "path", redactedPath(r.URL.Path))
	}
}

// unreadRoute is the route label of requests net/http answered before
// routing (UnreadAsEnvelope).
const unreadRoute = "unread"

// unread counts an answer net/http gave before any handler ran and logs
// it (only a caller beside the gateway can send such a request: the
// gateway refuses each of them itself).
func (s *Server) unread(status int, code, reason, requestID string) {
	s.metrics.count(unreadRoute, MethodOther, status)
	s.logUnread(status, code, reason, requestID)
}

func annotate(r *http.Request, id identity.Identity) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attribute.String("request.id", id.RequestID)}
	if id.OwnerID != "" {
		attrs = append(attrs, attribute.String("owner.id", id.OwnerID), attribute.String("api_key.id", id.KeyID))
	}
	if id.PlatformID != "" {
		attrs = append(attrs, attribute.String("platform.id", id.PlatformID))
	}
	span.SetAttributes(attrs...)
}

// noRoute answers an unknown path with 404 and a known path with another
// method with 405 and Allow, both as envelopes. ServeMux's own fallback
// handler tells the two apart; it runs against a recorder so that only its
// status and Allow header are kept, never its text body.
func noRoute(w http.ResponseWriter, r *http.Request, fallback http.Handler) {
	probe := &headerProbe{header: http.Header{}}
	fallback.ServeHTTP(probe, r)
	if probe.status == http.StatusMethodNotAllowed {
		methodNotAllowed(w, r, probe.header.Get("Allow"))
		return
	}
	envelope.WriteError(w, http.StatusNotFound, "not_found", "route not found", RequestID(r))
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	envelope.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed",
		fmt.Sprintf("method %s is not allowed on this route", r.Method), RequestID(r))
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	requestID := RequestID(r)
	// The gateway signs its probes: one this service cannot verify means
	// every request of that gateway would be refused too (another
	// IDENTITY_SECRET, clocks apart), so the instance is not healthy for
	// it. An unsigned probe (Kubernetes') is answered on readiness alone.
	if r.Header.Get(identity.HeaderSignature) != "" {
		if _, err := s.cfg.Signer.Verify(r.Header.Get, identity.RequestOf(r), time.Now()); err != nil {
			s.logRefused(r)
			envelope.WriteError(w, http.StatusServiceUnavailable, "identity_refused",
				"the prober's signed identity is refused: IDENTITY_SECRET differs from the gateway's (shop-schema's: from its SHOP_SCHEMA_IDENTITY_SECRET), or the clocks do", requestID)
			return
		}
	}
	if s.stopping.Load() {
		// Unready from the stop signal on, so that the gateways stop
		// sending here while the listener is still open (serveOn).
		envelope.WriteError(w, http.StatusServiceUnavailable, "not_ready", "service stopping", requestID)
		return
	}
	if s.cfg.Ready != nil {
		start := time.Now()
		err := s.cfg.Ready(r.Context())
		switch {
		case r.Context().Err() != nil:
			// Slow, whatever the outcome: the prober stopped waiting (the
			// gateway's waits at most a second). The 503 below reaches no
			// one but keeps the health route's metrics true.
			s.cfg.Log.WarnContext(r.Context(), "readiness check outlasted the prober's wait",
				"elapsed", time.Since(start).Round(time.Millisecond).String())
		case err != nil:
			// Every gateway probes every instance 4 times a second while
			// it is out: one line per interval says it, not each probe.
			if ok, skipped := s.refusedLog.Allow("not ready"); ok {
				s.cfg.Log.WarnContext(r.Context(), "not ready", "error", err, "skipped_since_last", skipped)
			}
		}
		if err != nil || r.Context().Err() != nil {
			envelope.WriteError(w, http.StatusServiceUnavailable, "not_ready", "service not ready", requestID)
			return
		}
	}
	envelope.WriteData(w, http.StatusOK, map[string]string{"status": "ok", "service": s.cfg.Service}, envelope.Meta{RequestID: requestID})
}

func (s *Server) observe(r *http.Request, route string, rec *statusRecorder, d time.Duration) {
	status := rec.status
	s.metrics.observe(route, StableMethod(r.Method), status, d)
	if route == healthPath {
		return
	}
	errorCode := ""
	if status >= 400 {
		errorCode = rec.Header().Get(envelope.ErrorCodeHeader)
		if errorCode != "" {
			s.metrics.errors.WithLabelValues(route, errorCode).Inc()
		}
	}
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		attrs := []attribute.KeyValue{semconv.HTTPResponseStatusCode(status)}
		if errorCode != "" {
			attrs = append(attrs, AttrErrorCode.String(errorCode))
			if status >= 500 { // error.type marks a failure, which a 4xx is not for a server
				attrs = append(attrs, semconv.ErrorTypeKey.String(errorCode))
			}
		}
		span.SetAttributes(attrs...)
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	}
	if !s.cfg.Log.Enabled(r.Context(), slog.LevelInfo) {
		return // the line's fields are not even built
	}
	// Attrs, not key-value pairs: each int, float and string boxed into an
	// any was an allocation, on every request.
	var line [accessLineAttrs]slog.Attr
	attrs := append(line[:0], slog.String("method", StableMethod(r.Method)), slog.String("route", route),
		slog.Int("status", status), slog.Float64("duration_ms", float64(d.Microseconds())/1000))
	if errorCode != "" {
		attrs = append(attrs, slog.String("error_code", errorCode))
	}
	if id, ok := identity.FromContext(r.Context()); ok && id.OwnerID != "" {
		attrs = append(attrs, slog.String("owner_id", id.OwnerID))
	}
	attrs = append(attrs, rec.notes...)
	s.cfg.Log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// accessLineAttrs is room for an access line's attributes without an
// allocation: the six above and a handler's notes (the sales writer's
// four).
const accessLineAttrs = 12

// Annotate adds key=value to the request's access line ("request") and, as
// app.<key>, to its server span: what a handler learned of the request that
// an operator who traces it by its request id needs (a sale's
// external_order_id). w is the writer the handler was given. Never a
// secret: access lines and spans are read by many.
func Annotate(w http.ResponseWriter, r *http.Request, key, value string) {
	if rec, ok := w.(*statusRecorder); ok && rec.keepNotes {
		rec.note(slog.String(key, value))
	}
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.SetAttributes(attribute.String("app."+key, value))
	}
}

// AnnotateFlag is Annotate for a fact that holds (idempotent_replay): the
// access line and the span record it as the boolean true, as the answer's
// own JSON does, so a log query for it reads the same type in both.
func AnnotateFlag(w http.ResponseWriter, r *http.Request, key string) {
	if rec, ok := w.(*statusRecorder); ok && rec.keepNotes {
		rec.note(slog.Bool(key, true))
	}
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.SetAttributes(attribute.Bool("app."+key, true))
	}
}

// AnnotateClientValue is Annotate for a value the client chose (an item
// id, an order id, an Idempotency-Key): one holding something like an API
// key (apikey.ContainsKeyLike: whole, mistyped or cut short) is replaced,
// since a client that pasted its key there would otherwise have it in
// every log store and trace, and one longer than maxClientValue characters
// is cut (the contract's ids are at most 128). Control characters, line
// separators and bytes that are not UTF-8 (an item id decoded from %0A or %FF, an
// Idempotency-Key of obs-text) become U+FFFD: a span holding a string
// that is not UTF-8 cannot be encoded for OTLP, and its whole export batch
// was dropped with it; a raw newline or escape sequence would reach any
// log viewer that shows values as they are.
func AnnotateClientValue(w http.ResponseWriter, r *http.Request, key, value string) {
	Annotate(w, r, key, LoggableClientValue(value))
}

// maxClientValue is the longest client-chosen value a log line keeps whole.
const maxClientValue = 128

// LoggableClientValue is value as AnnotateClientValue records it.
func LoggableClientValue(value string) string {
	if apikey.ContainsKeyLike(value) {
		return "[holds an API key]"
	}
	if !utf8.ValidString(value) || strings.ContainsFunc(value, control) {
		value = strings.Map(func(r rune) rune {
			if control(r) {
				return utf8.RuneError
			}
			return r
		}, strings.ToValidUTF8(value, string(utf8.RuneError)))
	}
	if utf8.RuneCountInString(value) > maxClientValue {
		return string([]rune(value)[:maxClientValue]) + "…"
	}
	return value
}

// control reports a control character (C0, DEL, C1 with NEL) or a
// Unicode line or paragraph separator: what would break or drive the line
// a value is shown on.
func control(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029'
}

// statusRecorder remembers the status written through it. Unwrap lets
// http.ResponseController reach Flush on the real writer, so streamed
// responses stay streamed.
type statusRecorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	notes       []slog.Attr // Annotate's, for the access line
	keepNotes   bool        // the access line is written (info enabled): notes are kept
	// noteRoom holds the first notes in the recorder's own allocation.
	noteRoom [4]slog.Attr
	// panicAnswer is the handler's answer to its own panic (AnswerPanicWith).
	panicAnswer func() (message string, notes map[string]string)
}

// note keeps a for the access line.
func (s *statusRecorder) note(a slog.Attr) {
	if s.notes == nil {
		s.notes = s.noteRoom[:0]
	}
	s.notes = append(s.notes, a)
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wroteHeader {
		s.status, s.wroteHeader = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.wroteHeader = true
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// headerProbe captures what ServeMux's fallback handler would answer.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *headerProbe) WriteHeader(code int)        { p.status = code }
