package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestNeighboursFlagsDefaultsAreTheREADMEsLoad(t *testing.T) {
	f, err := parseNeighboursFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.getRate != 40 || f.listRate != 5 || f.saleRate != 2 || f.floodListConns != 700 || f.floodSaleWorkers != 0 ||
		f.duration != 15*time.Second || f.listLimit != 100 {
		t.Errorf("defaults = %+v, want B at 40 GETs, 5 list pages and 2 pairs a second, A on 700 list connections and no sale workers, 15 s, limit 100", f)
	}
	if got := f.need(); strings.Join(got, ",") != "DATABASE_URL,LOADGEN_OWNER_ID,LOADGEN_READ_KEY,LOADGEN_WRITE_KEYS,LOADGEN_FLOOD_READ_KEYS" {
		t.Errorf("need() = %v", got)
	}
	f, err = parseNeighboursFlags([]string{"--a-sale-workers", "320", "--a-list-conns", "0", "--b-sales", "0",
		"--metrics", "export-reader=http://127.0.0.1:9081/metrics", "--metrics", "sales-writer=http://127.0.0.1:9082/metrics"})
	if err != nil {
		t.Fatal(err)
	}
	if f.metrics.String() != "export-reader=http://127.0.0.1:9081/metrics,sales-writer=http://127.0.0.1:9082/metrics" {
		t.Errorf("metrics = %s", f.metrics.String())
	}
	if got := f.need(); strings.Join(got, ",") != "DATABASE_URL,LOADGEN_OWNER_ID,LOADGEN_READ_KEY,LOADGEN_FLOOD_OWNER_ID,LOADGEN_FLOOD_WRITE_KEYS" {
		t.Errorf("need() with sale workers only = %v", got)
	}
}

func TestNeighboursFlagsRefuseWhatCannotRun(t *testing.T) {
	for _, args := range [][]string{
		{"--duration", "0s"},
		{"--timeout", "-1s"},
		{"--b-gets", "-1"},
		{"--b-lists", "1e-11"}, // its due times overflow: the pacer never returned
		{"--b-sales", "NaN"},
		{"--b-gets", "+Inf"},
		{"--b-sale-items", "0"},
		{"--limit", "0"},
		{"--a-list-conns", "-5"},
		{"--a-items-per-worker", "0"},
		{"--metrics", "export-reader"},
		{"--metrics", "127.0.0.1:9081/metrics"},
		{"--metrics", "=http://127.0.0.1:9081/metrics"},
		{"stray"},
	} {
		if _, err := parseNeighboursFlags(args); !errors.Is(err, errUsage) {
			t.Errorf("flags %q: got %v, want an invalid usage", args, err)
		}
	}
	if _, err := parseNeighboursFlags([]string{"--b-sales", "0", "--b-sale-items", "0"}); err != nil {
		t.Errorf("no sales and no sale items: %v, want accepted", err)
	}
}

func TestRetryWaitIsWhatTheSalesGuideSays(t *testing.T) {
	jitter := func(bound time.Duration) time.Duration { return bound / 4 } // a fixed draw below the bound
	timeout := fasthttp.ErrTimeout
	for _, c := range []struct {
		name    string
		answer  answer
		err     error
		backoff time.Duration
		want    time.Duration
	}{
		{"a 200 goes on at once", answer{status: 200}, nil, time.Second, 0},
		{"a final 409 goes on at once", answer{status: 409}, nil, time.Second, 0},
		{"a 409 request_in_progress waits part of the backoff", answer{status: 409, inProgress: true}, nil, 400 * time.Millisecond, 101 * time.Millisecond},
		{"a 429 waits its Retry-After and part of a second", answer{429, "2", false}, nil, 100 * time.Millisecond, 2250 * time.Millisecond},
		{"a 429 naming no wait waits a second and part of one", answer{status: 429}, nil, 100 * time.Millisecond, 1250 * time.Millisecond},
		{"a 503 waits at least its Retry-After", answer{503, "1", false}, nil, 100 * time.Millisecond, 1250 * time.Millisecond},
		{"a 503 waits at least the backoff", answer{503, "1", false}, nil, 4 * time.Second, 4250 * time.Millisecond},
		{"a 502 waits part of the backoff", answer{status: 502}, nil, 400 * time.Millisecond, 101 * time.Millisecond},
		{"a timeout waits part of the backoff", answer{}, timeout, 400 * time.Millisecond, 101 * time.Millisecond},
	} {
		if got := retryWait(c.answer, c.err, c.backoff, jitter); got != c.want {
			t.Errorf("%s: retryWait = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestNeighboursReportNamesEveryFigure(t *testing.T) {
	rep := neighboursReport{
		duration: 15 * time.Second,
		b: map[string]kindFigures{
			kindGet:  {Planned: 600, Sent: 600, Late: 2, MaxLag: 31 * time.Millisecond, Answered: 598, P50: 27400 * time.Microsecond, P99: 118 * time.Millisecond, Outcomes: map[string]int{"200": 598, "timeout": 2}},
			kindList: {Planned: 75, Sent: 75, Answered: 75, P50: 50 * time.Millisecond, P99: 90 * time.Millisecond, Outcomes: map[string]int{"200": 74, "429": 1}},
			kindSale: {Planned: 30, Sent: 29, Answered: 58, P50: 3 * time.Millisecond, P99: 9 * time.Millisecond, Outcomes: map[string]int{"200": 58}},
		},
		skipped:         1,
		a:               map[string]map[string]int{kindList: {"200": 40000, "429": 9400, "transport": 3}, kindSale: {"200": 900, "429": 3600}},
		maxInFlight:     64,
		bExportInFlight: 51, bSaleInFlight: 1,
		pools: []poolWait{{service: "export-reader", pool: "postgres", acquires: 1000, empty: 900, wait: 17 * time.Second}},
	}
	var out bytes.Buffer
	if err := writeNeighboursReport(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  get   p50 27.4 ms p99 118.0 ms, answered 598; sent 600 of 600 planned, 2 late (latest by 31.0 ms); 200: 598, timeout: 2\n",
		"  list  p50 50.0 ms p99 90.0 ms, answered 75; sent 75 of 75 planned, 0 late (latest by 0.0 ms); 200: 74, 429: 1\n",
		"  in flight at once, at most: 51 on the export routes, 1 on the sale routes\n",
		"  1 pairs not sent: every item of B's was in a pair or left sold\n",
		"  list  429 9400; 200: 40000, transport: 3\n",
		"  sale  429 3600; 200: 900\n",
		"  sale calls in flight at once, at most (the workers' first calls, sent together, included): 64\n",
		"  export-reader pool=postgres: 17.0 ms per acquire, 1000 acquires, 900 of them waited\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	rec := rep.record("neighbours")
	for name, want := range map[string]float64{
		"b_get_p50_ms": 27.4, "b_get_answered": 598, "b_get_failed": 2, "b_list_failed": 1, "b_sale_failed": 0,
		"a_list_429": 9400, "a_sale_429": 3600, "a_list_answers": 49403, "b_skipped_pairs": 1, "a_sales_inflight": 64, "b_export_inflight": 51,
		"pool_wait_ms.export-reader.postgres": 17,
	} {
		if got := rec.Figures[name]; got != want {
			t.Errorf("record figure %s = %v, want %v", name, got, want)
		}
	}
}

const poolMetricsBefore = `# HELP pgxpool_acquire_total Connections acquired.
# TYPE pgxpool_acquire_total counter
pgxpool_acquire_total{pool="postgres"} 100
# HELP pgxpool_empty_acquire_total Acquires that had to wait for a connection.
# TYPE pgxpool_empty_acquire_total counter
pgxpool_empty_acquire_total{pool="postgres"} 10
# HELP pgxpool_acquire_wait_seconds_total Time spent waiting for a connection.
# TYPE pgxpool_acquire_wait_seconds_total counter
pgxpool_acquire_wait_seconds_total{pool="postgres"} 1.5
# TYPE http_requests_total counter
http_requests_total{route="x"} 7
`

func TestPoolWaitIsTheAcquireTimeOverTheRunPerAcquire(t *testing.T) {
	before, err := parsePoolCounters(strings.NewReader(poolMetricsBefore))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parsePoolCounters(strings.NewReader(strings.NewReplacer(
		`acquire_total{pool="postgres"} 100`, `acquire_total{pool="postgres"} 600`,
		`empty_acquire_total{pool="postgres"} 10`, `empty_acquire_total{pool="postgres"} 410`,
		`seconds_total{pool="postgres"} 1.5`, `seconds_total{pool="postgres"} 11.5`).Replace(poolMetricsBefore)))
	if err != nil {
		t.Fatal(err)
	}
	targets := metricsTargets{{"export-reader", "http://x/metrics"}}
	waits := poolWaits(targets, map[string]map[string]poolCounters{"export-reader": before}, map[string]map[string]poolCounters{"export-reader": after})
	if len(waits) != 1 {
		t.Fatalf("waits = %+v, want one pool", waits)
	}
	w := waits[0]
	if w.service != "export-reader" || w.pool != "postgres" || w.acquires != 500 || w.empty != 400 || w.perAcquire() != 20*time.Millisecond {
		t.Errorf("wait = %+v, %s per acquire; want 500 acquires, 400 waited, 10 s over them: 20ms", w, w.perAcquire())
	}
}

// fakeGateway answers as a gateway would the requests of both owners, and
// records them: A's list pages are refused 429 with Retry-After: 1, and
// the first sale call of key a-write-1 is answered 409 request_in_progress.
type fakeGateway struct {
	mu       sync.Mutex
	byKey    map[string]int
	sales    []string // "key path" of every sale call, in order
	notFound []string
}

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-API-Key")
	g.mu.Lock()
	g.byKey[key]++
	path := r.URL.EscapedPath()
	isSale := r.Method == http.MethodPost && strings.Contains(path, "/sales/")
	if isSale {
		g.sales = append(g.sales, key+" "+path+" "+r.Header.Get("Idempotency-Key"))
	}
	// Read under the lock: the fake serves every connection at once.
	firstOfKey := g.byKey[key] == 1
	g.mu.Unlock()
	switch {
	case isSale && key == "a-write-1" && firstOfKey:
		w.WriteHeader(http.StatusConflict)
		w.Write([]byte(`{"error":{"code":"request_in_progress"}}`))
	case r.Method == http.MethodGet && path == "/v1/export/items" && strings.HasPrefix(key, "a-read"):
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"error":{"code":"rate_limited"}}`))
	case r.Method == http.MethodGet && path == "/v1/export/items" && r.URL.Query().Get("limit") == "7",
		r.Method == http.MethodGet && strings.HasPrefix(path, "/v1/export/items/b"),
		isSale && r.Header.Get("Idempotency-Key") != "":
		w.Write([]byte(`{"data":{}}`))
	default:
		g.mu.Lock()
		g.notFound = append(g.notFound, r.Method+" "+r.URL.String())
		g.mu.Unlock()
		w.WriteHeader(http.StatusNotFound)
	}
}

// The whole run against a loopback fake: B sends every request it planned
// and each is answered; each of A's list connections, refused 429 with
// Retry-After: 1, sends no second page within the run (it waits out the
// second and part of one more); A's sale workers each sell only their own
// items, a confirm before each cancel, and send a call answered 409
// request_in_progress again with its Idempotency-Key.
func TestNeighboursRunsBothOwnersAsTold(t *testing.T) {
	g := &fakeGateway{byKey: map[string]int{}}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	f, err := parseNeighboursFlags([]string{"--base", srv.URL + "/v1", "--duration", "500ms", "--limit", "7",
		"--b-gets", "20", "--b-lists", "4", "--b-sales", "2", "--a-list-conns", "3", "--a-sale-workers", "2"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{ReadKey: "b-read", WriteKeys: []string{"b-write"}, FloodReadKeys: []string{"a-read-1", "a-read-2", "a-read-3"},
		FloodWriteKeys: []string{"a-write-0", "a-write-1"}}
	items := neighbourItemSets{get: []string{"b1", "b2"}, sale: []string{"b/sold"}, flood: [][]string{{"a0x", "a0y"}, {"a1x"}}}
	var timeline bytes.Buffer
	rep, err := neighbours(context.Background(), cfg, f, items, &timeline)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.notFound) > 0 {
		t.Fatalf("requests the fake did not expect: %q", g.notFound)
	}
	for kind, want := range map[string]int{kindGet: 10, kindList: 2, kindSale: 2} {
		k := rep.b[kind]
		if k.Planned != k.Sent || k.Outcomes["200"] != want || k.Answered != want || k.failed() != 0 {
			t.Errorf("B's %s: %+v, want %d answered 200, every planned one sent", kind, k, want)
		}
	}
	if rep.bExportInFlight < 1 || rep.bSaleInFlight != 1 {
		t.Errorf("B's in flight at most: %d export, %d sale; want at least 1, and 1 (its one item: a pair at a time, a call at a time)", rep.bExportInFlight, rep.bSaleInFlight)
	}
	for _, key := range cfg.FloodReadKeys {
		if g.byKey[key] != 1 {
			t.Errorf("A's list connection on %s sent %d pages, want 1 (the 429's Retry-After: 1 outlasts the run)", key, g.byKey[key])
		}
	}
	if rep.a[kindList]["429"] != 3 {
		t.Errorf("A's list answers = %v, want 3 429s", rep.a[kindList])
	}
	if rep.a[kindSale]["200"] == 0 || rep.maxInFlight < 1 || rep.maxInFlight > 2 {
		t.Errorf("A's sale answers = %v, at most %d in flight; want 200s, 1 or 2 in flight", rep.a[kindSale], rep.maxInFlight)
	}
	own := map[string]string{"a-write-0": "/a0", "a-write-1": "/a1", "b-write": "/b%2Fsold/"}
	last := map[string]string{} // per key, the last call's action and Idempotency-Key
	var retried []string
	for _, call := range g.sales {
		key, rest, _ := strings.Cut(call, " ")
		path, idemKey, _ := strings.Cut(rest, " ")
		if !strings.Contains(path, own[key]) {
			t.Errorf("%s sold %s, not one of its own items", key, path)
		}
		action := path[strings.LastIndexByte(path, '/')+1:]
		if prevAction, prevKey, _ := strings.Cut(last[key], " "); prevKey == idemKey {
			retried = append(retried, key+" "+action)
		} else if (action == "cancel") != (prevAction == "confirm") {
			t.Errorf("%s: %s after %q, want confirm and cancel in turn", key, action, prevAction)
		}
		last[key] = action + " " + idemKey
	}
	if strings.Join(retried, ",") != "a-write-1 confirm" {
		t.Errorf("calls sent again with their Idempotency-Key: %q, want a-write-1's first confirm alone (answered request_in_progress)", retried)
	}
}

// B's item goes back to its free items only when no sale of it can stand:
// after a cancel answered 200, or a confirm refused 429 before it could
// apply (the gateway's cap, which B meets when a flood slows its answers).
// A confirm refused otherwise is not followed by a cancel, and a cancel
// that failed leaves the item out: it may be sold.
func TestNeighbourFreesItsItemOnlyWhenNoSaleStands(t *testing.T) {
	var calls saleCalls
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		action, path := calls.record(r)
		confirm := action == "confirm"
		switch {
		case strings.Contains(path, "/refused/") && confirm:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		case strings.Contains(path, "/taken/") && confirm:
			w.WriteHeader(http.StatusConflict)
			w.Write([]byte(`{"error":{"code":"item_already_sold"}}`))
		case strings.Contains(path, "/cancel-fails/") && !confirm:
			w.WriteHeader(http.StatusBadGateway)
		default:
			w.Write([]byte(`{"data":{}}`))
		}
	}))
	t.Cleanup(srv.Close)
	hc, err := newHTTPClient(srv.URL+"/v1", 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		item      string
		wantCalls string
		wantFree  bool
		wantOut   map[string]int
	}{
		{"sold-and-canceled", "confirm cancel", true, map[string]int{"200": 2}},
		{"refused", "confirm", true, map[string]int{"429": 1}},
		{"taken", "confirm", false, map[string]int{"409": 1}},
		{"cancel-fails", "confirm cancel", false, map[string]int{"200": 1, "502": 1}},
	} {
		calls.taken() // the case before's
		n := &neighbour{c: neighbourClient{hc, 5 * time.Second}, base: hc.base, writeKeys: []string{"b-write"},
			free: make(chan string, 1), run: "t", stats: newNeighbourStats()}
		n.free <- c.item
		n.sale(0)
		n.inFlight.Wait()
		if got := calls.taken(); got != c.wantCalls {
			t.Errorf("%s: calls %q, want %q", c.item, got, c.wantCalls)
		}
		if free := len(n.free) == 1; free != c.wantFree {
			t.Errorf("%s: item free again = %v, want %v", c.item, free, c.wantFree)
		}
		if got := n.stats.kinds[kindSale].outcomes; fmtOutcomes(got) != fmtOutcomes(c.wantOut) {
			t.Errorf("%s: outcomes %v, want %v", c.item, got, c.wantOut)
		}
	}
}

// A's answers are counted within the run only: its requests in flight at
// the end are answered after it, under a load that has stopped.
func TestFloodAnswersAfterTheRunAreNotCounted(t *testing.T) {
	during := newFloodStats(time.Now().Add(time.Hour))
	during.add(kindList, 200, nil)
	after := newFloodStats(time.Now().Add(-time.Millisecond))
	after.add(kindList, 200, nil)
	if got := during.snapshot()[kindList]["200"]; got != 1 {
		t.Errorf("an answer within the run counted %d times, want 1", got)
	}
	if got := after.snapshot()[kindList]; len(got) != 0 {
		t.Errorf("answers after the run's end counted: %v, want none", got)
	}
}

// A sale of A's confirmed as the run ends is canceled all the same: a
// confirm answered after the run's end (the load has stopped, and its
// answer is not counted) is followed by its cancel, so that no item of
// A's is left sold.
func TestFloodCancelsASaleConfirmedAsTheRunEnds(t *testing.T) {
	var calls saleCalls
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if action, _ := calls.record(r); action == "confirm" {
			time.Sleep(300 * time.Millisecond) // answered after the run's 100 ms
		}
		w.Write([]byte(`{"data":{}}`))
	}))
	t.Cleanup(srv.Close)
	runOneSaleWorker(t, srv.URL, "100ms")
	if got := calls.taken(); got != "confirm cancel" {
		t.Errorf("A's sale calls: %q, want \"confirm cancel\" (the confirm answered after the run, then its cancel)", got)
	}
}

// runOneSaleWorker runs neighbours against the fake gateway at url for
// duration with nothing but one sale worker of A's, on one item (a0x).
func runOneSaleWorker(t *testing.T, url, duration string) {
	t.Helper()
	f, err := parseNeighboursFlags([]string{"--base", url + "/v1", "--duration", duration, "--b-gets", "0",
		"--b-lists", "0", "--b-sales", "0", "--a-list-conns", "0", "--a-sale-workers", "1"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{FloodWriteKeys: []string{"a-write-0"}}
	items := neighbourItemSets{flood: [][]string{{"a0x"}}}
	if _, err := neighbours(context.Background(), cfg, f, items, io.Discard); err != nil {
		t.Fatal(err)
	}
}

// saleCalls records, in order, the action (confirm, cancel) of each sale
// call a fake gateway is sent.
type saleCalls struct {
	mu      sync.Mutex
	actions []string
}

// record notes r's action and returns it, with r's path as sent.
func (c *saleCalls) record(r *http.Request) (action, path string) {
	path = r.URL.EscapedPath()
	action = path[strings.LastIndexByte(path, '/')+1:]
	c.mu.Lock()
	c.actions = append(c.actions, action)
	c.mu.Unlock()
	return action, path
}

// taken returns the actions recorded since the last call, space-separated.
func (c *saleCalls) taken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := strings.Join(c.actions, " ")
	c.actions = nil
	return got
}

// A confirm that the run's end finds in doubt (its first attempt still
// running: 409 request_in_progress, retried) is sent again with its key
// after the run, and canceled once it answers 200: the item is not left
// sold by a run that ended mid-retry.
func TestFloodCancelsASaleLeftInDoubtAsTheRunEnds(t *testing.T) {
	var calls saleCalls
	start := time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if action, _ := calls.record(r); action == "confirm" && time.Since(start) < 900*time.Millisecond {
			w.WriteHeader(http.StatusConflict) // past the run's 300 ms: the run ends mid-retry
			w.Write([]byte(`{"error":{"code":"request_in_progress","message":"m"},"meta":{"request_id":"r"}}`))
			return
		}
		w.Write([]byte(`{"data":{}}`))
	}))
	t.Cleanup(srv.Close)
	runOneSaleWorker(t, srv.URL, "300ms")
	got := calls.taken()
	if !strings.HasPrefix(got, "confirm ") || !strings.HasSuffix(got, " cancel") || strings.Count(got, "cancel") != 1 {
		t.Errorf("A's sale calls: %q, want confirms retried past the run's end, then one cancel", got)
	}
}
