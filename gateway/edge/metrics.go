package edge

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/gateway/conncap"
	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/lingerclose"
	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// metrics are the gateway's Prometheus series, on a registry of its own.
type metrics struct {
	registry        *prometheus.Registry
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	errors          *prometheus.CounterVec
	rateDecisions   *prometheus.CounterVec
	rateDegraded    prometheus.Gauge
	rateRedisErrors prometheus.Counter
	keyCache        *prometheus.CounterVec
	upstreamErrors  *prometheus.CounterVec
	upstreamRetries *prometheus.CounterVec
	answersCut      *prometheus.CounterVec
	panics          prometheus.Counter
	// connectionsRefused counts the connections refused past
	// GATEWAY_MAX_CONNECTIONS (refuseConnection).
	connectionsRefused prometheus.Counter

	// seriesMu makes one followInstances at a time.
	seriesMu sync.Mutex
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_http_requests_total", Help: "Requests answered, by route and status class.",
		}, []string{"route", "status_class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gateway_http_request_duration_seconds", Help: "Time to the response headers, by route and status class.",
			// Up to a minute: a call may take UPSTREAM_READ_TIMEOUT (30 s)
			// and the shop schema route SHOP_SCHEMA_TIMEOUT (20 s), and a
			// p99 must not stop at the last bucket below them.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60},
		}, []string{"route", "status_class"}),
		// The status class alone hides what went wrong: a rise of 401s
		// (a platform's key revoked), of 404 unmatched (a client calling
		// a path that does not exist) and of 429s is the same 4xx, and the
		// gateway's own refusals reach no service's http_errors_total.
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_http_errors_total",
			Help: "Error answers, by route and error code (the answer's error.code: the gateway's own, or the service's it relays).",
		}, []string{"route", "code"}),
		rateDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_ratelimit_decisions_total",
			Help: "Rate-limit decisions by class, decision (allowed, limited) and backend (redis; local = Redis unusable, in-process fallback; process = a cap counted in the gateway process by design: shop_schema_in_flight, owner_in_flight_export, owner_in_flight_sale, auth_guesses_in_lookup). auth_guesses, the address's budget of unknown keys, is counted only when it refuses.",
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
		// By instance too: with several instances of an upstream, which one
		// fails is what the operator acts on. The label is not "instance",
		// which Prometheus gives every series of a scrape (the gateway's
		// own address), and which would rename ours exported_instance.
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_upstream_errors_total",
			Help: "Proxied requests that failed, by upstream, upstream_instance (scheme://host:port of the instance whose failure the client got; none when every instance was out or the gateway was out of file descriptors or memory) and the kind of the last attempt's failure (unavailable, unreachable, timeout, closed, identity_refused, bad_response, gateway_shortage).",
		}, []string{"upstream", "upstream_instance", "kind"}),
		upstreamRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_upstream_retries_total",
			Help: "Requests sent a second time, by upstream, upstream_instance (scheme://host:port of the instance that failed the first attempt; none for gateway_shortage, the gateway out of file descriptors or memory) and the kind of that failure: failures a client did not see.",
		}, []string{"upstream", "upstream_instance", "kind"}),
		answersCut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_answers_cut_total",
			Help: "Answers the gateway could not finish writing to their client, by route and cause (client_left: the client closed or reset its connection, or the kernel gave up on it; write_timeout: GATEWAY_WRITE_TIMEOUT passed, the client had stopped reading; other). Each also has a warn line, \"answer cut short\", with its request id.",
		}, []string{"route", "cause"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_panics_total", Help: "Panics recovered while serving a request.",
		}),
		connectionsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_connections_refused_total",
			Help: "Client connections refused because GATEWAY_MAX_CONNECTIONS were open: each answered 503 unavailable and closed, counted in no other series.",
		}),
	}
	m.registry.MustRegister(m.requests, m.duration, m.errors, m.rateDecisions, m.rateDegraded, m.rateRedisErrors,
		m.keyCache, m.upstreamErrors, m.upstreamRetries, m.answersCut, m.panics, m.connectionsRefused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// resolveSeries makes, at start, the series requests are counted in (per
// route and status class, per rate-limit decision, per upstream instance
// and failure), so that each shows from the start at 0: an alert on a
// rate needs a series before the first event. Those that every request
// counts in are kept, as a label lookup hashes the values each time.
func (g *Gateway) resolveSeries() {
	g.unroutedMetrics = g.metrics.forRoute("unrouted")
	g.routeMetrics = map[string]*routeMetrics{}
	for _, name := range routeNames() {
		g.routeMetrics[name] = g.metrics.forRoute(name)
	}
	g.decisionMetrics = g.metrics.forDecisions([]string{classExportRead, classSalesWrite, classAnonymous,
		classShopSchema, classAuthFailures})
	// The guess budget is only recorded when it refuses (authBudgetLeft).
	for _, local := range []bool{true, false} {
		g.decisionMetrics[decisionLabels{guessBudget, false, local}] = g.metrics.rateDecisions.WithLabelValues(
			guessBudget, decisionLabel(false), backendLabel(local))
	}
	g.guessLookupDecisions = g.metrics.forSlots(classGuessesInLookup)
	g.shopSlotDecisions = g.metrics.forSlots(classShopSchemaInFlight)
	g.metrics.forUpstreams(g.upstreams)
}

// watchInstances exports how many of u's instances are up and out, read at
// each scrape: what to alert on before every instance is out (and /v1/health
// says degraded), and which upstream it is.
func (m *metrics) watchInstances(u *upstream.Upstream) {
	for _, state := range []string{"up", "out"} {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "gateway_upstream_instances",
			Help:        "Instances of an upstream, by state: up, or out (marked down: refused, 5xx or unanswered probes).",
			ConstLabels: prometheus.Labels{"upstream": u.Name, "state": state},
		}, func() float64 {
			up, all := u.Instances()
			if state == "up" {
				return float64(up)
			}
			return float64(all - up)
		}))
	}
}

// watchHeld exports how full the gateway's bounded in-process structures
// are, read at each scrape under each one's own lock (or from the count it
// keeps anyway), so the request path pays nothing for them. Over weeks they
// tell a structure full by design (at its bound, flat) from one that grows,
// and say when a flood of new keys or addresses filled one.
func (m *metrics) watchHeld(keys *keystore.Store, keyCacheSize int, limiter *ratelimit.Limiter, answers *byteBudget) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gateway_key_cache_entries",
		Help: fmt.Sprintf("API keys the key cache holds (valid, revoked and unknown ones): at most KEY_CACHE_SIZE (%d here), in two generations of half as many.", keyCacheSize),
	}, func() float64 { return float64(keys.Entries()) }))
	m.watchHeldAnswers(answers)
	if limiter == nil { // RATE_LIMIT_ENABLED=false: no limiter, no series
		return
	}
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gateway_ratelimit_leases",
		Help: fmt.Sprintf("Rate-limit leases held (one per key and client address used in the last 10 to 15 s, or holding units or a refusal not yet past): at most %d; past it a new key's decisions go to Redis one by one.", ratelimit.MaxLeases),
	}, func() float64 { return float64(limiter.Leases()) }))
	m.registry.MustRegister(bound("gateway_ratelimit_max_leases", "gateway_ratelimit_leases", ratelimit.MaxLeases))
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gateway_ratelimit_local_keys",
		Help: fmt.Sprintf("Keys and client addresses whose windows the in-process fallback limiter holds (filled only while Redis is unusable): at most %d, in two generations of half as many.", ratelimit.MaxLocalKeys),
	}, func() float64 { return float64(limiter.LocalKeys()) }))
}

// watchHeldAnswers exports the budget of answers held whole (list pages
// and items over 16 KiB while their clients read them, answers without a
// length): the bytes held, and the answers that found it full, by what
// became of them. At its bound, pages and items leave as they come, and a
// client that drops them gets a 200 cut short instead of a 502; answers
// without a length are refused 503.
func (m *metrics) watchHeldAnswers(answers *byteBudget) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gateway_answers_held_bytes",
		Help: fmt.Sprintf("Bytes of answers the gateway holds whole while their clients read them (list pages and items over 16 KiB, answers without a length), counted by their buffers: at most %d (%d MiB), with allocation rounding.", answers.limit, answers.limit>>20),
	}, func() float64 { return float64(answers.bytesHeld()) }))
	m.registry.MustRegister(bound("gateway_answers_held_max_bytes", "gateway_answers_held_bytes", answers.limit))
	for way, count := range map[string]*atomic.Uint64{"streamed": &answers.streamed, "refused": &answers.refused} {
		m.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "gateway_answers_past_held_limit_total",
			Help:        "Answers that found the gateway holding its limit of answers held whole, by what became of them: streamed (relayed as they come, with their length) or refused (503 unavailable: without a length).",
			ConstLabels: prometheus.Labels{"way": way},
		}, func() float64 { return float64(count.Load()) }))
	}
}

// watchConnections exports the client connections open, read at each
// scrape, and their bound, GATEWAY_MAX_CONNECTIONS, unless it is 0 (none).
func (m *metrics) watchConnections(connections *conncap.Listener, maxConnections int) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gateway_connections_open",
		Help: "Client connections open on the public listener, idle ones included (not those lingering at their close); at most gateway_connections_max, GATEWAY_MAX_CONNECTIONS.",
	}, func() float64 { return float64(connections.Open()) }))
	if maxConnections > 0 {
		m.registry.MustRegister(bound("gateway_connections_max", "gateway_connections_open", maxConnections))
	}
}

// watchLingering exports, read at each scrape, the connections lingering
// at their close (lingerclose) on each budget, the budget's bound, and the
// closes that found it full and closed at once: a client still sending
// then reads a reset instead of its answer, the one harm a full budget
// does. budgets are by name: closes, every close of a client connection;
// refusals, those refused past GATEWAY_MAX_CONNECTIONS.
func (m *metrics) watchLingering(budgets map[string]*lingerclose.Budget) {
	for name, b := range budgets {
		labels := prometheus.Labels{"budget": name}
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "gateway_connections_lingering",
			Help:        "Client connections closed by the gateway and lingering (draining what the client still sends, within the idle, time and byte bounds the gateway README gives under Connections), by budget: closes (every close) or refusals (connections refused past GATEWAY_MAX_CONNECTIONS); at most gateway_connections_lingering_max. Not in gateway_connections_open.",
			ConstLabels: labels,
		}, func() float64 { return float64(b.Lingering()) }))
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "gateway_connections_lingering_max",
			Help:        "The bound of gateway_connections_lingering, by budget.",
			ConstLabels: labels,
		}, func() float64 { return float64(b.Max()) }))
		m.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "gateway_connections_linger_refused_total",
			Help:        "Client connections closed at once, without lingering, because their budget's gateway_connections_lingering_max were lingering: a client still sending read a reset instead of its answer.",
			ConstLabels: labels,
		}, func() float64 { return float64(b.TurnedAway()) }))
	}
}

// bound exports the bound of the gauge named of as a series of its own, as
// pgxpool_max_conns and process_max_fds are: the alerts read the gauge
// against it, where a figure written into a rule would go on alerting at
// the old bound once the code changed it.
func bound(name, of string, limit int) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: name,
		Help: fmt.Sprintf("The bound of %s: %d.", of, limit),
	}, func() float64 { return float64(limit) })
}

// statusClass turns 404 into "4xx".
func statusClass(status int) string {
	return strconv.Itoa(status/100) + "xx"
}

// routeMetrics are one route's request series, resolved once per status
// class: a label lookup hashes the label values, which per request costs
// more than the increment itself.
type routeMetrics struct {
	route    string
	m        *metrics
	requests [6]prometheus.Counter  // by status/100; 0 unused
	duration [6]prometheus.Observer // same
	cuts     [len(cutCauses)]prometheus.Counter
}

func (m *metrics) forRoute(route string) *routeMetrics {
	rm := &routeMetrics{route: route, m: m}
	for class := 1; class < len(rm.requests); class++ {
		label := statusClass(class * 100)
		rm.requests[class] = m.requests.WithLabelValues(route, label)
		rm.duration[class] = m.duration.WithLabelValues(route, label)
	}
	for i, cause := range cutCauses {
		rm.cuts[i] = m.answersCut.WithLabelValues(route, cause)
	}
	return rm
}

// observe counts one answer of status that took elapsed.
func (rm *routeMetrics) observe(status int, elapsed time.Duration) {
	class := status / 100
	if class < 1 || class >= len(rm.requests) {
		label := statusClass(status)
		rm.m.requests.WithLabelValues(rm.route, label).Inc()
		rm.m.duration.WithLabelValues(rm.route, label).Observe(elapsed.Seconds())
		return
	}
	rm.requests[class].Inc()
	rm.duration[class].Observe(elapsed.Seconds())
}

// countError counts one error answer by its code. Only error answers pay
// for the label lookup; the code is the gateway's own or a service's
// X-Error-Code, and one that is not shaped like a code (a service of
// another build, a bug) is counted as "other" rather than let a value
// nobody chose grow the series.
func (rm *routeMetrics) countError(code []byte) {
	rm.m.errors.WithLabelValues(rm.route, errorCodeLabel(code)).Inc()
}

// errorCodeLabel is code as a label value: the code itself if it is shaped
// like every code of ours (envelope.WellFormedCode); "other" for anything
// else, "none" for an error answer without one.
func errorCodeLabel(code []byte) string {
	if len(code) == 0 {
		return "none"
	}
	if !envelope.WellFormedCode(code) {
		return "other"
	}
	return string(code)
}

// decisionMetrics are the rate-limit decision counters, resolved once per
// class, decision and backend for the same reason.
type decisionMetrics map[decisionLabels]prometheus.Counter

type decisionLabels struct {
	class          string
	allowed, local bool
}

func (m *metrics) forDecisions(classes []string) decisionMetrics {
	dm := decisionMetrics{}
	for _, class := range classes {
		for _, allowed := range []bool{true, false} {
			for _, local := range []bool{true, false} {
				dm[decisionLabels{class, allowed, local}] = m.rateDecisions.WithLabelValues(class, decisionLabel(allowed), backendLabel(local))
			}
		}
	}
	return dm
}

// slotDecisions are the decision counters of a cap on calls in flight
// (inFlightSlots), whose count lives in the gateway process by design: its
// backend is "process", apart from "local", which says Redis failed.
type slotDecisions struct{ allowed, limited prometheus.Counter }

// backendProcess is the backend label of a cap counted in the process.
const backendProcess = "process"

func (m *metrics) forSlots(class string) slotDecisions {
	return slotDecisions{
		allowed: m.rateDecisions.WithLabelValues(class, decisionLabel(true), backendProcess),
		limited: m.rateDecisions.WithLabelValues(class, decisionLabel(false), backendProcess),
	}
}

func decisionLabel(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "limited"
}

func backendLabel(local bool) string {
	if local {
		return "local"
	}
	return "redis"
}

// forUpstreams creates every upstream's error and retry series at 0, so an
// alert on their rate sees a series before the first failure (a series
// that does not exist yet has no rate: the alert would stay silent).
func (m *metrics) forUpstreams(upstreams map[string]*upstream.Upstream) {
	for name, u := range upstreams {
		m.upstreamErrors.WithLabelValues(name, noInstance, kindUnavailable)
		m.upstreamErrors.WithLabelValues(name, noInstance, kindShortage)
		m.upstreamRetries.WithLabelValues(name, noInstance, kindShortage)
		m.followInstances(name, u.Bases())
	}
}

// noInstance is the upstream_instance of a failure no instance had: every
// one was out, or the gateway could not open a connection (a shortage of
// its own), and nothing was sent.
const noInstance = "none"

// followInstances makes the error and retry series of an upstream's
// instances those of bases, its instances now: a new one's start at 0,
// and a removed one's go, so that instances discovery replaces (pods
// rescheduled to new addresses) do not pile up series for as long as the
// gateway runs. A request in flight on a removed instance may bring its
// series back with its failure; the next change of the set removes it
// again: the series to remove are read from the counters themselves, not
// from the instances of the last change, which no longer hold that one.
func (m *metrics) followInstances(up string, bases []string) {
	m.seriesMu.Lock()
	defer m.seriesMu.Unlock()
	for _, vec := range []*prometheus.CounterVec{m.upstreamErrors, m.upstreamRetries} {
		for _, old := range instancesOf(vec, up) {
			if old != noInstance && !slices.Contains(bases, old) {
				vec.DeletePartialMatch(prometheus.Labels{"upstream": up, "upstream_instance": old})
			}
		}
	}
	for _, base := range bases {
		for _, kind := range instanceErrorKinds {
			m.upstreamErrors.WithLabelValues(up, base, kind)
		}
		for _, kind := range repeatedErrorKinds {
			m.upstreamRetries.WithLabelValues(up, base, kind)
		}
	}
}

// instancesOf returns the upstream_instance of each series of up in vec.
func instancesOf(vec *prometheus.CounterVec, up string) []string {
	collected := make(chan prometheus.Metric)
	go func() {
		vec.Collect(collected)
		close(collected)
	}()
	var instances []string
	for metric := range collected {
		var series dto.Metric
		if metric.Write(&series) != nil {
			continue
		}
		var upstream, instance string
		for _, label := range series.GetLabel() {
			switch label.GetName() {
			case "upstream":
				upstream = label.GetValue()
			case "upstream_instance":
				instance = label.GetValue()
			}
		}
		if upstream == up && !slices.Contains(instances, instance) {
			instances = append(instances, instance)
		}
	}
	return instances
}

// countKeyLookup returns the key cache's OnLookup: it counts hits and
// misses on series resolved once.
func (m *metrics) countKeyLookup() func(hit bool) {
	hits, misses := m.keyCache.WithLabelValues("hit"), m.keyCache.WithLabelValues("miss")
	return func(hit bool) {
		if hit {
			hits.Inc()
		} else {
			misses.Inc()
		}
	}
}
