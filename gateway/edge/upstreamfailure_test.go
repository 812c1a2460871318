package edge_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/httpserver"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
)

// Every upstream's error and retry series exist at 0 from the start, so an
// alert on their rate has a series before the first failure.
func TestUpstreamSeriesStartAtZero(t *testing.T) {
	dsn, _, _ := seed(t)
	instances := map[string]string{
		"export-reader": "http://" + testenv.RefusingAddr(t), "sales-writer": "http://" + testenv.RefusingAddr(t),
		"shop-schema": "http://" + testenv.RefusingAddr(t),
	}
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": instances["export-reader"],
		"SALES_WRITER_URLS": instances["sales-writer"], "SHOP_SCHEMA_URLS": instances["shop-schema"]})
	metrics := scrape(t, gw.AdminURL)
	// The key store's pool is measured as the services' pools are.
	if got := grep(metrics, `pgxpool_max_conns{pool="postgres"}`); !strings.HasSuffix(got, " 4") {
		t.Errorf("pool size series = %q, want the key store's 4", got)
	}
	// And so is the Redis client's (go-redis PoolStats), read at the scrape.
	for _, series := range []string{"redis_pool_total_conns", "redis_pool_idle_conns", "redis_pool_hits_total",
		"redis_pool_misses_total", "redis_pool_waits_total", "redis_pool_timeouts_total", "redis_pool_stale_conns_total"} {
		if grep(metrics, series+`{pool="redis"}`) == "" {
			t.Errorf("no %s series for the Redis client", series)
		}
	}
	if got := grep(metrics, `redis_pool_max_conns{pool="redis"}`); strings.HasSuffix(got, " 0") || got == "" {
		t.Errorf("Redis pool size series = %q, want go-redis' pool size", got)
	}
	for up, instance := range instances {
		wantSeries(t, metrics, "gateway_upstream",
			`gateway_upstream_errors_total{kind="unavailable",upstream="`+up+`",upstream_instance="none"} 0`,
			`gateway_upstream_errors_total{kind="timeout",upstream="`+up+`",upstream_instance="`+instance+`"} 0`,
			`gateway_upstream_errors_total{kind="identity_refused",upstream="`+up+`",upstream_instance="`+instance+`"} 0`,
			`gateway_upstream_retries_total{kind="unreachable",upstream="`+up+`",upstream_instance="`+instance+`"} 0`,
		)
	}
}

// With several instances behind the gateway, a failure is counted under
// the instance that failed (upstream_instance), which the operator takes
// out or restarts; a failure no instance had, every one being out, under
// "none". The writer is out for its readiness (503), never asked: one out
// for a refused connection would be asked all the same
// (upstream.pickRefused), and, refusing still, counted under "none" too
// (upstream.TestADeadUpstreamIsEveryInstanceOutNotARepeat).
func TestUpstreamErrorsNameTheirInstance(t *testing.T) {
	dsn, _, k := seed(t)
	slow, good := slowUpstream(t, 2*time.Second), echoUpstream(t, "good", nil)
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteError(w, http.StatusServiceUnavailable, "not_ready", "the database is not reachable", "r")
	}))
	t.Cleanup(notReady.Close)
	down := notReady.URL
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "UPSTREAM_READ_TIMEOUT": "300ms",
		"EXPORT_READER_URLS": slow.URL + "," + good.URL, "SALES_WRITER_URLS": down, "UPSTREAM_PROBE_INTERVAL": "100ms"})
	statuses := map[int]int{}
	for range 2 { // by id: round-robin, one request each (a GET that timed out is not sent again)
		statuses[do(t, "GET", gw.URL+"/v1/export/items/coin-1", map[string]string{"X-API-Key": k.read}, nil).Status]++
	}
	if want := map[int]int{200: 1, 504: 1}; !maps.Equal(statuses, want) {
		t.Fatalf("two GETs over a slow and a good instance = %v, want %v", statuses, want)
	}
	waitFor(t, 5*time.Second, func() bool { return healthCheck(t, gw.URL, "sales-writer") == "down" })
	if r := do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
		"Idempotency-Key": "k1"}, strings.NewReader("{}")); r.Status != 503 {
		t.Fatalf("confirm with every writer out = %d %s, want 503", r.Status, r.Body)
	}
	metrics := scrape(t, gw.AdminURL)
	wantSeries(t, metrics, "gateway_upstream_errors_total",
		`gateway_upstream_errors_total{kind="timeout",upstream="export-reader",upstream_instance="`+slow.URL+`"} 1`,
		`gateway_upstream_errors_total{kind="timeout",upstream="export-reader",upstream_instance="`+good.URL+`"} 0`,
		`gateway_upstream_errors_total{kind="unavailable",upstream="export-reader",upstream_instance="none"} 0`,
		`gateway_upstream_errors_total{kind="unavailable",upstream="sales-writer",upstream_instance="none"} 1`,
		`gateway_upstream_errors_total{kind="unreachable",upstream="sales-writer",upstream_instance="`+down+`"} 0`,
	)
}

// An answer an instance breaks off or stalls after its head, on the routes
// whose answers are asked for as streams and read whole in the gateway (a
// GET by id, a list page within the budget), is counted under the instance
// that failed it, as one that fails before its head is:
// gateway_upstream_errors_total counts what clients saw (the 502 and 504
// envelopes), and ExportGatewayErrorRatioHigh sends the operator there.
// Read after upstream.Do had returned, such failures were counted
// nowhere: an item broken off, counted when it was read whole in Do,
// no longer was once items were asked for as streams.
func TestAnswerFailingAfterItsHeadIsCountedUnderItsInstance(t *testing.T) {
	dsn, _, k := seed(t)
	reader := readerBreakingOff(t, `{"data":[`, func(answer string) string {
		return map[string]string{"small-broken": "8000", "large-broken": "100000", "small-stall": "8000"}[answer]
	})
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"UPSTREAM_READ_TIMEOUT": "300ms"})
	for _, prefix := range []string{"/v1/export/items/", "/v1/export/items?cursor="} {
		for answer, want := range map[string]int{"small-broken": 502, "large-broken": 502, "small-stall": 504} {
			if r := do(t, "GET", gw.URL+prefix+answer, map[string]string{"X-API-Key": k.read}, nil); r.Status != want {
				t.Errorf("GET %s%s = %d %s, want %d", prefix, answer, r.Status, r.Body, want)
			}
		}
	}
	wantSeries(t, scrape(t, gw.AdminURL), "gateway_upstream_errors_total",
		`gateway_upstream_errors_total{kind="bad_response",upstream="export-reader",upstream_instance="`+reader.URL+`"} 4`,
		`gateway_upstream_errors_total{kind="timeout",upstream="export-reader",upstream_instance="`+reader.URL+`"} 2`)
}

// readerBreakingOff is a fake export-reader that answers each request with
// the Content-Length lengthOf gives its answer's name (answerAsked), writes
// start, and breaks the answer off; one whose name ends in "stall" it
// holds until the test ends first.
func readerBreakingOff(t *testing.T, start string, lengthOf func(answer string) string) *httptest.Server {
	t.Helper()
	stalled := make(chan struct{})
	reader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", lengthOf(answerAsked(r)))
		_, _ = io.WriteString(w, start)
		w.(http.Flusher).Flush()
		if strings.HasSuffix(answerAsked(r), "stall") {
			<-stalled
		}
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(reader.Close)
	t.Cleanup(func() { close(stalled) }) // before the reader closes, which waits for its handlers
	return reader
}

// An answer relayed as it comes (past the gateway's budget of answers held
// whole) that its instance breaks off reaches its client as a 200 cut
// short, which its access line cannot tell from a whole one; it is counted
// under that instance in gateway_upstream_errors_total once it has ended,
// as one read whole is, so that the operator sees it. One that stalls past
// UPSTREAM_READ_TIMEOUT is not: a slow client's reading ends the same way.
func TestAStreamCutShortIsCountedUnderItsInstance(t *testing.T) {
	dsn, _, k := seed(t)
	edge.SetHeldAnswersLimit(t, 1) // every answer over 16 KiB relayed as it comes
	reader := readerBreakingOff(t, `{"data":[`+strings.Repeat(" ", 40_000), func(string) string { return "200000" })
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"UPSTREAM_READ_TIMEOUT": "300ms"})
	for _, path := range []string{"/v1/export/items/broken", "/v1/export/items?cursor=broken", "/v1/export/items/stall"} {
		req, _ := http.NewRequest("GET", gw.URL+path, nil)
		req.Header.Set("X-API-Key", k.read)
		resp, err := http.DefaultClient.Do(req)
		wantCutShort(t, "GET "+path, resp, err)
	}
	waitFor(t, 5*time.Second, func() bool {
		return strings.Contains(string(scrape(t, gw.AdminURL)),
			`gateway_upstream_errors_total{kind="bad_response",upstream="export-reader",upstream_instance="`+reader.URL+`"} 2`)
	})
	if m := string(scrape(t, gw.AdminURL)); !strings.Contains(m, `gateway_upstream_errors_total{kind="timeout",upstream="export-reader",upstream_instance="`+reader.URL+`"} 0`) {
		t.Errorf("a stream that stalled past UPSTREAM_READ_TIMEOUT was counted a timeout of its instance:\n%s", m)
	}
}

// A stream that ends because its client left is not its instance's
// failure, nor is one its client reads whole: only a failure to read the
// stream from the service is counted (relayedStream.Read), not the write's
// to the client that fasthttp passes to CloseWithError. Here a client
// takes an item's head and hangs up while export-reader is still writing,
// another reads one whole; then one broken off by its instance is counted
// alone.
func TestAStreamItsClientLeavesIsNotCounted(t *testing.T) {
	dsn, _, k := seed(t)
	edge.SetHeldAnswersLimit(t, 1) // every answer over 16 KiB relayed as it comes
	const size = 32 << 20          // past every buffer between the service and the client
	writerGaveUp := make(chan struct{}, 1)
	reader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		if answerAsked(r) == "broken" {
			_, _ = io.WriteString(w, strings.Repeat(" ", 40_000))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		chunk := []byte(strings.Repeat(" ", 64<<10))
		for written := 0; written < size; written += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				writerGaveUp <- struct{}{}
				return
			}
		}
	}))
	t.Cleanup(reader.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	series := `gateway_upstream_errors_total{kind="bad_response",upstream="export-reader",upstream_instance="` + reader.URL + `"} `

	conn := dial(t, gw.URL)
	if _, err := io.WriteString(conn, "GET /v1/export/items/left HTTP/1.1\r\nHost: gw\r\nX-API-Key: "+k.read+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET an item: %v, %v; want a 200", resp, err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	select {
	case <-writerGaveUp: // the gateway has closed the stream
	case <-time.After(10 * time.Second):
		t.Fatal("export-reader was still writing an item 10 s after its client left")
	}

	req, _ := http.NewRequest("GET", gw.URL+"/v1/export/items/whole", nil)
	req.Header.Set("X-API-Key", k.read)
	whole, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, whole.Body)
	whole.Body.Close()
	if whole.StatusCode != 200 || n != size || err != nil {
		t.Fatalf("GET an item read whole = %d, %d bytes, %v; want 200 and %d bytes", whole.StatusCode, n, err, size)
	}

	req, _ = http.NewRequest("GET", gw.URL+"/v1/export/items/broken", nil)
	req.Header.Set("X-API-Key", k.read)
	broken, err := http.DefaultClient.Do(req)
	wantCutShort(t, "GET an item broken off", broken, err)
	waitFor(t, 5*time.Second, func() bool {
		m := string(scrape(t, gw.AdminURL))
		return strings.Contains(m, series+"1") || strings.Contains(m, series+"2") || strings.Contains(m, series+"3")
	})
	if m := string(scrape(t, gw.AdminURL)); !strings.Contains(m, series+"1") {
		t.Errorf("want the stream its instance broke off counted alone, not the one its client left nor the one read whole:\n%s", m)
	}
}

// shop-schema's answers are relayed as they come (its upstream reads none
// whole), with their length to an HTTP/1.1 client or in chunks without
// one (fasthttp's writeBodyChunked reads the stream without WriteTo): one
// broken off either way is counted under shop-schema's instance.
func TestAShopSchemaStreamCutShortIsCountedUnderShopSchema(t *testing.T) {
	dsn, _, _ := seed(t)
	var calls atomic.Int64
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Length", "200000")
		}
		_, _ = io.WriteString(w, `{"data":{"pad":"`+strings.Repeat("x", 40_000))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(shop.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": shop.URL})
	for _, framing := range []string{"with a length", "chunked"} {
		resp, err := http.Post(gw.URL+"/v1/sync/prestashop/schema", "application/json", strings.NewReader(`{}`))
		wantCutShort(t, "a shop schema "+framing, resp, err)
	}
	waitFor(t, 5*time.Second, func() bool {
		return strings.Contains(string(scrape(t, gw.AdminURL)),
			`gateway_upstream_errors_total{kind="bad_response",upstream="shop-schema",upstream_instance="`+shop.URL+`"} 2`)
	})
}

// wantCutShort reads resp, the answer to what (err, the request's
// failure), and reports it unless it is a 200 whose body ended short.
func wantCutShort(t *testing.T, what string, resp *http.Response, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err == nil {
		t.Errorf("%s = %d, %d bytes read, %v; want a 200 cut short", what, resp.StatusCode, len(body), err)
	}
}

// A sale that reached no writer (every one refused the connection, or was
// out) is answered 503 upstream_unavailable in the words the writer's own
// 503s use for the same outcome, "nothing was applied" and the same key
// to retry with, so that a platform reads one message for it whoever
// answered; a read keeps the route-neutral message.
func TestSaleThatReachedNoWriterSaysNothingWasApplied(t *testing.T) {
	dsn, _, k := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"EXPORT_READER_URLS": closedURL(t), "SALES_WRITER_URLS": closedURL(t)})
	sale := do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
		"Content-Type": "application/json", "Idempotency-Key": "k1"}, strings.NewReader(`{"external_order_id":"o"}`))
	checkEnvelope(t, sale)
	if sale.Status != 503 || sale.Env.Error == nil || sale.Env.Error.Code != "upstream_unavailable" ||
		!strings.Contains(sale.Env.Error.Message, "nothing was applied") || !strings.Contains(sale.Env.Error.Message, "same Idempotency-Key") {
		t.Errorf("a sale no writer got = %d %s, want 503 upstream_unavailable saying nothing was applied and to keep the key", sale.Status, sale.Body)
	}
	read := do(t, "GET", gw.URL+"/v1/export/items/coin-1", map[string]string{"X-API-Key": k.read}, nil)
	checkEnvelope(t, read)
	if read.Status != 503 || read.Env.Error == nil || strings.Contains(read.Env.Error.Message, "applied") {
		t.Errorf("a read no reader got = %d %s, want 503 without a word of anything applied", read.Status, read.Body)
	}
}

func TestConnectionRefusedIsRetriedOnAnotherInstance(t *testing.T) {
	dsn, _, k := seed(t)
	var hitsA, hitsB atomic.Int64
	echoA, b := echoUpstream(t, "a", &hitsA), echoUpstream(t, "b", &hitsB)
	handler, firstProbe := probed(echoA.Config.Handler)
	a := httptest.NewServer(handler)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": a.URL + "," + b.URL,
		"UPSTREAM_PROBE_INTERVAL": "1h"})
	waitFor(t, 5*time.Second, closed(firstProbe))
	a.Close() // refused from now on; only the proxy itself can notice
	for i := 0; i < 4; i++ {
		// By id: round-robin, so one of the first two goes to a (a list
		// request might stick to b, by its key, and never meet a).
		if r := do(t, "GET", gw.URL+"/v1/export/items/coin-1", map[string]string{"X-API-Key": k.read}, nil); r.Status != 200 {
			t.Fatalf("GET %d with one of two instances refusing = %d %s, want 200", i+1, r.Status, r.Body)
		}
	}
	if hitsB.Load() != 4 {
		t.Errorf("instance b served %d, want 4", hitsB.Load())
	}
	// The client saw nothing, the operator sees all: the covered failure
	// counted, and which instance went down, once.
	metrics := scrape(t, gw.AdminURL)
	wantSeries(t, metrics, "gateway_upstream",
		`gateway_upstream_errors_total{kind="unreachable",upstream="export-reader",upstream_instance="`+a.URL+`"} 0`, // no client saw one
		`gateway_upstream_retries_total{kind="unreachable",upstream="export-reader",upstream_instance="`+a.URL+`"} 1`,
		`gateway_upstream_retries_total{kind="unreachable",upstream="export-reader",upstream_instance="`+b.URL+`"} 0`,
	)
	logs := gw.Logs.String()
	downs := 0
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"msg":"upstream instance marked down"`) && strings.Contains(line, `"instance":"`+a.URL+`"`) {
			downs++
		}
	}
	if downs != 1 || !strings.Contains(logs, `"msg":"upstream attempt failed; request sent again"`) ||
		!strings.Contains(logs, "upstream: unreachable: "+a.URL) {
		t.Errorf("logs do not name the refusing instance %s once as down and in the failed attempt:\n%s", a.URL, logs)
	}
}

func TestListRequestsOfOneKeyStickToOneInstance(t *testing.T) {
	dsn, _, k := seed(t)
	urls := []string{}
	for _, name := range []string{"a", "b", "c"} {
		urls = append(urls, echoUpstream(t, name, nil).URL)
	}
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": strings.Join(urls, ",")})
	instanceOf := func(path, key string) string {
		t.Helper()
		r := do(t, "GET", gw.URL+path, map[string]string{"X-API-Key": key}, nil)
		if r.Status != 200 {
			t.Fatalf("GET %s = %d %s, want 200", path, r.Status, r.Body)
		}
		return decodeSeen(t, r).Instance
	}
	lists, items := map[string]bool{}, map[string]bool{}
	for i := range 6 {
		lists[instanceOf("/v1/export/items?limit=10&cursor=c"+strconv.Itoa(i), k.read)] = true
		items[instanceOf("/v1/export/items/coin-"+strconv.Itoa(i), k.read)] = true
	}
	if len(lists) != 1 {
		t.Errorf("6 list requests of one key landed on instances %v; want one", lists)
	}
	if len(items) != 3 {
		t.Errorf("6 item requests landed on instances %v; want all 3 (round-robin)", items)
	}
}

// A sale repeated on another instance carries an identity signed again,
// after the first instance failed, not the first attempt's: with a long
// UPSTREAM_READ_TIMEOUT the old signature would be too old for the service.
func TestRepeatedSaleIsSignedAgain(t *testing.T) {
	dsn, _, k := seed(t)
	type drop struct{ signedAt, droppedAt int64 }
	drops := make(chan drop, 8)
	slowBroken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		signedAt, _ := strconv.ParseInt(r.Header.Get(identity.HeaderTime), 10, 64)
		time.Sleep(20 * time.Millisecond)
		drops <- drop{signedAt, time.Now().UnixMilli()}
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(slowBroken.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"SALES_WRITER_URLS": slowBroken.URL + "," + echoUpstream(t, "good", nil).URL})
	confirm := gw.URL + "/v1/export/items/coin-1/sales/confirm"
	repeated := 0
	for i := range 4 {
		r := do(t, "POST", confirm, map[string]string{"X-API-Key": k.write, "Idempotency-Key": "k" + strconv.Itoa(i)}, strings.NewReader("{}"))
		if r.Status != 200 {
			t.Fatalf("confirm %d = %d %s, want 200 (repeated on the good instance)", i+1, r.Status, r.Body)
		}
		select {
		case d := <-drops:
			repeated++
			renewed, _ := strconv.ParseInt(http.Header(decodeSeen(t, r).Headers).Get(identity.HeaderTime), 10, 64)
			if d.signedAt >= d.droppedAt || renewed < d.droppedAt {
				t.Errorf("confirm %d: signed at %d, first instance dropped it at %d, repeat signed at %d; want the repeat signed after the drop",
					i+1, d.signedAt, d.droppedAt, renewed)
			}
		default:
		}
	}
	if repeated == 0 {
		t.Fatal("no confirm reached the failing instance first; the test proved nothing")
	}
}

func TestOnlySalesWithIdempotencyKeyAreRepeated(t *testing.T) {
	dsn, _, k := seed(t)
	var broken, good atomic.Int64
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"SALES_WRITER_URLS": brokenUpstream(t, &broken).URL + "," + echoUpstream(t, "good", &good).URL})
	confirm := gw.URL + "/v1/export/items/coin-1/sales/confirm"
	for i := 0; i < 4; i++ {
		r := do(t, "POST", confirm, map[string]string{"X-API-Key": k.write, "Idempotency-Key": "k" + strconv.Itoa(i)}, strings.NewReader("{}"))
		if r.Status != 200 {
			t.Fatalf("confirm %d with an Idempotency-Key = %d %s, want 200 (repeated on the good instance)", i+1, r.Status, r.Body)
		}
	}
	broken.Store(0)
	good.Store(0)
	failed := 0
	for i := 0; i < 6; i++ {
		if r := do(t, "POST", confirm, map[string]string{"X-API-Key": k.write}, strings.NewReader("{}")); r.Status == 502 {
			failed++
		}
	}
	if got := broken.Load() + good.Load(); got != 6 || int64(failed) != broken.Load() {
		t.Errorf("6 confirms without Idempotency-Key: %d reached an instance, %d failed, broken saw %d; want 6 reached and every broken one failed (never repeated)",
			got, failed, broken.Load())
	}
}

// A service's 401 means it refused the identity the gateway signed (the
// key was already checked): the client gets a 502 that says the fault is
// the gateway's, not a 401 that would send it to rotate a valid key, and
// the cause is logged for the SRE.
func TestServiceRefusingTheIdentityIsNotTheClientsFault(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil) // checks gatewaytest.IdentitySecret
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"IDENTITY_SECRET": "another-identity-secret-0123456789abcdefgh"})
	r := do(t, "GET", gw.URL+"/v1/export/items/coin-1", map[string]string{"X-API-Key": k.read}, nil)
	checkEnvelope(t, r)
	if r.Status != http.StatusBadGateway || r.Env.Error == nil || r.Env.Error.Code != "bad_gateway" {
		t.Fatalf("GET with a secret the service does not share = %d %s, want 502 bad_gateway", r.Status, r.Body)
	}
	if r.Header.Get("WWW-Authenticate") != "" {
		t.Errorf("the 502 carries a 401's challenge: %q", r.Header.Get("WWW-Authenticate"))
	}
	waitFor(t, 2*time.Second, func() bool { return strings.Contains(gw.Logs.String(), "IDENTITY_SECRET differs") })
	if got := grep(scrape(t, gw.AdminURL), `kind="identity_refused"`); !strings.Contains(got, "} 1") {
		t.Errorf("upstream errors metric: %q, want one identity_refused", got)
	}
}

// The gateway signs its health probes, so a service that would refuse
// every request's identity (another IDENTITY_SECRET) fails its probe: it is
// taken out and /v1/health shows it down, instead of looking healthy while
// every call through it is a 502.
func TestServiceWithAnotherSecretIsShownDown(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "UPSTREAM_PROBE_INTERVAL": "100ms",
		"EXPORT_READER_URLS": serviceHolding(t, gatewaytest.IdentitySecret), "SALES_WRITER_URLS": serviceHolding(t, gatewaytest.IdentitySecret+"-other")})
	waitFor(t, 5*time.Second, func() bool { return healthCheck(t, gw.URL, "sales-writer") == "down" })
	if got := healthCheck(t, gw.URL, "export-reader"); got != "ok" {
		t.Errorf("health of a service with the same secret = %q, want ok", got)
	}
	// The log says why, so on-call looks at the secret, not the database.
	if !strings.Contains(gw.Logs.String(), `"reason":"its health probe was answered 503 identity_refused"`) {
		t.Errorf("no log line names the identity refusal:\n%s", gw.Logs.String())
	}
}

// shopSchemaSecret is the SHOP_SCHEMA_IDENTITY_SECRET of the tests that
// set one.
const shopSchemaSecret = "edge-test-shop-schema-identity-secret-0123456789"

// shop-schema's calls and health probes are signed with
// SHOP_SCHEMA_IDENTITY_SECRET, and only theirs: with each service holding
// its own secret, every call through the gateway is answered, and with the
// two secrets swapped between the services, every service is taken out (a
// shop-schema that holds IDENTITY_SECRET, or an export-reader or a
// sales-writer that accepts shop-schema's, would be a way around the
// separation).
func TestShopSchemaIsSignedForWithASecretOfItsOwn(t *testing.T) {
	dsn, _, k := seed(t)
	services := func(others, shopSchema string) map[string]string {
		return map[string]string{"DATABASE_URL": dsn, "UPSTREAM_PROBE_INTERVAL": "100ms", "SHOP_SCHEMA_IDENTITY_SECRET": shopSchemaSecret,
			"EXPORT_READER_URLS": serviceHolding(t, others), "SALES_WRITER_URLS": serviceHolding(t, others),
			"SHOP_SCHEMA_URLS": serviceHolding(t, shopSchema)}
	}
	gw := gatewaytest.Start(t, services(gatewaytest.IdentitySecret, shopSchemaSecret))
	calls := []struct{ method, path, key string }{
		{"GET", "/v1/export/items/coin-1", k.read},
		{"POST", "/v1/export/items/coin-1/sales/confirm", k.write},
		{"POST", "/v1/sync/prestashop/schema", ""},
	}
	for _, c := range calls {
		r := do(t, c.method, gw.URL+c.path, map[string]string{"X-API-Key": c.key}, strings.NewReader("{}"))
		if r.Status != http.StatusOK {
			t.Errorf("%s %s to a service holding its own secret = %d %s, want 200", c.method, c.path, r.Status, r.Body)
		}
	}
	swapped := gatewaytest.Start(t, services(shopSchemaSecret, gatewaytest.IdentitySecret))
	for _, name := range []string{"export-reader", "sales-writer", "shop-schema"} {
		waitFor(t, 5*time.Second, func() bool { return healthCheck(t, swapped.URL, name) == "down" })
	}
}

// serviceHolding is a service that holds secret as a real one does
// (httpserver): its health probe answers 503 identity_refused and its
// calls 401 unless signed with secret; a call signed with it is answered
// 200.
func serviceHolding(t *testing.T, secret string) string {
	t.Helper()
	signer, err := identity.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteData(w, http.StatusOK, map[string]string{}, envelope.Meta{})
	})
	srv := httpserver.New(httpserver.Config{Service: "holding", Log: slog.New(slog.NewJSONHandler(io.Discard, nil)), Signer: signer}, mux)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

// The access line names the upstream instance that answered: with several
// instances of a service, a slow 200 is otherwise tied to none of them.
func TestAccessLineNamesTheInstance(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	r := do(t, "GET", gw.URL+"/v1/export/items/coin-1", map[string]string{"X-API-Key": k.read}, nil)
	if r.Status != 200 {
		t.Fatalf("GET = %d %s", r.Status, r.Body)
	}
	if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); !strings.Contains(line, `"upstream_instance":"`+reader.URL+`"`) {
		t.Errorf("access line = %s, want upstream_instance %s", line, reader.URL)
	}
}

// A sale whose first instance timed out and that was sent again to
// another (its Idempotency-Key makes that safe) names on its access line
// the instance that timed out, and the kind, beside the one that answered:
// the "sent again" warning is throttled, and without them the read timeout
// the request spent would be tied to the instance that did not spend it.
func TestAccessLineNamesTheInstanceThatFailedARepeatedRequest(t *testing.T) {
	dsn, _, k := seed(t)
	hanging, good := slowUpstream(t, time.Second), echoUpstream(t, "good", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "UPSTREAM_READ_TIMEOUT": "300ms",
		"SALES_WRITER_URLS": hanging.URL + "," + good.URL})
	for i := range 2 { // round-robin: one of the two meets the hanging instance first
		r := do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
			"Idempotency-Key": "k" + strconv.Itoa(i)}, strings.NewReader("{}"))
		if r.Status != 200 {
			t.Fatalf("confirm %d = %d %s, want 200 (sent again to the good instance)", i+1, r.Status, r.Body)
		}
		line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID)
		if !strings.Contains(line, `"upstream_failed_instance"`) {
			continue
		}
		for _, want := range []string{`"upstream_failed_instance":"` + hanging.URL + `"`, `"upstream_failed_kind":"timeout"`,
			`"upstream_instance":"` + good.URL + `"`} {
			if !strings.Contains(line, want) {
				t.Errorf("access line = %s, want %s", line, want)
			}
		}
		return
	}
	t.Fatalf("no confirm's access line names a failed instance:\n%s", gw.Logs.String())
}

// A shop schema read changes nothing, so, as a GET, it is sent again when
// its connection was found closed before any answer: the usual fate of a
// kept-alive connection to a shop-schema instance that restarted (an ops
// probe got a 502 from 5 of 6 restarts with another instance up). Its 502
// does not speak of a write; that of a sale sent with an Idempotency-Key
// tells the client to retry under the same key.
func TestShopSchemaReadIsRepeatedWhenItsConnectionClosed(t *testing.T) {
	dsn, _, k := seed(t)
	var broken atomic.Int64
	brokenURL := brokenUpstream(t, &broken).URL
	// The repeat is signed again (renewIdentity), with shop-schema's own
	// secret, which the good instance holds.
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_IDENTITY_SECRET": shopSchemaSecret,
		"SHOP_SCHEMA_URLS": brokenURL + "," + serviceHolding(t, shopSchemaSecret)})
	json := map[string]string{"Content-Type": "application/json"}
	for i := range 4 {
		if r := do(t, "POST", gw.URL+"/v1/sync/prestashop/schema", json, strings.NewReader(`{}`)); r.Status != 200 {
			t.Fatalf("shop schema read %d = %d %s, want 200 (sent again to the good instance)", i+1, r.Status, r.Body)
		}
	}
	if broken.Load() == 0 {
		t.Fatal("no read reached the broken instance first; the test proved nothing")
	}
	if strings.Contains(gw.Logs.String(), "could not renew the identity") {
		t.Errorf("a repeated shop schema read's identity was not signed again:\n%s", gw.Logs.String())
	}

	only := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": brokenURL, "SALES_WRITER_URLS": brokenURL})
	r := do(t, "POST", only.URL+"/v1/sync/prestashop/schema", json, strings.NewReader(`{}`))
	if r.Status != 502 || r.Env.Error == nil || strings.Contains(r.Env.Error.Message, "Idempotency-Key") {
		t.Errorf("shop schema read whose every instance closed = %d %s, want 502 saying nothing of a write", r.Status, r.Body)
	}
	r = do(t, "POST", only.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
		"Content-Type": "application/json", "Idempotency-Key": "k1"}, strings.NewReader(`{"external_order_id":"o"}`))
	if r.Status != 502 || r.Env.Error == nil || !strings.Contains(r.Env.Error.Message, "the sale may have been applied: retry it with the same Idempotency-Key") {
		t.Errorf("sale whose instance closed = %d %s, want 502 saying the sale may have been applied", r.Status, r.Body)
	}
}

// A sale's 502 or 504 tells the client to retry with the same
// Idempotency-Key only when the sale was sent with one: without a key
// there is nothing to retry with (and the writer refuses a keyless sale
// 400 anyway), so the answer is the generic one.
func TestSaleFailureAdviceNeedsAnIdempotencyKey(t *testing.T) {
	dsn, _, k := seed(t)
	var hits atomic.Int64
	broken := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SALES_WRITER_URLS": brokenUpstream(t, &hits).URL})
	slow := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "UPSTREAM_READ_TIMEOUT": "300ms",
		"SALES_WRITER_URLS": slowUpstream(t, time.Second).URL})
	const advice = "the sale may have been applied: retry it with the same Idempotency-Key"
	for _, tt := range []struct {
		name, base, idempotencyKey string
		status                     int
		advised                    bool
	}{
		{"dropped, with a key", broken.URL, "k1", 502, true},
		{"dropped, without a key", broken.URL, "", 502, false},
		{"timed out, with a key", slow.URL, "k2", 504, true},
		{"timed out, without a key", slow.URL, "", 504, false},
	} {
		headers := map[string]string{"X-API-Key": k.write, "Content-Type": "application/json"}
		if tt.idempotencyKey != "" {
			headers["Idempotency-Key"] = tt.idempotencyKey
		}
		r := do(t, "POST", tt.base+"/v1/export/items/coin-1/sales/confirm", headers, strings.NewReader(`{"external_order_id":"o"}`))
		checkEnvelope(t, r)
		if r.Status != tt.status || r.Env.Error == nil || strings.Contains(r.Env.Error.Message, advice) != tt.advised {
			t.Errorf("%s: confirm = %d %s, want %d with the Idempotency-Key advice %v", tt.name, r.Status, r.Body, tt.status, tt.advised)
		}
	}
}

// A sale sent again after its first attempt may have reached a writer
// (here one that closed the connection once it had the request, as a
// writer killed after its commit does) is answered as that attempt's
// failure when the repeat settles nothing: another writer's 503 says
// "nothing was applied" of its own attempt only, and relayed it told the
// platform that a sale the first writer may have applied was not (it may
// give up, or change the request); a writer refusing the gateway's
// identity (401) got the 502 "the fault is ours", saying nothing of the
// first attempt. Sent once, each is answered as it was before.
func TestSaleRepeatThatSettlesNothingKeepsTheFirstAttemptsDoubt(t *testing.T) {
	dsn, _, k := seed(t)
	for _, tt := range []struct {
		name       string
		answer     func(w http.ResponseWriter, r *http.Request)
		onceStatus int
		onceSays   string // the answer when sent once
	}{
		{"a writer's 503", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			envelope.WriteError(w, http.StatusServiceUnavailable, "unavailable",
				"the sale store did not answer in time; nothing was applied: retry with backoff and the same Idempotency-Key", r.Header.Get(identity.HeaderRequestID))
		}, 503, "nothing was applied"},
		{"a writer refusing the identity", func(w http.ResponseWriter, r *http.Request) {
			envelope.WriteError(w, http.StatusUnauthorized, "unauthenticated", "the request did not come through the gateway", "r")
		}, 502, "the fault is ours"},
	} {
		var closed, answered atomic.Int64
		second := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/healthz" {
				return
			}
			answered.Add(1)
			tt.answer(w, r)
		}))
		t.Cleanup(second.Close)
		gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
			"SALES_WRITER_URLS": brokenUpstream(t, &closed).URL + "," + second.URL})
		for i := range 4 {
			closedBefore := closed.Load()
			r := do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
				"Content-Type": "application/json", "Idempotency-Key": fmt.Sprintf("k%d", i)}, strings.NewReader(`{"external_order_id":"o"}`))
			checkEnvelope(t, r)
			if r.Env.Error == nil {
				t.Fatalf("%s: sale %d = %d %s, want an error", tt.name, i, r.Status, r.Body)
			}
			firstWasClosed := closed.Load() > closedBefore
			if firstWasClosed && (r.Status != 502 || !strings.Contains(r.Env.Error.Message, "the sale may have been applied")) {
				t.Errorf("%s: sale %d, its first attempt closed, its repeat answered so = %d %s, want 502 saying the sale may have been applied",
					tt.name, i, r.Status, r.Body)
			}
			if !firstWasClosed && (r.Status != tt.onceStatus || !strings.Contains(r.Env.Error.Message, tt.onceSays)) {
				t.Errorf("%s: sale %d, sent once = %d %s, want %d saying %q", tt.name, i, r.Status, r.Body, tt.onceStatus, tt.onceSays)
			}
		}
		if closed.Load() == 0 || answered.Load() <= closed.Load() {
			t.Fatalf("%s: %d first attempts closed, %d answered by the other writer; want some of each and every closed one sent again: the test proved nothing",
				tt.name, closed.Load(), answered.Load())
		}
	}
}

// A sale the gateway answers itself (here its writer closed the
// connection: "the sale may have been applied") leaves no access line in
// the writer, which would name its item and Idempotency-Key: the
// gateway's line names them, so that the request id a platform quotes
// still leads to the sale to reconcile. The item id is decoded, as the
// writer reads it, and a value holding an API key is not recorded.
func TestSaleTheGatewayAnswersNamesItsItemAndKey(t *testing.T) {
	dsn, _, k := seed(t)
	var hits atomic.Int64
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SALES_WRITER_URLS": brokenUpstream(t, &hits).URL})
	for _, tt := range []struct {
		path, idempotencyKey string
		want, notWant        []string
	}{
		{"/v1/export/items/coin%201/sales/confirm", "order-7-confirm",
			[]string{`"item_id":"coin 1"`, `"idempotency_key":"order-7-confirm"`, `"sale_applied":"maybe"`}, nil},
		{"/v1/export/items/coin-1/sales/cancel", "pasted " + k.write,
			[]string{`"item_id":"coin-1"`, `"idempotency_key":"[holds an API key]"`, `"sale_applied":"maybe"`}, []string{k.write}},
	} {
		r := do(t, "POST", gw.URL+tt.path, map[string]string{"X-API-Key": k.write, "Content-Type": "application/json",
			"Idempotency-Key": tt.idempotencyKey}, strings.NewReader(`{"external_order_id":"o"}`))
		if r.Status != 502 {
			t.Fatalf("POST %s to a writer that closes = %d %s, want 502", tt.path, r.Status, r.Body)
		}
		line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID)
		for _, want := range tt.want {
			if !strings.Contains(line, want) {
				t.Errorf("POST %s: access line %s, want %s in it", tt.path, line, want)
			}
		}
		for _, notWant := range tt.notWant {
			if strings.Contains(line, notWant) {
				t.Errorf("POST %s: access line %s holds the API key", tt.path, line)
			}
		}
	}
	// A sale no writer took says nothing was applied, on its line too.
	none := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SALES_WRITER_URLS": closedURL(t)})
	r := do(t, "POST", none.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
		"Content-Type": "application/json", "Idempotency-Key": "k-none"}, strings.NewReader(`{"external_order_id":"o"}`))
	if line := accessLine(none.Logs.String(), r.Env.Meta.RequestID); r.Status != 503 || !strings.Contains(line, `"sale_applied":"no"`) {
		t.Errorf("a sale no writer took = %d, access line %s; want 503 and sale_applied no", r.Status, line)
	}
}
