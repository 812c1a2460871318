package edge_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/gateway/gatewaytest"
)

// A client that asks "Expect: 100-continue" before a body over the limit
// gets the 413 envelope instead of the go-ahead, so it does not send the
// body only to see it refused; one within the limit gets 100 Continue and
// is served.
func TestExpectContinueIsRefusedForABodyOverTheLimit(t *testing.T) {
	dsn, _, k := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"SALES_WRITER_URLS": echoUpstream(t, "writer", nil).URL})
	confirm := "/v1/export/items/coin-1/sales/confirm"
	// The expectation is read in any case (RFC 9110 10.1.1); before
	// fasthttp v1.78, "100-CONTINUE" was not, and the client waited for
	// the read timeout.
	for _, expect := range []string{"100-continue", "100-CONTINUE"} {
		headers := map[string]string{"X-API-Key": k.write, "Content-Type": "application/json",
			"Expect": expect, "Content-Length": strconv.Itoa(edge.BodyLimit + 1)}
		r := doRaw(t, gw.URL, "POST", confirm, headers) // fails on a 100: it is no envelope
		if r.Status != http.StatusRequestEntityTooLarge || r.Env.Error == nil || r.Env.Error.Code != "payload_too_large" ||
			r.Env.Meta.RequestID == "" || r.Header.Get("X-Request-Id") != r.Env.Meta.RequestID {
			t.Errorf("Expect: %s with %d bytes = %d %s, want a 413 payload_too_large envelope", expect, edge.BodyLimit+1, r.Status, r.Body)
		}
	}

	conn := dial(t, gw.URL)
	body := `{"platform_sale_id":"s-1"}`
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\nX-API-Key: %s\r\n"+
		"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", confirm, k.write, len(body))
	br := bufio.NewReader(conn)
	interim, err := http.ReadResponse(br, nil)
	if err != nil || interim.StatusCode != http.StatusContinue {
		t.Fatalf("Expect: 100-continue with %d bytes: %v, %v; want 100 Continue", len(body), interim, err)
	}
	io.WriteString(conn, body)
	final, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer final.Body.Close()
	if final.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(final.Body)
		t.Errorf("after 100 Continue and the body: %d %s, want the writer's 200", final.StatusCode, b)
	}
}

// A 413 is named after the route it was sent to, refused on its declared
// length or before the body with Expect: 100-continue; a chunked body
// passing the limit is unrouted, as fasthttp resets its request then (its
// method and path would read GET /). A sale's 413 names its item (decoded)
// and Idempotency-Key, as every sale's line in the gateway does: it
// reaches no writer, whose line would name them.
func TestBodyTooLargeIsNamedAfterItsRoute(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	confirm := "/v1/export/items/coin%201/sales/confirm"
	const route = `"method":"POST","route":"POST /v1/export/items/{item_id}/sales/confirm","status":413`
	const sale = `"item_id":"coin 1","idempotency_key":"order-9-confirm"`
	json := map[string]string{"Content-Type": "application/json", "Idempotency-Key": "order-9-confirm"}
	overLimit := strings.Repeat(" ", edge.BodyLimit+1)
	answers := map[string]response{
		"declared length": do(t, "POST", gw.URL+confirm, json, strings.NewReader(overLimit)),
		"Expect: 100-continue": doRaw(t, gw.URL, "POST", confirm, map[string]string{"Content-Type": "application/json",
			"Idempotency-Key": "order-9-confirm", "Expect": "100-continue", "Content-Length": strconv.Itoa(edge.BodyLimit + 1)}),
	}
	for how, r := range answers {
		line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID)
		if r.Status != 413 || !strings.Contains(line, route) || !strings.Contains(line, sale) {
			t.Errorf("%s: %d, access line %s; want 413 with %s and %s", how, r.Status, line, route, sale)
		}
	}
	if r := do(t, "POST", gw.URL+"/v1/export/items", json, strings.NewReader(overLimit)); r.Status != 413 ||
		strings.Contains(accessLine(gw.Logs.String(), r.Env.Meta.RequestID), `"item_id"`) {
		t.Errorf("POST /v1/export/items: %d, access line %s; want 413 naming no item", r.Status,
			accessLine(gw.Logs.String(), r.Env.Meta.RequestID))
	}
	chunked := do(t, "POST", gw.URL+confirm, json, io.MultiReader(strings.NewReader(overLimit))) // no Size: chunked
	const unrouted = `"method":"_OTHER","route":"unrouted","status":413`
	if line := accessLine(gw.Logs.String(), chunked.Env.Meta.RequestID); chunked.Status != 413 || !strings.Contains(line, unrouted) {
		t.Errorf("chunked: %d, access line %s; want 413 with %s", chunked.Status, line, unrouted)
	}
	series := `gateway_http_requests_total{route="POST /v1/export/items/{item_id}/sales/confirm",status_class="4xx"} 2`
	if metrics := scrape(t, gw.AdminURL); !bytes.Contains(metrics, []byte(series)) {
		t.Errorf("metrics lack %s:\n%s", series, grep(metrics, "gateway_http_requests_total"))
	}
}

// A 413 is refused before its key is read, but names the key its head
// carries when the key cache knows it (its id, owner and platform, never
// the key): the operator can tell which tenant sends bodies over the
// limit. A key the cache does not know is not looked up for it.
func TestBodyTooLargeNamesACachedKey(t *testing.T) {
	dsn, _, k := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"SALES_WRITER_URLS": echoUpstream(t, "writer", nil).URL})
	confirm := "/v1/export/items/coin-1/sales/confirm"
	if r := do(t, "POST", gw.URL+confirm, map[string]string{"X-API-Key": k.write, "Idempotency-Key": "k1"},
		strings.NewReader("{}")); r.Status != 200 {
		t.Fatalf("confirm = %d %s, want 200 (the key cached)", r.Status, r.Body)
	}
	overLimit := strings.Repeat(" ", edge.BodyLimit+1)
	expectContinue := map[string]string{"X-API-Key": k.write, "Content-Type": "application/json",
		"Expect": "100-continue", "Content-Length": strconv.Itoa(edge.BodyLimit + 1)}
	named := `"owner_id":"` + k.ownerA + `","key_id":"` + k.writeID + `","platform_id":"shop-1"`
	for _, tt := range []struct {
		name string
		r    response
		want string // in the access line; "" for no key named
	}{
		{"declared length", do(t, "POST", gw.URL+confirm, map[string]string{"X-API-Key": k.write}, strings.NewReader(overLimit)), named},
		{"Expect: 100-continue", doRaw(t, gw.URL, "POST", confirm, expectContinue), named},
		{"a key not cached", do(t, "POST", gw.URL+confirm, map[string]string{"X-API-Key": k.noPlatform}, strings.NewReader(overLimit)), ""},
		{"no key", do(t, "POST", gw.URL+confirm, nil, strings.NewReader(overLimit)), ""},
	} {
		line := accessLine(gw.Logs.String(), tt.r.Env.Meta.RequestID)
		if tt.r.Status != 413 || line == "" {
			t.Errorf("%s: %d, access line %q; want 413 and its line", tt.name, tt.r.Status, line)
			continue
		}
		if tt.want != "" && !strings.Contains(line, tt.want) {
			t.Errorf("%s: access line %s; want it to name the key: %s", tt.name, line, tt.want)
		}
		if tt.want == "" && strings.Contains(line, `"key_id"`) {
			t.Errorf("%s: access line %s names a key; want none", tt.name, line)
		}
	}
	if strings.Contains(gw.Logs.String(), k.write[4:20]) || strings.Contains(gw.Logs.String(), k.noPlatform[4:20]) {
		t.Errorf("the logs hold a key:\n%s", gw.Logs.String())
	}
	// The key not cached was not looked up for its 413: one miss, the confirm's.
	if got := grep(scrape(t, gw.AdminURL), `gateway_key_cache_lookups_total{result="miss"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("key cache misses = %q, want 1", got)
	}
}

// A client that sends its whole request before reading (as curl does, and
// every client with a body it has in memory) reads the gateway's refusal
// even when the gateway refused it long before its end: the gateway closes
// in stages (gateway/lingerclose). Closed at once, the bytes still
// arriving would be answered with a reset and the client's write would
// fail (fasthttp issue #1348), leaving it without the envelope and its
// request id.
func TestAClientStillSendingReadsTheRefusal(t *testing.T) {
	dsn, _, k := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	const size = 12 << 20
	confirm := "POST /v1/export/items/coin-1/sales/confirm HTTP/1.1\r\nHost: gateway\r\nX-API-Key: " + k.write +
		"\r\nContent-Type: application/json\r\n"
	tests := []struct {
		name    string
		request string
		status  int
		code    string
	}{
		{"body over the limit", confirm + "Content-Length: " + strconv.Itoa(size) + "\r\n\r\n" + strings.Repeat(" ", size),
			413, "payload_too_large"},
		{"chunked body over the limit", confirm + "Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(size, 16) + "\r\n" +
			strings.Repeat(" ", size) + "\r\n0\r\n\r\n", 413, "payload_too_large"},
		{"head over the limit", "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nX-Padding: " + strings.Repeat("p", size) + "\r\n\r\n",
			431, "headers_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t, gw.URL)
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.WriteString(conn, tt.request); err != nil {
				t.Fatalf("sending %d bytes: %v; want them taken in, then the refusal", len(tt.request), err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			r := response{Status: resp.StatusCode, Header: resp.Header, Body: b}
			if err := json.Unmarshal(b, &r.Env); err != nil || r.Status != tt.status || r.Env.Error == nil ||
				r.Env.Error.Code != tt.code || r.Env.Meta.RequestID != r.Header.Get("X-Request-Id") {
				t.Fatalf("answer %d %s, want %d %s with its request id", r.Status, b, tt.status, tt.code)
			}
		})
	}
}

// A request that cannot be read is a 400 bad_request whatever its bytes
// say: one holding the word "timeout" (a header's value, its path) was
// answered at once 408 request_timeout, "not received in time", and
// logged so, as Fiber takes any error whose text has "timeout" for one,
// and fasthttp's text quotes the bytes it could not read: its request id
// led to a client too slow to send, not to a malformed request.
func TestAnUnreadableRequestSayingTimeoutIsA400(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	for name, request := range map[string]string{
		"a Content-Length not a number": "GET /v1/export/items HTTP/1.1\r\nHost: gateway\r\nX-Note: timeout\r\n" +
			"Content-Length: timeout\r\n\r\n",
		"a request line with two spaces": "GET /v1/timeout  HTTP/1.1\r\nHost: gateway\r\n\r\n",
	} {
		resp, body := rawAnswer(t, gw.URL, request)
		id := resp.Header.Get("X-Request-Id")
		waitFor(t, 2*time.Second, func() bool { return accessLine(gw.Logs.String(), id) != "" })
		line := accessLine(gw.Logs.String(), id)
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"code":"bad_request"`) ||
			!strings.Contains(line, `"status":400,`) || !strings.Contains(line, `"error_code":"bad_request"`) {
			t.Errorf("%s: %d %s, access line %s; want 400 bad_request in both", name, resp.StatusCode, body, line)
		}
	}
}

// A client that stops sending mid-request is answered 408 request_timeout
// once GATEWAY_READ_TIMEOUT passes, wherever it stopped, while a malformed
// request whose bytes say "timeout" is a 400: fasthttp hands some timeouts
// over without the net.Error inside (a chunk's size line wraps it in
// ErrBrokenChunk, a missing trailer is its own ErrTimeout), and those read
// as a 400 bad_request when a timeout was told from the error's type alone.
func TestAClientThatStopsSendingIsA408WhereverItStops(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "GATEWAY_READ_TIMEOUT": "300ms"})
	const post = "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\n"
	const chunked = post + "Transfer-Encoding: chunked\r\n\r\n"
	stopped := map[string]string{
		"in its head":                   "GET /v1/health HTTP/1.1\r\nHost: gateway\r\n",
		"in a body of declared length":  post + "Content-Length: 100\r\n\r\n{\"base",
		"in a chunk":                    chunked + "10\r\n{\"base_url\":\"htt",
		"in a chunk's size":             chunked + "10",
		"in a chunk's size extension":   chunked + "10;x",
		"between a chunk's size and LF": chunked + "10\r",
		"before the trailer":            chunked + "0\r\n",
	}
	for _, name := range slices.Sorted(maps.Keys(stopped)) {
		resp, body := rawAnswer(t, gw.URL, stopped[name])
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), `"code":"request_timeout"`) {
			t.Errorf("stopped %s: %d %s, want 408 request_timeout", name, resp.StatusCode, body)
		}
	}
}

// rawAnswer sends request, written as is, on a new connection to the
// gateway at baseURL, and returns the answer and its body.
func rawAnswer(t *testing.T, baseURL, request string) (*http.Response, []byte) {
	t.Helper()
	return edge.RawAnswer(t, strings.TrimPrefix(baseURL, "http://"), request)
}

// A request not received within GATEWAY_READ_TIMEOUT on a new connection
// is logged with the time its client held the connection, from the
// connection's start, not the moment the 408 took to write: its
// duration_ms is at least the read timeout (a deadline never fires early).
func TestRequestTimeoutIsTimedFromTheConnectionsStart(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "GATEWAY_READ_TIMEOUT": "300ms"})
	resp := edge.UnfinishedRequestAnswer(t, strings.TrimPrefix(gw.URL, "http://"))
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("an unfinished request = %d, want 408", resp.StatusCode)
	}
	var line struct {
		Method     string  `json:"method"`
		Route      string  `json:"route"`
		DurationMS float64 `json:"duration_ms"`
	}
	if err := json.Unmarshal([]byte(accessLine(gw.Logs.String(), resp.Header.Get("X-Request-Id"))), &line); err != nil {
		t.Fatalf("access line of the 408: %v\n%s", err, gw.Logs.String())
	}
	if line.DurationMS < 300 || line.Method != "_OTHER" || line.Route != "unrouted" {
		t.Errorf("access line of the 408 = %+v, want method _OTHER, route unrouted, duration_ms at least the 300 ms read timeout", line)
	}
}

// A client that resets or closes its connection before its request was
// read whole (a load balancer's TCP check, a port scan, a client killed
// mid-upload) is answered and counted as a client that left, 499
// client_closed_request, as the services count one: before, Fiber's 502
// for a network error became a 500 internal_error, counted as the
// gateway's own failure with no cause logged, and then a 400 bad_request,
// a client's fault it had not made.
func TestAResetConnectionIsNoServerError(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	const halfABody = "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\nContent-Length: 100\r\n\r\n{\"base"
	const chunked = "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"10\r\n{\"base_url\":\"htt\r\n"
	const halfASizeLine, halfATrailer = chunked + "1", chunked + "0\r\nX-Trailer: a"
	sent := map[string]string{
		"nothing":           "",
		"half a head":       "GET /v1/health HTTP/1.1\r\nHo",
		"half a body":       halfABody,
		"half a body, shut": halfABody, // closed, not reset
		"half a chunked body": "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"10\r\n{\"base_url\":\"htt",
		// A chunk's size line begun, or every chunk sent and the trailer
		// begun: closed there, fasthttp calls it a broken chunk.
		"half a size line":       halfASizeLine,
		"half a size line, shut": halfASizeLine,
		"half a trailer":         halfATrailer,
		"half a trailer, shut":   halfATrailer,
	}
	for _, name := range slices.Sorted(maps.Keys(sent)) {
		conn := dial(t, gw.URL)
		if _, err := io.WriteString(conn, sent[name]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // read by the server before the reset
		if !strings.HasSuffix(name, "shut") {
			if err := conn.(*net.TCPConn).SetLinger(0); err != nil { // Close sends a reset
				t.Fatal(err)
			}
		}
		conn.Close()
	}
	var lines []string
	waitFor(t, 5*time.Second, func() bool {
		lines = nil
		for l := range strings.SplitSeq(gw.Logs.String(), "\n") {
			if strings.Contains(l, `"route":"unrouted"`) && strings.Contains(l, `"msg":"request"`) {
				lines = append(lines, l)
			}
		}
		return len(lines) >= len(sent)
	})
	for _, l := range lines {
		if !strings.Contains(l, `"status":499,`) || !strings.Contains(l, `"error_code":"client_closed_request"`) {
			t.Errorf("access line of a reset connection = %s, want status 499 client_closed_request", l)
		}
	}
	wantSeries(t, scrape(t, gw.AdminURL), "gateway_http_requests_total",
		`gateway_http_requests_total{route="unrouted",status_class="5xx"} 0`)
	// The 499 is written to no one, as its access line says already: no
	// "answer cut short" line repeats it (one per load balancer's TCP check).
	if cut := grep([]byte(gw.Logs.String()), "answer cut short"); cut != "" {
		t.Errorf("a 499's answer was logged cut short: %s", cut)
	}
}

// Behind a trusted proxy the client IP is the right-most address it did not
// append itself; what the client wrote into X-Forwarded-For is not believed,
// and from an untrusted peer the header is ignored.
func TestClientIPBehindATrustedProxy(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	for _, tc := range []struct {
		name, trusted, want string
	}{
		{"loopback trusted", "127.0.0.1", "198.51.100.4"},
		{"loopback not trusted", "10.0.0.0/8", "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
				"GATEWAY_PROXY_HEADER": "X-Forwarded-For", "GATEWAY_TRUSTED_PROXIES": tc.trusted})
			r := do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": k.read,
				"X-Forwarded-For": "1.1.1.1, 198.51.100.4"}, nil)
			if r.Status != 200 {
				t.Fatalf("GET = %d %s, want 200", r.Status, r.Body)
			}
			if got := http.Header(decodeSeen(t, r).Headers).Get("X-Forwarded-For"); got != tc.want {
				t.Errorf("the service was told the client is %q, want %q", got, tc.want)
			}
			if !strings.Contains(gw.Logs.String(), `"client_ip":"`+tc.want+`"`) {
				t.Errorf("access line lacks client_ip %s:\n%s", tc.want, gw.Logs.String())
			}
		})
	}
}

// A GATEWAY_PROXY_HEADER naming a header a trusted proxy sends that holds
// no address (here a custom one of the scheme; the usual ones are refused
// at start) makes every client the proxy: the first such entry is said,
// its shape and not its value (the header may hold a secret), and no other
// request of the same minute says it again (a minute later it is said
// again: TestAProxyHeaderThatIsNoAddressIsSaidAgainAMinuteLater).
func TestAProxyHeaderThatIsNoAddressIsSaidOnceAMinute(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"GATEWAY_PROXY_HEADER": "X-Client-Scheme", "GATEWAY_TRUSTED_PROXIES": "127.0.0.1"})
	for _, value := range []string{"https", "https", "token-s3cr3t"} {
		r := do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": k.read, "X-Client-Scheme": value}, nil)
		if r.Status != 200 {
			t.Fatalf("GET = %d %s, want 200", r.Status, r.Body)
		}
	}
	logs := gw.Logs.String()
	var warnings []string
	for line := range strings.Lines(logs) {
		if strings.Contains(line, `"setting":"GATEWAY_PROXY_HEADER"`) {
			warnings = append(warnings, line)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], `"level":"WARN"`) || !strings.Contains(warnings[0], `"header":"X-Client-Scheme"`) ||
		!strings.Contains(warnings[0], `"proxy":"127.0.0.1"`) || !strings.Contains(warnings[0], `"entry":"5 bytes: letters"`) {
		t.Errorf("warnings naming GATEWAY_PROXY_HEADER = %q, want one WARN naming the header, the proxy and the entry's shape", warnings)
	}
	if strings.Contains(logs, "https") || strings.Contains(logs, "s3cr3t") {
		t.Errorf("the logs quote the header's value:\n%s", logs)
	}
	if n := strings.Count(logs, `"client_ip":"127.0.0.1"`); n != 3 {
		t.Errorf("%d access lines name the proxy as the client, want all 3:\n%s", n, logs)
	}
}

// A load balancer's own health checks, from a trusted proxy's address and
// naming no client, spend no address's RATE_LIMIT_ANONYMOUS: every check of
// every gateway came from that one address, shared in Redis, and past it the
// checks got 429 and took the gateways out. A client the proxy names is
// counted as before, and so is every caller where the peer is not trusted.
func TestAProxysOwnHealthChecksSpendNoAddressBudget(t *testing.T) {
	dsn, _, _ := seed(t)
	for _, tc := range []struct {
		name, trusted string
		header        map[string]string
		want          []int
	}{
		{"the proxy's own checks", "127.0.0.1", nil, []int{200, 200, 200, 200}},
		{"a client the proxy names", "127.0.0.1", map[string]string{"X-Forwarded-For": "198.51.100.4"},
			[]int{200, 200, 429, 429}},
		{"a peer not trusted", "10.0.0.0/8", nil, []int{200, 200, 429, 429}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "RATE_LIMIT_ANONYMOUS": "2-M",
				"GATEWAY_PROXY_HEADER": "X-Forwarded-For", "GATEWAY_TRUSTED_PROXIES": tc.trusted})
			for i, want := range tc.want {
				if r := do(t, "GET", gw.URL+"/v1/health", tc.header, nil); r.Status != want {
					t.Errorf("health check %d = %d %s, want %d", i+1, r.Status, r.Body, want)
				}
			}
		})
	}
}

// A chunked request that also carries Content-Length, is chunked in
// HTTP/1.0, has another transfer coding or fields after its chunks, or a
// header section with a bare LF or a Transfer_Encoding or Content_Length,
// is refused and its connection closed: a proxy in front that framed it
// otherwise would take the bytes after it for another request (request
// smuggling). What follows on the connection is never answered.
func TestAmbiguousFramingIsRefusedAndTheConnectionClosed(t *testing.T) {
	dsn, _, k := seed(t)
	writer := echoUpstream(t, "writer", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SALES_WRITER_URLS": writer.URL})
	smuggled := "GET /v1/health HTTP/1.1\r\nHost: gateway\r\n\r\n"
	head := "POST /v1/export/items/coin-1/sales/confirm %s\r\nHost: gateway\r\nX-API-Key: " + k.write + "\r\n%s"
	chunked, empty := "2\r\n{}\r\n0\r\n\r\n", "0\r\n\r\n"
	// A form with an epilogue after its last boundary, longer than the
	// 4 KiB fasthttp's multipart reader took of it.
	form := "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b--\r\n" + strings.Repeat("x", 5000)
	tests := []struct {
		name, proto, headers, body string
		refused                    bool
	}{
		{"chunked and a length", "HTTP/1.1", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", chunked, true},
		// fasthttp sets the length of an empty chunked body to 0.
		{"empty chunks and a length", "HTTP/1.1", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", empty, true},
		{"a length, then chunked", "HTTP/1.1", "Transfer-Encoding: chunked\r\ncontent-length: 50\r\n", chunked, true},
		{"identity coding and a length", "HTTP/1.1", "Transfer-Encoding: identity\r\nContent-Length: 2\r\n", "{}", true},
		{"chunked in HTTP/1.0", "HTTP/1.0", "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n", chunked, true},
		{"empty chunks in HTTP/1.0", "HTTP/1.0", "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n", empty, true},
		// fasthttp reads no body after "identity": the body would be the
		// next request.
		{"identity coding alone", "HTTP/1.1", "Transfer-Encoding: identity\r\n", "{}", true},
		{"gzip coding", "HTTP/1.1", "Transfer-Encoding: gzip\r\n", "{}", true},
		{"chunked twice", "HTTP/1.1", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked, true},
		// Fields after the last chunk would be merged into the headers,
		// a key among them.
		{"a trailer field", "HTTP/1.1", "Transfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\nX-Note: 1\r\n\r\n", true},
		// A proxy that reads a bare LF as part of a value sees no
		// Content-Length or Transfer-Encoding here, and takes the body for
		// the next request.
		{"a bare LF before the length", "HTTP/1.1", "X-Note: a\nContent-Length: 2\r\n", "{}", true},
		{"a bare LF after the length", "HTTP/1.1", "Content-Length: 2\nX-Note: 1\r\n", "{}", true},
		{"a bare LF after chunked", "HTTP/1.1", "Transfer-Encoding: chunked\nX-Note: 1\r\n", chunked, true},
		{"a bare LF between other fields", "HTTP/1.1", "Content-Length: 2\r\nX-Note: a\nX-Other: b\r\n", "{}", true},
		// fasthttp ends a head at a bare-LF line, or at a CRLF empty line
		// after one, when a CRLFCRLF comes anywhere later in what it has
		// buffered (here in the next request).
		{"a bare LF ending the last field", "HTTP/1.1", "Content-Length: 2\n", "{}", true},
		{"a bare LF for the empty line", "HTTP/1.1", "Content-Length: 2", "\n{}", true}, // the head's "\r\n" ends the field
		{"a bare LF in a folded line", "HTTP/1.1", "X-Note: a\r\n b\nContent-Length: 2\r\n", "{}", true},
		// fasthttp joins a folded line to the field above; a proxy that
		// does not sees a field of its own.
		{"a folded line", "HTTP/1.1", "X-Note: a\r\n Content-Length: 5\r\nContent-Length: 2\r\n", "{}", true},
		{"a folded Transfer-Encoding", "HTTP/1.1", "Transfer-Encoding:\r\n\tchunked\r\n", chunked, true},
		// fasthttp frames by none of these; a proxy that maps "_" to "-",
		// or reads a space there, does.
		{"Transfer_Encoding", "HTTP/1.1", "Transfer_Encoding: chunked\r\n", chunked, true},
		{"Content_Length", "HTTP/1.1", "content_length: 2\r\n", "{}", true},
		{"a space for the dash of Transfer-Encoding", "HTTP/1.1", "Transfer Encoding: chunked\r\n", chunked, true},
		{"a tab for the dash of Content-Length (fasthttp refuses it)", "HTTP/1.1", "Content\tLength: 2\r\n", "{}", true},
		{"a field named like them", "HTTP/1.1", "Content-Length: 2\r\nTransfer_Encodings: x\r\nContent_Lengthy: 1\r\n", "{}", false},
		{"chunked in upper case", "HTTP/1.1", "Transfer-Encoding: CHUNKED\r\n", chunked, false},
		{"chunked alone", "HTTP/1.1", "Transfer-Encoding: chunked\r\n", chunked, false},
		{"a length alone", "HTTP/1.1", "Content-Length: 2\r\n", "{}", false},
		// Read by its length, not as far as fasthttp's form parser went
		// (FuzzFraming): the rest of the body was read as the next request.
		{"a multipart body with an epilogue", "HTTP/1.1",
			fmt.Sprintf("Content-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n", len(form)), form, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br, resp, body := sendRaw(t, gw.URL, fmt.Sprintf(head, tt.proto, tt.headers)+"\r\n"+tt.body+smuggled)
			if !tt.refused {
				if resp.StatusCode != 200 {
					t.Fatalf("first answer = %d %s, want the sale relayed (200)", resp.StatusCode, body)
				}
				if next, err := http.ReadResponse(br, nil); err != nil || next.StatusCode != 200 {
					t.Errorf("the next request on the connection was not answered 200: %v", err)
				}
				return
			}
			var env struct {
				Error struct{ Code string } `json:"error"`
			}
			if resp.StatusCode != 400 || json.Unmarshal(body, &env) != nil || env.Error.Code != "bad_request" || !resp.Close {
				t.Errorf("answer = %d (close %v) %s, want 400 bad_request and the connection closed", resp.StatusCode, resp.Close, body)
			}
			if rest, _ := io.ReadAll(br); len(rest) > 0 {
				t.Errorf("after the refusal the connection carried %q, want nothing", rest)
			}
		})
	}
}

// sendRaw writes raw on a connection of its own to the gateway at baseURL
// and reads the first answer whole; the reader is left for what follows.
func sendRaw(t *testing.T, baseURL, raw string) (*bufio.Reader, *http.Response, []byte) {
	t.Helper()
	conn := dial(t, baseURL)
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return br, resp, body
}

// A field name with a space inside it, which fasthttp takes as a name of
// its own (it refuses one before the colon), and a Host that is no
// host[:port] are refused, 400 bad_request with a message naming the
// fault, before any key is looked at, and not relayed: a field name is a
// token (RFC 9110 5.1), and RFC 9112 3.2 requires a 400 for a Host field
// with an invalid value. "X-API Key" read as no key by the gateway is read
// as X-API-Key by a proxy that maps it; a key in a Host's user info is
// advised revoked. A bad name closes the connection, as a bare LF does (a
// proxy may read the head otherwise); a bad Host leaves the framing
// clear, and the next request on the connection is served. What real
// clients send is served.
func TestInvalidFieldNamesAndHostsAreRefused(t *testing.T) {
	dsn, _, k := seed(t)
	var hits atomic.Int64
	reader := echoUpstream(t, "reader", &hits)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	next := "GET /v1/health HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n"
	tests := []struct {
		name, head string
		message    string // a part of the refusal's message; "" for a request served
		close      bool
	}{
		{"a space inside X-API-Key", "Host: gateway\r\nX-API Key: " + k.read + "\r\n", "header field name", true},
		{"a space inside another name", "Host: gateway\r\nX-API-Key: " + k.read + "\r\nAccept Language: en\r\n", "header field name", true},
		{"user info in Host", "Host: user:pw@gateway\r\nX-API-Key: " + k.read + "\r\n", "revoke", false},
		{"a key in Host's user info", "Host: user:" + k.read + "@gateway\r\nX-API-Key: " + k.read + "\r\n", "revoke", false},
		{"'<' in Host", "Host: gate<way\r\nX-API-Key: " + k.read + "\r\n", "Host", false},
		{"'\"' in Host", "Host: \"gateway\"\r\nX-API-Key: " + k.read + "\r\n", "Host", false},
		{"UTF-8 in Host", "Host: g\xc3\xa4teway\r\nX-API-Key: " + k.read + "\r\n", "Host", false},
		{"Host with a port", "Host: gateway:8080\r\nX-API-Key: " + k.read + "\r\n", "", false},
		{"Host, IPv6", "Host: [::1]:8080\r\nX-API-Key: " + k.read + "\r\n", "", false},
		{"Host with an underscore and a final dot", "Host: api_gw.example.\r\nX-API-Key: " + k.read + "\r\n", "", false},
		{"Host, IDN as sent (punycode)", "Host: xn--gteway-gua.example\r\nX-API-Key: " + k.read + "\r\n", "", false},
		{"Host, IPv6 with a zone", "Host: [fe80::1%25eth0]:8080\r\nX-API-Key: " + k.read + "\r\n", "", false},
		{"Host in upper case with an empty port", "Host: GATEWAY.EXAMPLE:\r\nX-API-Key: " + k.read + "\r\n", "", false},
		{"'>' in Host", "Host: gateway>\r\nX-API-Key: " + k.read + "\r\n", "Host", false},
		{"every token character in a name", "Host: gateway\r\nX-API-Key: " + k.read + "\r\nX!#$%&'*+-.^_`|~09aZ: v\r\n", "", false},
		{"spaces in values", "Host: gateway\r\nX-API-Key: " + k.read + "\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\n", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := hits.Load()
			br, resp, body := sendRaw(t, gw.URL, "GET /v1/export/items/coin-1 HTTP/1.1\r\n"+tt.head+"\r\n"+next)
			if tt.message == "" {
				if resp.StatusCode != 200 || hits.Load() != before+1 {
					t.Errorf("answer = %d %s (relayed %d), want 200 relayed once", resp.StatusCode, body, hits.Load()-before)
				}
				return
			}
			var env struct {
				Error struct{ Code, Message string } `json:"error"`
				Meta  struct {
					RequestID string `json:"request_id"`
				} `json:"meta"`
			}
			if resp.StatusCode != 400 || json.Unmarshal(body, &env) != nil || env.Error.Code != "bad_request" ||
				!strings.Contains(env.Error.Message, tt.message) || resp.Close != tt.close ||
				env.Meta.RequestID == "" || resp.Header.Get("X-Request-Id") != env.Meta.RequestID {
				t.Errorf("answer = %d (close %v) %s, want 400 bad_request naming %q, close %v", resp.StatusCode, resp.Close, body,
					tt.message, tt.close)
			}
			if hits.Load() != before {
				t.Errorf("the request was relayed to the reader")
			}
			next, err := http.ReadResponse(br, nil)
			switch {
			case tt.close && err == nil:
				t.Errorf("after the refusal the connection carried an answer (%d), want it closed", next.StatusCode)
			case !tt.close && (err != nil || next.StatusCode != 200):
				t.Errorf("the next request on the connection was not answered 200: %v", err)
			}
		})
	}
}

// A request with more than one Content-Type line is refused, 400
// bad_request, and not relayed: fasthttp keeps the last line alone, so the
// writer, which refuses "text/plain, application/json" in one line, was
// sent application/json and sold, while anything in front that reads the
// first line (a WAF allowing JSON only) saw text/plain. The framing is
// clear, so the connection stays open for the next request.
func TestSeveralContentTypeLinesAreRefused(t *testing.T) {
	dsn, _, k := seed(t)
	var hits atomic.Int64
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"SALES_WRITER_URLS": echoUpstream(t, "writer", &hits).URL})
	body := `{"external_order_id":"o-1"}`
	for _, types := range [][]string{
		{"text/plain", "application/json"},
		{"application/json", "text/plain"},
		{"application/json", "application/json"},
	} {
		conn := dial(t, gw.URL)
		fmt.Fprintf(conn, "POST /v1/export/items/coin-1/sales/confirm HTTP/1.1\r\nHost: gateway\r\nX-API-Key: %s\r\n"+
			"Idempotency-Key: k-1\r\nContent-Type: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"+
			"GET /v1/health HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n",
			k.write, types[0], types[1], len(body), body)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var env struct {
			Error struct{ Code, Message string } `json:"error"`
			Meta  struct {
				RequestID string `json:"request_id"`
			} `json:"meta"`
		}
		if resp.StatusCode != 400 || json.Unmarshal(b, &env) != nil || env.Error.Code != "bad_request" ||
			!strings.Contains(env.Error.Message, "one Content-Type") ||
			env.Meta.RequestID == "" || resp.Header.Get("X-Request-Id") != env.Meta.RequestID {
			t.Errorf("Content-Type %q: %d %s, want a 400 bad_request envelope asking for one Content-Type", types, resp.StatusCode, b)
		}
		if next, err := http.ReadResponse(br, nil); err != nil || next.StatusCode != 200 {
			t.Errorf("Content-Type %q: the next request on the connection was not answered 200: %v", types, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the writer was sent %d of the refused sales, want none", n)
	}
	r := do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
		"Idempotency-Key": "k-1", "Content-Type": "application/json"}, strings.NewReader(body))
	if r.Status != 200 || hits.Load() != 1 {
		t.Errorf("one Content-Type: %d %s (writer hits %d), want the sale relayed", r.Status, r.Body, hits.Load())
	}
}

// A request line of another HTTP major version is answered by the gateway,
// 400 with its own request id in the envelope and X-Request-Id alike, and
// never relayed: the service's net/http would refuse it 505 under another
// request id. HTTP/1.0 and HTTP/1.2 (read as 1.1) are served.
func TestOtherHTTPVersionsAreRefusedAtTheGateway(t *testing.T) {
	dsn, _, k := seed(t)
	var hits atomic.Int64
	reader := echoUpstream(t, "reader", &hits)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	tests := []struct {
		proto, target string
		refused       bool
	}{
		{"HTTP/2.0", "/v1/export/items?limit=1", true},
		{"HTTP/0.9", "/v1/export/items?limit=1", true},
		{"HTTP/5.1", "/v1/export/items?limit=1", true},
		{"HTTP/2.0", "/v1/health", true},
		{"HTTP/1.0", "/v1/export/items?limit=1", false},
		{"HTTP/1.2", "/v1/export/items?limit=1", false},
	}
	for _, tt := range tests {
		t.Run(tt.proto+" "+tt.target, func(t *testing.T) {
			conn := dial(t, gw.URL)
			before := hits.Load()
			req := "GET " + tt.target + " " + tt.proto + "\r\nHost: gateway\r\nX-API-Key: " + k.read + "\r\n\r\n"
			if _, err := conn.Write([]byte(req)); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !tt.refused {
				if resp.StatusCode != 200 || hits.Load() != before+1 {
					t.Errorf("answer = %d %s (relayed %d), want 200 relayed once", resp.StatusCode, body, hits.Load()-before)
				}
				return
			}
			var env struct {
				Error struct{ Code string } `json:"error"`
				Meta  struct {
					RequestID string `json:"request_id"`
				} `json:"meta"`
			}
			if resp.StatusCode != 400 || json.Unmarshal(body, &env) != nil || env.Error.Code != "http_version_not_supported" || !resp.Close {
				t.Errorf("answer = %d (close %v) %s, want 400 http_version_not_supported and the connection closed", resp.StatusCode, resp.Close, body)
			}
			if id := resp.Header.Get("X-Request-Id"); id == "" || id != env.Meta.RequestID {
				t.Errorf("X-Request-Id %q, meta.request_id %q: want one id in both", id, env.Meta.RequestID)
			}
			if hits.Load() != before {
				t.Errorf("the request was relayed to the reader")
			}
		})
	}
}

// A request with more than 100 header fields (Apache's LimitRequestFields)
// is refused 431 headers_too_large before its key is looked at, and not
// relayed: the gateway deletes each field a service is not sent by name,
// which walks every field left, so a key holder's 880 one-letter fields
// within GATEWAY_MAX_HEADER_BYTES cost 1.7 ms of CPU a request, eight
// times the same bytes in one field. 100 fields are served.
func TestManyHeaderFieldsAreRefused(t *testing.T) {
	dsn, _, k := seed(t)
	var hits atomic.Int64
	reader := echoUpstream(t, "reader", &hits)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	for _, fields := range []int{100, 101, 880} {
		head := "GET /v1/export/items/coin-1 HTTP/1.1\r\nHost: gw\r\nX-API-Key: " + k.read + "\r\n"
		for i := 2; i < fields; i++ {
			head += "h" + strconv.Itoa(i) + ": b\r\n"
		}
		before := hits.Load()
		conn := dial(t, gw.URL)
		if _, err := io.WriteString(conn, head+"\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%d fields: %v", fields, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if fields <= 100 {
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%d fields: answer %d %s, want 200", fields, resp.StatusCode, body)
			}
			continue
		}
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || resp.Header.Get("X-Error-Code") != "headers_too_large" || !resp.Close {
			t.Errorf("%d fields: answer %d (close %v) %s, want 431 headers_too_large and the connection closed",
				fields, resp.StatusCode, resp.Close, body)
		}
		if hits.Load() != before {
			t.Errorf("%d fields: relayed to the reader", fields)
		}
	}
	if hits.Load() != 1 {
		t.Errorf("the reader got %d requests, want 1 (the 100 fields')", hits.Load())
	}
}
