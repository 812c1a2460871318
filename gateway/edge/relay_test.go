package edge_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/gateway/gatewaytest"
)

// writeHeadThenTail answers with head and the length of head and tail,
// flushes, and writes tail only once released (or after 10 s, so that a
// failing gateway does not hang the test): a large answer whose first
// bytes reach the client while its service is still writing.
func writeHeadThenTail(w http.ResponseWriter, head, tail string, release <-chan struct{}) {
	w.Header().Set("Content-Length", strconv.Itoa(len(head)+len(tail)))
	_, _ = io.WriteString(w, head)
	w.(http.Flusher).Flush()
	select {
	case <-release:
	case <-time.After(10 * time.Second):
	}
	_, _ = io.WriteString(w, tail)
}

// A shop schema answer is streamed to the client, and shop-schema holds its
// read's slot until the client has taken the whole answer: a large schema
// (a shop of the caller's own can make one) read slowly keeps the call in
// flight all that time. The address's slot is held as long, or one address
// could start a call per rate-limit token and hold every one of
// shop-schema's slots while reading slowly, which the cap is there to
// prevent.
func TestShopSchemaSlotIsHeldUntilTheAnswerIsRelayed(t *testing.T) {
	dsn, _, _ := seed(t)
	release := make(chan struct{}, 64) // one per call let through to its end
	var arrived atomic.Int64
	// More than the buffers between shop-schema and the client hold, so
	// that the client gets the answer's head before its end.
	head, tail := `{"data":{"pad":"`+strings.Repeat("x", 1<<20), `"},"meta":{}}`
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		arrived.Add(1)
		// shop-schema blocked writing to a slow reader.
		w.Header().Set("Content-Type", "application/json")
		writeHeadThenTail(w, head, tail, release)
	}))
	t.Cleanup(shop.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": shop.URL,
		"RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT": "1", "RATE_LIMIT_SHOP_SCHEMA": "1000-M"})
	url := gw.URL + "/v1/sync/prestashop/schema"
	call := func() *http.Response {
		t.Helper()
		r, err := http.Post(url, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := call()
	defer first.Body.Close()
	if first.StatusCode != 200 {
		t.Fatalf("first call = %d, want 200", first.StatusCode)
	}
	// The first answer's head is here, its body still on its way.
	second := call()
	second.Body.Close()
	if second.StatusCode != 429 || arrived.Load() != 1 {
		t.Errorf("second call while the first answer is relayed = %d (%d calls reached shop-schema), want 429 and 1",
			second.StatusCode, arrived.Load())
	}
	release <- struct{}{}
	if b, err := io.ReadAll(first.Body); err != nil || string(b) != head+tail {
		t.Fatalf("first answer: %d bytes, %v; want it whole (%d bytes)", len(b), err, len(head+tail))
	}
	first.Body.Close()
	// The slot is given back once the answer is through, and also when
	// its client leaves halfway.
	slotFree := func() bool {
		r := call()
		defer r.Body.Close()
		_, _ = io.Copy(io.Discard, r.Body)
		return r.StatusCode == 200
	}
	fill := func() {
		for len(release) < cap(release) {
			release <- struct{}{}
		}
	}
	fill()
	waitFor(t, 5*time.Second, slotFree)
	for len(release) > 0 { // no call is in flight
		<-release
	}
	left := call()
	if left.StatusCode != 200 {
		t.Fatalf("call after the first = %d, want 200", left.StatusCode)
	}
	left.Body.Close() // unread: the connection is dropped
	fill()
	waitFor(t, 5*time.Second, slotFree)
}

// A list page of large items (up to MaxPageBytes, 4 MiB, and the item that
// passed it), or a large item, is relayed as it comes once the gateway
// holds its budget of answers read whole (heldAnswersLimit), and the
// owner's slot is held until the client has taken it: read whole, with the
// slot given back once the reader had answered, each page was held in the
// gateway while its client read it, and one key's 100 connections reading
// 5 MB pages slowly held 850 MB there (the deployment's limit is 256 Mi);
// 400 connections reading 1 MB items, 450 MB. An answer within the budget
// is still read whole: an instance that breaks it off gets the client a 502
// envelope, not a 200 cut short.
func TestLargeListPageIsStreamedAndHoldsTheOwnersSlot(t *testing.T) {
	for _, route := range []struct{ name, prefix string }{
		{"list page", "/v1/export/items?cursor="},
		{"item", "/v1/export/items/"},
	} {
		t.Run(route.name, func(t *testing.T) { testLargeAnswerIsStreamedAndHoldsTheOwnersSlot(t, route.prefix) })
	}
}

// answerAsked is what a fake export-reader is asked to answer: the list
// page's cursor, or the item's id.
func answerAsked(r *http.Request) string {
	if cursor := r.URL.Query().Get("cursor"); cursor != "" {
		return cursor
	}
	return path.Base(r.URL.Path)
}

func testLargeAnswerIsStreamedAndHoldsTheOwnersSlot(t *testing.T, prefix string) {
	dsn, _, k := seed(t)
	edge.SetHeldAnswersLimit(t, 1<<20)
	release := make(chan struct{}, 64)
	var arrived, finished atomic.Int64
	// Over the budget, and more than the buffers between the reader and
	// the client hold, so that a client gets the head of a streamed page
	// before its end.
	head, tail := `{"data":[{"id":"big","pad":"`+strings.Repeat("x", 3<<20), `"}],"meta":{"next_cursor":null}}`
	small := `{"data":[` + strings.Repeat(`{"id":"a1"},`, 50_000/12)
	reader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if answerAsked(r) == "small" { // an ordinary page, broken off halfway
			w.Header().Set("Content-Length", strconv.Itoa(2*len(small)))
			_, _ = io.WriteString(w, small)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		arrived.Add(1)
		writeHeadThenTail(w, head, tail, release)
		finished.Add(1)
	}))
	t.Cleanup(reader.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"RATE_LIMIT_OWNER_IN_FLIGHT": "2", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1"})
	get := func(answer string) *http.Response {
		t.Helper()
		req, err := http.NewRequest("GET", gw.URL+prefix+answer, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", k.read)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := get("big")
	defer first.Body.Close()
	if first.StatusCode != 200 || finished.Load() != 0 {
		t.Fatalf("first answer = %d with the reader's answer finished %d times, want 200 before the reader has finished it (relayed as it comes)",
			first.StatusCode, finished.Load())
	}
	// The first answer's head is here, its body still on its way: the
	// owner's only export slot is still taken.
	second := get("big")
	body, _ := io.ReadAll(second.Body)
	second.Body.Close()
	if second.StatusCode != 429 || arrived.Load() != 1 || !strings.Contains(string(body), "in flight") {
		t.Errorf("second answer while the first is relayed = %d %.200s (%d reached the reader), want 429 of the owner's cap and 1",
			second.StatusCode, body, arrived.Load())
	}
	wantSeries(t, scrape(t, gw.AdminURL), "gateway_answers_past_held_limit_total",
		`gateway_answers_past_held_limit_total{way="streamed"} 1`)
	release <- struct{}{}
	if b, err := io.ReadAll(first.Body); err != nil || string(b) != head+tail {
		t.Fatalf("first answer: %d bytes, %v; want it whole (%d bytes)", len(b), err, len(head+tail))
	}
	first.Body.Close()
	// The slot is given back once the page is through.
	for len(release) < cap(release) {
		release <- struct{}{}
	}
	waitFor(t, 5*time.Second, func() bool {
		r := get("big")
		defer r.Body.Close()
		_, _ = io.Copy(io.Discard, r.Body)
		return r.StatusCode == 200
	})
	broken := get("small")
	b, _ := io.ReadAll(broken.Body)
	broken.Body.Close()
	if broken.StatusCode != 502 || !strings.Contains(string(b), `"bad_gateway"`) {
		t.Errorf("an ordinary answer the reader broke off = %d %.200s, want the 502 bad_gateway envelope", broken.StatusCode, b)
	}
}

// The bytes of an answer held whole (heldAnswersLimit) and the owner's
// slot come back on every way a list page or an item ends: one whose
// instance stalls halfway (a 504 once UPSTREAM_READ_TIMEOUT passes), one
// held whole whose client hangs up before taking it, one past the budget
// relayed as it comes whose client hangs up, a small one (relaySmall) its
// instance breaks off (the 502 envelope). Then one broken off is still
// read whole (its 502 envelope; streamed, it would be a 200 cut short),
// and the owner's one export slot is free (a 429 otherwise).
func TestHeldPageBytesAndOwnerSlotComeBackOnEveryEnd(t *testing.T) {
	for _, route := range []struct{ name, prefix string }{
		{"list page", "/v1/export/items?cursor="},
		{"item", "/v1/export/items/"},
	} {
		t.Run(route.name, func(t *testing.T) { testHeldBytesAndSlotComeBack(t, route.prefix) })
	}
}

// testHeldBytesAndSlotComeBack is TestHeldPageBytesAndOwnerSlotComeBackOnEveryEnd
// for the route whose answers prefix+NAME asks for: NAME is what the
// fake reader answers (a cursor, or an item id).
func testHeldBytesAndSlotComeBack(t *testing.T, prefix string) {
	dsn, _, k := seed(t)
	const limit = 10 << 20
	edge.SetHeldAnswersLimit(t, limit)
	held := strings.Repeat("x", 8<<20)      // held whole
	streamed := strings.Repeat("y", 12<<20) // past the budget
	reader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch answerAsked(r) {
		case "stall":
			w.Header().Set("Content-Length", "100000")
			_, _ = io.WriteString(w, `{"data":[`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "held":
			w.Header().Set("Content-Length", strconv.Itoa(len(held)))
			_, _ = io.WriteString(w, held)
		case "streamed":
			w.Header().Set("Content-Length", strconv.Itoa(len(streamed)))
			_, _ = io.WriteString(w, streamed)
		case "small-broken": // read into the client's response at once, were it whole
			w.Header().Set("Content-Length", "8000")
			_, _ = io.WriteString(w, `{"data":[`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "broken": // within what is left of the budget only if all came back
			w.Header().Set("Content-Length", strconv.Itoa(limit/2))
			_, _ = io.WriteString(w, `{"data":[`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(reader.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"UPSTREAM_READ_TIMEOUT": "1s", "RATE_LIMIT_OWNER_IN_FLIGHT": "2", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1"})
	get := func(answer string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", gw.URL+prefix+answer, nil)
		req.Header.Set("X-API-Key", k.read)
		r, err := http.DefaultClient.Do(req)
		if err != nil { // an answer streamed and cut short: its head said 200
			return 0, err.Error()
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	hangUp := func(answer string) { // reads the head and a little, then leaves
		t.Helper()
		conn, err := net.Dial("tcp", gw.URL[len("http://"):])
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = fmt.Fprintf(conn, "GET %s%s HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n\r\n", prefix, answer, k.read)
		head := make([]byte, 64<<10)
		if n, err := io.ReadAtLeast(conn, head, 1024); err != nil || !strings.HasPrefix(string(head[:n]), "HTTP/1.1 200") {
			t.Fatalf("%s answer: %.100q, %v; want its head", answer, head[:n], err)
		}
	}
	if status, body := get("stall"); status != 504 || !strings.Contains(body, `"upstream_timeout"`) {
		t.Errorf("an answer its instance stalled = %d %.200s, want the 504 upstream_timeout envelope", status, body)
	}
	slotFree := func() bool { status, _ := get("empty"); return status == 200 } // an empty answer
	hangUp("held")
	waitFor(t, 10*time.Second, slotFree)
	hangUp("streamed")
	waitFor(t, 10*time.Second, slotFree)
	if status, body := get("small-broken"); status != 502 || !strings.Contains(body, `"bad_gateway"`) {
		t.Errorf("a small answer broken off = %d %.200s, want the 502 bad_gateway envelope", status, body)
	}
	waitFor(t, 10*time.Second, slotFree)
	if status, body := get("broken"); status != 502 || !strings.Contains(body, `"bad_gateway"`) {
		t.Errorf("an answer broken off after the others ended = %d %.200s, want the 502 bad_gateway envelope (read whole: the budget came back)", status, body)
	}
}

// A list page without a length (from no export-reader: from something in
// front of it) is read whole within the gateway's budget of answers held
// whole (heldAnswersLimit), as one with its length is: while a client that
// does not read holds most of the budget, another such page is a 503
// unavailable with Retry-After, which is not counted against the instance
// (gateway_upstream_errors_total), and once that client has left it is
// served. Read outside the budget, up to 64 MiB each, such pages were
// bounded by nothing together.
func TestAPageWithoutALengthIsHeldWithinTheBudget(t *testing.T) {
	dsn, _, k := seed(t)
	edge.SetHeldAnswersLimit(t, 40<<20)
	// More than the sockets between the gateway and a client that reads
	// nothing take in, so that the first page stays held.
	big := strings.Repeat("x", 24<<20)
	reader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		page := big
		if answerAsked(r) == "smaller" {
			page = big[:12<<20]
		}
		for rest := page; rest != ""; rest = rest[min(len(rest), 1<<20):] { // flushed, so chunked: no length
			_, _ = io.WriteString(w, rest[:min(len(rest), 1<<20)])
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(reader.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	holder, err := net.Dial("tcp", gw.URL[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	_, _ = fmt.Fprintf(holder, "GET /v1/export/items?cursor=big HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n\r\n", k.read)
	head := make([]byte, 4096)
	if n, err := io.ReadAtLeast(holder, head, 100); err != nil || !strings.HasPrefix(string(head[:n]), "HTTP/1.1 200") {
		t.Fatalf("the first page: %.100q, %v; want its head", head[:n], err)
	}
	get := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", gw.URL+"/v1/export/items?cursor=smaller", nil)
		req.Header.Set("X-API-Key", k.read)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := do(t, "GET", gw.URL+"/v1/export/items?cursor=smaller", map[string]string{"X-API-Key": k.read}, nil)
	if r.Status != 503 || r.Env.Error == nil || r.Env.Error.Code != "unavailable" || r.Header.Get("Retry-After") != "1" {
		t.Errorf("a page without a length while another holds the budget = %d %.200s (Retry-After %q), want the 503 unavailable envelope with Retry-After: 1",
			r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	checkEnvelope(t, r)
	waitFor(t, 5*time.Second, func() bool { return accessLine(gw.Logs.String(), r.Env.Meta.RequestID) != "" })
	if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); !strings.Contains(line, `"status":503`) || !strings.Contains(line, `"error_code":"unavailable"`) {
		t.Errorf("its access line %s, want status 503 and error_code unavailable", line)
	}
	// Its cause is logged, as every 5xx's is: the access line names the
	// instance the answer came from, which is not why it was refused.
	if cause := grep([]byte(gw.Logs.String()), `"msg":"request failed"`); !strings.Contains(cause, r.Env.Meta.RequestID) || !strings.Contains(cause, "other answers held whole") {
		t.Errorf("the 503's cause line: %q, want one with its request id saying what the answers held", cause)
	}
	metrics := scrape(t, gw.AdminURL)
	for _, series := range strings.Split(grep(metrics, "gateway_upstream_errors_total{"), "\n") {
		if !strings.HasSuffix(series, " 0") {
			t.Errorf("the gateway's own 503 was counted against the instance: %s", series)
		}
	}
	// What ops see of it: the budget held, and the answer it refused.
	wantSeries(t, metrics, "gateway_answers_past_held_limit_total",
		`gateway_answers_past_held_limit_total{way="refused"} 1`, `gateway_answers_past_held_limit_total{way="streamed"} 0`)
	if held := seriesValue(metrics, "gateway_answers_held_bytes"); held < 24<<20 {
		t.Errorf("while the first page is held: gateway_answers_held_bytes %v, want its 24 MiB and more", held)
	}
	holder.Close()
	waitFor(t, 10*time.Second, func() bool {
		r := get()
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode == 200 && len(b) == 12<<20
	})
	waitFor(t, 5*time.Second, func() bool { return seriesValue(scrape(t, gw.AdminURL), "gateway_answers_held_bytes") == 0 })
}
