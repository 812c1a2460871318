package httpserver

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	panics   prometheus.Counter
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "http_requests_total",
			Help: "Requests served, by route, method and status class.",
		}, []string{"route", "method", "status_class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "http_request_duration_seconds",
			Help: "Time to serve a request, by route, method and status class.",
			// Up to the longest call a service may serve (the shop schema
			// route's 20 s), so that a p99 does not stop at the last bucket.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30},
		}, []string{"route", "method", "status_class"}),
	}
	// By error code: a status class cannot tell a sync restarted by an
	// invalid_cursor (readers with different CURSOR_SECRETs) from any
	// other 400. The codes are the services' own constants, a few dozen.
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "http_errors_total",
		Help: "Error answers, by route and error code (the answer's error.code).",
	}, []string{"route", "code"})
	m.panics = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "http_panics_total", Help: "Panics recovered while serving a request (answered 500; the stack is logged).",
	})
	reg.MustRegister(m.requests, m.duration, m.errors, m.panics)
	return m
}

func (m *httpMetrics) observe(route, method string, status int, d time.Duration) {
	m.count(route, method, status)
	m.duration.WithLabelValues(route, method, statusClass(status)).Observe(d.Seconds())
}

// count counts a request whose duration is not known (one net/http
// answered before routing), so that it does not pull the histogram down.
func (m *httpMetrics) count(route, method string, status int) {
	m.requests.WithLabelValues(route, method, statusClass(status)).Inc()
}

func statusClass(status int) string { return strconv.Itoa(status/100) + "xx" }
