package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/coinexport/export/pkg/postgres"
)

// The neighbours scenario: what an owner flooding a stack costs another
// owner on it (gateway README, "Tenants sharing a stack"). Owner B (the
// neighbour: LOADGEN_OWNER_ID, LOADGEN_READ_KEY, LOADGEN_WRITE_KEYS) paces
// a steady mixed load, open loop (pace.go); owner A (LOADGEN_FLOOD_*) floods
// list pages over many connections and confirm + cancel pairs from many
// workers, every A client waiting out each Retry-After plus a random part
// of a second, as the README's sales guide says. B's latencies are the
// figure; A's answers and the services' pool waits say what the flood did.

// neighboursFlags are the scenario's settings.
type neighboursFlags struct {
	name      string
	base      string
	duration  time.Duration
	timeout   time.Duration // one request's bound, B's and A's
	tolerance time.Duration // a B request sent later than this after its due time is late
	every     time.Duration // a timeline line every so often (0: none)

	getRate, listRate, saleRate float64 // B's requests a second (a sale: a confirm + cancel pair)
	listLimit                   int     // limit= of every list page, B's and A's
	getItems, saleItems         int     // B's items read by id, and sold and canceled

	floodListConns      int // A's connections sending first list pages
	floodSaleWorkers    int // A's workers sending pairs, one write key each
	floodItemsPerWorker int // items each A sale worker cycles through

	metrics metricsTargets
}

// The rates a pacer keeps to: below one request every 100 s, the due time
// of a run's requests overflows time.Duration (dueAfter) and plannedIn
// never returns; above a million a second, the schedule is no schedule.
const minPacedRate, maxPacedRate = 0.01, 1e6

// paceableRate reports whether rate is none (0) or one a pacer keeps to.
func paceableRate(rate float64) bool {
	return rate == 0 || rate >= minPacedRate && rate <= maxPacedRate
}

// parseNeighboursFlags reads the scenario's flags and refuses settings that cannot run.
func parseNeighboursFlags(args []string) (neighboursFlags, error) {
	var f neighboursFlags
	fs := flag.NewFlagSet("neighbours", flag.ContinueOnError)
	fs.StringVar(&f.name, "name", "neighbours", "scenario name in the results file")
	fs.StringVar(&f.base, "base", "http://127.0.0.1:8080/v1", "the gateway's base URL including /v1")
	fs.DurationVar(&f.duration, "duration", 15*time.Second, "how long B paces its load and A floods")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "a request unanswered this long has failed (B: counted as timeout; A: retried)")
	fs.DurationVar(&f.tolerance, "late", 10*time.Millisecond, "a B request sent more than this after its due time is counted late")
	fs.DurationVar(&f.every, "every", 0, "print a timeline line this often (e.g. 1s; 0: none)")
	fs.Float64Var(&f.getRate, "b-gets", 40, "B's GETs by id a second")
	fs.Float64Var(&f.listRate, "b-lists", 5, "B's first list pages a second")
	fs.Float64Var(&f.saleRate, "b-sales", 2, "B's confirm + cancel pairs a second, on its own active items")
	fs.IntVar(&f.listLimit, "limit", 100, "limit= of every list page (B's and A's)")
	fs.IntVar(&f.getItems, "b-get-items", 1000, "B's items its GETs draw from")
	fs.IntVar(&f.saleItems, "b-sale-items", 50, "B's active items its pairs cycle through")
	fs.IntVar(&f.floodListConns, "a-list-conns", 700, "A's connections sending first list pages back to back (its read keys in turn)")
	fs.IntVar(&f.floodSaleWorkers, "a-sale-workers", 0, "A's workers sending confirm + cancel pairs back to back, one write key each")
	fs.IntVar(&f.floodItemsPerWorker, "a-items-per-worker", 20, "A's active items each sale worker cycles through")
	fs.Var(&f.metrics, "metrics", "name=URL of a service's /metrics (its admin port), whose pgxpool acquire wait to report (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return f, err
	}
	switch {
	case f.duration <= 0 || f.timeout <= 0 || f.tolerance < 0 || f.every < 0:
		return f, errUsagef("--duration and --timeout must be positive, --late and --every not negative")
	case !paceableRate(f.getRate) || !paceableRate(f.listRate) || !paceableRate(f.saleRate):
		return f, errUsagef("B's rates must be 0 (none) or from %g to %g a second", minPacedRate, maxPacedRate)
	case f.getRate > 0 && f.getItems < 1, f.saleRate > 0 && f.saleItems < 1:
		return f, errUsagef("B's GETs and sales need at least one item each (--b-get-items, --b-sale-items)")
	case f.listLimit < 1:
		return f, errUsagef("--limit must be at least 1")
	case f.floodListConns < 0 || f.floodSaleWorkers < 0 || f.floodItemsPerWorker < 1:
		return f, errUsagef("A's connections and workers must not be negative, its items per worker at least 1")
	}
	return f, nil
}

// need lists the environment the flags call for: B's read key always, its
// write keys when it sells, A's keys for what A sends.
func (f neighboursFlags) need() []string {
	names := []string{"DATABASE_URL", "LOADGEN_OWNER_ID", "LOADGEN_READ_KEY"}
	if f.saleRate > 0 {
		names = append(names, "LOADGEN_WRITE_KEYS")
	}
	if f.floodListConns > 0 {
		names = append(names, "LOADGEN_FLOOD_READ_KEYS")
	}
	if f.floodSaleWorkers > 0 {
		names = append(names, "LOADGEN_FLOOD_OWNER_ID", "LOADGEN_FLOOD_WRITE_KEYS")
	}
	return names
}

// metricsTargets is the repeatable --metrics name=URL.
type metricsTargets []metricsTarget

type metricsTarget struct{ name, url string }

func (m *metricsTargets) String() string {
	parts := make([]string, len(*m))
	for i, t := range *m {
		parts[i] = t.name + "=" + t.url
	}
	return strings.Join(parts, ",")
}

func (m *metricsTargets) Set(v string) error {
	name, raw, ok := strings.Cut(v, "=")
	u, err := url.Parse(raw)
	if !ok || name == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("want name=http://host:port/metrics, got %q", v)
	}
	*m = append(*m, metricsTarget{name, raw})
	return nil
}

// The kinds of request B sends, and the routes A's answers are counted by.
const (
	kindGet  = "get"
	kindList = "list"
	kindSale = "sale"
)

var neighbourKinds = []string{kindGet, kindList, kindSale}

// outcome names how a request ended: its status, or "timeout", or
// "transport" (no answer: a refused or broken connection).
func outcome(status int, err error) string {
	switch {
	case errors.Is(err, fasthttp.ErrTimeout):
		return "timeout"
	case err != nil:
		return "transport"
	}
	return strconv.Itoa(status)
}

// kindStats is what became of one kind of B's requests.
type kindStats struct {
	latencies Latencies      // every answered request, any status
	outcomes  map[string]int // by outcome
}

// inFlightGauge counts requests in flight, and the most there were at once.
type inFlightGauge struct{ now, most atomic.Int64 }

func (g *inFlightGauge) enter() {
	n := g.now.Add(1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
}

func (g *inFlightGauge) leave() { g.now.Add(-1) }

// neighbourStats is B's side, shared by its requests in flight.
type neighbourStats struct {
	mu      sync.Mutex
	kinds   map[string]*kindStats
	skipped int // pairs not sent: no item of B's free (each still in a pair, or left sold)

	// B's own requests in flight on each service's routes: the gateway
	// caps an owner's, so a neighbour whose answers slow down may meet
	// its own cap.
	exportInFlight, saleInFlight inFlightGauge
}

func newNeighbourStats() *neighbourStats {
	s := &neighbourStats{kinds: map[string]*kindStats{}}
	for _, k := range neighbourKinds {
		s.kinds[k] = &kindStats{outcomes: map[string]int{}}
	}
	return s
}

func (s *neighbourStats) add(kind string, status int, d time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.kinds[kind]
	k.outcomes[outcome(status, err)]++
	if err == nil {
		k.latencies.Add(d)
	}
}

// floodStats is A's side: its answers by route and outcome, within the run.
type floodStats struct {
	mu      sync.Mutex
	answers map[string]map[string]int // route → outcome → count
	stop    time.Time                 // answers after it are not counted

	salesInFlight inFlightGauge
}

func newFloodStats(stop time.Time) *floodStats {
	return &floodStats{answers: map[string]map[string]int{kindList: {}, kindSale: {}}, stop: stop}
}

func (s *floodStats) add(route string, status int, err error) {
	if time.Now().After(s.stop) {
		return
	}
	s.mu.Lock()
	s.answers[route][outcome(status, err)]++
	s.mu.Unlock()
}

// snapshot copies the counts, for the timeline and the report.
func (s *floodStats) snapshot() map[string]map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]int{}
	for route, m := range s.answers {
		out[route] = map[string]int{}
		for k, v := range m {
			out[route][k] = v
		}
	}
	return out
}

// retryWait is how long an A client waits before its next request after
// an answer (or an error), as the README's sales guide says: a 429 its
// Retry-After (1 s when it names none) plus up to a second more at random,
// a 503 the same but at least the backoff, another 5xx, a 409
// request_in_progress or no answer a random part of the backoff; anything
// else none. jitter draws a random duration below its bound.
func retryWait(a answer, err error, backoff time.Duration, jitter func(time.Duration) time.Duration) time.Duration {
	told := time.Second
	if secs, convErr := strconv.Atoi(a.retryAfter); convErr == nil && secs >= 0 {
		told = time.Duration(secs) * time.Second
	}
	switch {
	case err != nil || a.inProgress || (a.status >= 500 && a.status != fasthttp.StatusServiceUnavailable):
		return jitter(backoff) + time.Millisecond
	case a.status == fasthttp.StatusTooManyRequests:
		return told + jitter(time.Second)
	case a.status == fasthttp.StatusServiceUnavailable:
		return max(told, backoff) + jitter(time.Second)
	}
	return 0
}

func randomBelow(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// sleepCtx waits d, or less when ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	realClock{}.SleepUntil(ctx, time.Now().Add(d))
}

// runNeighbours is "loadgen neighbours".
func runNeighbours(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	f, err := parseNeighboursFlags(args)
	if err != nil {
		return err
	}
	if err := cfg.need(f.need()...); err != nil {
		return err
	}
	if len(cfg.FloodWriteKeys) < f.floodSaleWorkers {
		return fmt.Errorf("LOADGEN_FLOOD_WRITE_KEYS has %d keys, --a-sale-workers wants %d", len(cfg.FloodWriteKeys), f.floodSaleWorkers)
	}
	items, err := neighbourItems(ctx, cfg, f)
	if err != nil {
		return err
	}
	before, err := scrapeAll(ctx, f.metrics)
	if err != nil {
		return err
	}
	rep, err := neighbours(ctx, cfg, f, items, stdout)
	if err != nil {
		return err
	}
	after, err := scrapeAll(ctx, f.metrics)
	if err != nil {
		return err
	}
	rep.pools = poolWaits(f.metrics, before, after)
	if err := writeNeighboursReport(stdout, rep); err != nil {
		return err
	}
	return appendRecord(cfg.Results, rep.record(f.name), stdout)
}

// neighbourItemSets are the items each side works on, sampled before the run.
type neighbourItemSets struct {
	get, sale []string   // B's
	flood     [][]string // A's, one set per sale worker
}

func neighbourItems(ctx context.Context, cfg Config, f neighboursFlags) (neighbourItemSets, error) {
	var s neighbourItemSets
	pool, err := postgres.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return s, err
	}
	defer postgres.Close(pool)
	if s.get, err = sampleIDs(ctx, pool, cfg.OwnerID, f.getItems, false); err != nil {
		return s, err
	}
	if f.getRate > 0 && len(s.get) == 0 {
		return s, errors.New("owner B (LOADGEN_OWNER_ID) has no items")
	}
	if f.saleRate > 0 {
		if s.sale, err = sampleIDs(ctx, pool, cfg.OwnerID, f.saleItems, true); err != nil {
			return s, err
		}
		if len(s.sale) == 0 {
			return s, errors.New("owner B (LOADGEN_OWNER_ID) has no active items to sell")
		}
	}
	if f.floodSaleWorkers > 0 {
		all, err := sampleIDs(ctx, pool, cfg.FloodOwnerID, f.floodSaleWorkers*f.floodItemsPerWorker, true)
		if err != nil {
			return s, err
		}
		per := len(all) / f.floodSaleWorkers
		if per == 0 {
			return s, fmt.Errorf("owner A has %d active items, its %d sale workers need one each", len(all), f.floodSaleWorkers)
		}
		for w := range f.floodSaleWorkers {
			s.flood = append(s.flood, all[w*per:(w+1)*per])
		}
	}
	return s, nil
}
