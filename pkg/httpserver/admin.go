package httpserver

import (
	"net/http"
	"net/http/pprof"
	runtimepprof "runtime/pprof"
	"strings"

	"github.com/coinexport/export/pkg/envelope"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AdminHandler serves a process's admin listener: Prometheus /metrics and
// the Go profiler under /debug/pprof/, in their own formats; every routing
// error (no such path or profile, another method) is the envelope (pprof's
// own errors, such as a second CPU profile at once, stay its text). The admin address is private (loopback
// by default, a pod port no Service exposes in Kubernetes), so profiles of a
// live process are one `go tool pprof` away without a restart.
func AdminHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc(profileIndex, pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	// go tool pprof asks for symbols with a POST of addresses.
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler, pattern := mux.Handler(r)
		switch {
		case pattern == "":
			noRoute(w, r, handler) // an envelope, not ServeMux's text
		case pattern == profileIndex && unknownProfile(r.URL.Path):
			envelope.WriteError(w, http.StatusNotFound, "not_found", "no such profile", RequestID(r))
		default:
			handler.ServeHTTP(w, r)
		}
	})
}

// profileIndex is pprof's index, which also serves each named profile.
const profileIndex = "GET /debug/pprof/"

// unknownProfile reports whether path names a profile the runtime does not
// have, which pprof.Index would answer with a bare text 404.
func unknownProfile(path string) bool {
	name, ok := strings.CutPrefix(path, "/debug/pprof/")
	return ok && name != "" && runtimepprof.Lookup(name) == nil
}
