package edge

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the gateway's Prometheus series, on a registry of its own.
type metrics struct {
	registry        *prometheus.Registry
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	rateDecisions   *prometheus.CounterVec
	rateDegraded    prometheus.Gauge
	rateRedisErrors prometheus.Counter
	keyCache        *prometheus.CounterVec
	upstreamErrors  *prometheus.CounterVec
	upstreamRetries *prometheus.CounterVec
	panics          prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_http_requests_total", Help: "Requests answered, by route and status class.",
		}, []string{"route", "status_class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gateway_http_request_duration_seconds", Help: "Time to the response headers, by route and status class.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "status_class"}),
		rateDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_ratelimit_decisions_total",
			Help: "Rate-limit decisions by class, decision (allowed, limited) and backend (redis; local = Redis unusable, in-process fallback).",
		}, []string{"class", "decision", "backend"}),
		rateDegraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gateway_ratelimit_degraded", Help: "1 while Redis is unusable and the in-process limiter decides.",
		}),
		rateRedisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_ratelimit_redis_failures_total", Help: "Times Redis turned unusable for rate limiting.",
		}),
		keyCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_key_cache_lookups_total", Help: "API key lookups by cache result (hit, miss).",
		}, []string{"result"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_upstream_errors_total",
			Help: "Failed proxy hops by upstream and kind (unavailable, unreachable, timeout, bad_response).",
		}, []string{"upstream", "kind"}),
		upstreamRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_upstream_retries_total", Help: "Requests sent a second time to another instance.",
		}, []string{"upstream"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_panics_total", Help: "Panics recovered while serving a request.",
		}),
	}
	m.registry.MustRegister(m.requests, m.duration, m.rateDecisions, m.rateDegraded, m.rateRedisErrors,
		m.keyCache, m.upstreamErrors, m.upstreamRetries, m.panics,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// statusClass turns 404 into "4xx".
func statusClass(status int) string {
	return strconv.Itoa(status/100) + "xx"
}
