package httpserver

import (
	"net/http"
	"net/http/pprof"
	runtimepprof "runtime/pprof"
	"strings"
	"sync"

	"github.com/coinexport/export/pkg/envelope"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AdminHandler serves a process's admin listener: Prometheus /metrics and
// the Go profiler under /debug/pprof/, in their own formats; every error
// (no such path or profile, another method, a bad parameter, a second CPU
// profile at once: 409 profile_in_use) is the envelope. The admin address is private (loopback
// by default, a pod port no Service exposes in Kubernetes), so profiles of a
// live process are one `go tool pprof` away without a restart.
func AdminHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc(profileIndex, pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", oneAtATime(pprof.Profile, "a CPU profile"))
	// go tool pprof asks for symbols with a POST of addresses.
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", oneAtATime(pprof.Trace, "an execution trace"))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler, pattern := mux.Handler(r)
		switch {
		case pattern == "":
			noRoute(w, r, handler) // an envelope, not ServeMux's text
		case pattern == profileIndex && unknownProfile(r.URL.Path):
			envelope.WriteError(w, http.StatusNotFound, "not_found", "no such profile", RequestID(r))
		default:
			serveWithErrorEnvelope(handler, w, r)
		}
	})
}

// serveWithErrorEnvelope serves r with h, but answers an error h writes as
// its own text (pprof's bad parameters, a CPU profile while another runs)
// as the envelope instead: the status is kept, the text becomes the
// message. pprof's texts are fixed strings, never the request's input;
// promhttp's 500 names the collector that failed, which is what the
// operator on this private port needs.
func serveWithErrorEnvelope(h http.Handler, w http.ResponseWriter, r *http.Request) {
	held := &errorHolder{ResponseWriter: w}
	h.ServeHTTP(held, r)
	if held.status == 0 {
		return
	}
	// Left by pprof for the profile it meant to send.
	w.Header().Del("Content-Disposition")
	w.Header().Del("X-Go-Pprof")
	message := adminErrorMessage(held.text)
	if redirect(held.status) { // ServeMux's to a clean path (//metrics, /debug/pprof): its text is HTML
		message = "this path is served as " + w.Header().Get("Location")
	}
	envelope.WriteError(w, held.status, adminErrorCode(held.status), message, RequestID(r))
}

// redirect reports a redirect status: ServeMux answers a path that is not
// clean (//metrics, /./metrics) or lacks a subtree's slash (/debug/pprof)
// with one, and an HTML body that becomes the envelope, the status and
// Location kept, so that a browser or curl -L still follows it.
func redirect(status int) bool { return status >= 300 && status < 400 }

// errorHolder passes a success (or an envelope) through as it is written,
// and holds back an error status (400 or more) or a redirect with the text
// that follows it.
type errorHolder struct {
	http.ResponseWriter
	status int // the error status held back; 0 if none
	text   []byte
}

// maxAdminErrorText bounds the text kept for an error's message.
const maxAdminErrorText = 200

func (e *errorHolder) WriteHeader(status int) {
	// An envelope already (oneAtATime's refusal) passes as it is.
	alreadyEnvelope := e.Header().Get("Content-Type") == envelope.ContentType
	if (status >= 400 || redirect(status)) && e.status == 0 && !alreadyEnvelope {
		e.status = status
		return
	}
	e.ResponseWriter.WriteHeader(status)
}

func (e *errorHolder) Write(b []byte) (int, error) {
	if e.status == 0 {
		return e.ResponseWriter.Write(b)
	}
	if room := maxAdminErrorText - len(e.text); room > 0 {
		e.text = append(e.text, b[:min(len(b), room)]...)
	}
	return len(b), nil
}

// Unwrap lets http.ResponseController reach the connection: pprof extends
// the write deadline of a long profile through it.
func (e *errorHolder) Unwrap() http.ResponseWriter { return e.ResponseWriter }

func adminErrorCode(status int) string {
	switch {
	case status == http.StatusNotFound:
		return "not_found"
	case status == http.StatusRequestTimeout:
		return "request_timeout"
	case status >= 500:
		return "internal_error"
	case redirect(status):
		return "moved"
	}
	return "invalid_parameter"
}

func adminErrorMessage(text []byte) string {
	if msg := strings.TrimSpace(string(text)); msg != "" {
		return msg
	}
	return "the request could not be served"
}

// oneAtATime serves h to one request at a time and answers any other that
// comes meanwhile 409 profile_in_use: the runtime records one CPU profile
// and one execution trace at a time, and pprof would answer the second
// with a 500, which reads as a broken process to the operator (or the
// alert) that sees it.
func oneAtATime(h http.HandlerFunc, what string) http.HandlerFunc {
	var running sync.Mutex
	message := what + " is being recorded already; retry when it ends"
	return func(w http.ResponseWriter, r *http.Request) {
		if !running.TryLock() {
			envelope.WriteError(w, http.StatusConflict, "profile_in_use", message, RequestID(r))
			return
		}
		defer running.Unlock()
		h(w, r)
	}
}

// profileIndex is pprof's index, which also serves each named profile.
const profileIndex = "GET /debug/pprof/"

// unknownProfile reports whether path names a profile the runtime does not
// have, which pprof.Index would answer with a bare text 404.
func unknownProfile(path string) bool {
	name, ok := strings.CutPrefix(path, "/debug/pprof/")
	return ok && name != "" && runtimepprof.Lookup(name) == nil
}
