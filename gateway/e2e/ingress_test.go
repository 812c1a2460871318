package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/testenv"
)

// The README's ingress set-ups ("Behind an ingress"), read from the README
// itself and run with Debian's nginx and HAProxy in front of two gateways
// of a stack, hold what the section says of them: the client's own
// address is the one limited and logged, the proxy's own errors are the
// envelope with its request id (which leads to the gateway's line), the
// gateway's headers, gzipped pages and the shop schema's lengthed answer
// pass through (to HTTP/1.0 clients too), an X-Real-IP it does not write
// is the client's own, its connections to the gateways are kept, a slow sale is not cut by it
// first, and a gateway stopped with GATEWAY_SHUTDOWN_DELAY costs no
// client an answer. Without nginx or haproxy the test is skipped, or
// fails under REQUIRE_INGRESS=1 (.ci/run).
func TestTheREADMEsIngressSetUps(t *testing.T) {
	testenv.NeedIngress(t)
	snippets := map[string]string{"nginx": readmeIngressSnippet(t, "nginx"), "haproxy": readmeIngressSnippet(t, "haproxy")}
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	importItems(t, pool, fx.owner, []string{"ingress-nginx", "ingress-haproxy", "cut-nginx", "cut-haproxy", "stop-nginx", "stop-haproxy", "reset-nginx-0", "reset-nginx-1", "reset-haproxy-0", "reset-haproxy-1"})
	behindProxy := []string{
		"GATEWAY_PROXY_HEADER=X-Forwarded-For", "GATEWAY_TRUSTED_PROXIES=127.0.0.1",
		"RATE_LIMIT_ANONYMOUS=5-M",                      // a client's budget, spent in a few calls
		"RATE_LIMIT_KEY_PREFIX=" + testenv.KeyPrefix(t), // one budget in Redis for both gateways, as in production
	}
	shop := startSchemaShop(t)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t), slices.Concat(behindProxy, []string{"SHOP_SCHEMA_ALLOW_HOSTS=127.0.0.1", "SHOP_SCHEMA_CA_FILE=" + shop.caFile})...)
	behindProxy = append(behindProxy, s.upstreams...)
	g2, _ := startGateway(t, s, behindProxy...)
	// A gateway reading the client from X-Real-IP, which neither snippet writes.
	realIP, _ := startGateway(t, s, slices.Concat(behindProxy, []string{"GATEWAY_PROXY_HEADER=X-Real-IP"})...)
	gateways := []*stack{s, g2}
	// A gateway whose sales-writer refuses connections: its own 503.
	g3, _ := startGateway(t, s, slices.Concat(behindProxy, []string{"SALES_WRITER_URLS=http://" + testenv.RefusingAddr(t)})...)
	ing := ingresses{snippets: snippets}
	t.Cleanup(func() {
		if t.Failed() {
			for name, l := range s.logs {
				t.Logf("%s:\n%s", name, lastLines(l.String(), 30))
			}
			t.Logf("g2:\n%s", lastLines(g2.logs["gateway"].String(), 30))
		}
	})

	t.Run("timeouts outlast a sale's attempt and its repeat", func(t *testing.T) {
		checkIngressTimeouts(t, snippets, s.common)
	})
	for i, proxy := range []string{"nginx", "haproxy"} {
		t.Run(proxy, func(t *testing.T) {
			before := proxyHealthCalls(gateways)
			front := ing.start(t, proxy, hostOf(s), hostOf(g2))
			t.Run("the client's own address", func(t *testing.T) {
				// Two clients behind the proxy (two loopback addresses of
				// their own, apart from the other proxy's), one of them
				// writing an address of its own into the header.
				a, b := clientFrom(fmt.Sprintf("127.0.0.%d", 2+2*i)), clientFrom(fmt.Sprintf("127.0.0.%d", 3+2*i))
				checkClientAddresses(t, front, gateways, a, b)
			})
			t.Run("its own errors are the envelope", func(t *testing.T) {
				checkIngressErrors(t, ing, proxy, pool, fx, gateways, g3)
			})
			t.Run("what passes through", func(t *testing.T) {
				checkPassingThrough(t, front, s, fx, shop, clientFrom(fmt.Sprintf("127.0.0.%d", 10+i)))
			})
			t.Run("a one-address header it does not write is the client's", func(t *testing.T) {
				checkOneAddressHeaderBelieved(t, ing.start(t, proxy, hostOf(realIP), hostOf(realIP)), realIP, clientFrom(fmt.Sprintf("127.0.0.%d", 12+i)))
			})
			t.Run("a one-address header it writes is the client's address", func(t *testing.T) {
				front := ing.start(t, proxy, hostOf(realIP), hostOf(realIP), settingRealIP(t, proxy)...)
				checkOneAddressHeaderSet(t, front, realIP, clientFrom(fmt.Sprintf("127.0.0.%d", 14+i)))
			})
			t.Run("connections to the gateways are kept", func(t *testing.T) {
				checkKeptConnections(t, ing, proxy, gateways, fx)
			})
			t.Run("a slow sale is the gateway's answer", func(t *testing.T) {
				tx := testenv.InTransaction(t, pool, "SELECT 1 FROM export_items WHERE owner_id = $1 AND id = $2 FOR UPDATE", fx.owner, "ingress-"+proxy)
				// The timer's rollback is waited for: the test's cleanup
				// rolls tx back too, and a pgx Tx is not for two goroutines
				// (-race saw them meet: nothing orders the timer's before it).
				rolledBack := make(chan struct{})
				time.AfterFunc(2*time.Second, func() { _ = tx.Rollback(context.Background()); close(rolledBack) })
				resp := send(t, http.DefaultClient, "POST", front+"/v1/export/items/ingress-"+proxy+"/sales/confirm", saleHeaders(fx, "slow-"+proxy), order("slow-"+proxy))
				<-rolledBack
				if resp.status != 200 {
					t.Errorf("a confirm held 2 s on its row through %s = %d %s, want 200", proxy, resp.status, resp.body)
				}
			})
			t.Run("a gateway stopped costs no answer", func(t *testing.T) {
				stopping, _ := startGateway(t, s, slices.Concat(behindProxy, []string{"GATEWAY_SHUTDOWN_DELAY=5s"})...)
				fx := fx
				fx.writeKey = addKey(t, pool, fx.owner, ptr("e2e-market"), "sales:write") // its sales spend a budget of their own
				checkStopCostsNothing(t, ing.start(t, proxy, hostOf(s), hostOf(stopping)), stopping, fx, "stop-"+proxy)
			})
			t.Run("a sale reset after it was sent is the other gateway's", func(t *testing.T) {
				checkResetSaleTriedElsewhere(t, ing, proxy, s, fx)
			})
			if proxy == "haproxy" {
				t.Run("its health checks spend no budget", func(t *testing.T) {
					checkProxysChecksUnlimited(t, gateways, before)
				})
			}
		})
	}
}

// readmeIngressSnippet is the README's fenced block of lang (nginx,
// haproxy) in its "Behind an ingress" section: the one the test runs.
func readmeIngressSnippet(t *testing.T, lang string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "### Behind an ingress")
	if start < 0 {
		t.Fatal(`README.md has no "### Behind an ingress" section: this test runs its snippets`)
	}
	section := text[start:]
	if end := strings.Index(section[1:], "\n### "); end >= 0 {
		section = section[:end+1]
	}
	blocks := regexp.MustCompile("(?s)\n```"+lang+"\n(.*?)\n```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 1 {
		t.Fatalf("README.md's \"Behind an ingress\" has %d ```%s blocks, want the one this test runs", len(blocks), lang)
	}
	return blocks[0][1]
}

// ingresses starts the README's proxies, filled in.
type ingresses struct {
	snippets map[string]string
}

// start runs proxy's snippet in front of the gateways at g1 and g2
// (host:port), with each of changes (the README's text, then what the
// test puts in its place) made, and returns its base URL.
// The proxy stops when t ends.
func (ing ingresses) start(t *testing.T, proxy, g1, g2 string, changes ...string) string {
	t.Helper()
	listen := testenv.FreeAddr(t)
	fills := []string{"10.0.1.11:8080", g1, "10.0.1.12:8080", g2}
	switch proxy {
	case "nginx":
		fills = append(fills, "server {\n", "server {\n    listen "+listen+";\n")
	case "haproxy":
		fills = append(fills, "bind :8443", "bind "+listen)
	}
	conf := ing.snippets[proxy]
	for _, pairs := range [][]string{fills, changes} {
		for i := 0; i < len(pairs); i += 2 {
			if n := strings.Count(conf, pairs[i]); n != 1 {
				t.Fatalf("README.md's %s snippet has %q %d times, want once: the test fills it in", proxy, pairs[i], n)
			}
			conf = strings.Replace(conf, pairs[i], pairs[i+1], 1)
		}
	}
	if proxy == "nginx" {
		testenv.Nginx(t, listen, conf)
	} else {
		testenv.HAProxy(t, listen, conf)
	}
	return "http://" + listen
}

// hostOf is a stack's gateway's host:port.
func hostOf(s *stack) string {
	return strings.TrimSuffix(strings.TrimPrefix(s.baseURL, "http://"), "/v1")
}

// client is a client of the proxy whose connections come from ip, a
// loopback address of its own.
type client struct {
	*http.Client
	ip string
}

func clientFrom(ip string) client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return client{&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext}}, ip}
}

// reply is what a client got through a proxy.
type reply struct {
	status int
	header http.Header
	body   []byte
	env    envelope.Parsed
}

// send sends one request; a transport error fails the test.
func send(t *testing.T, c *http.Client, method, url string, header map[string]string, body string) reply {
	t.Helper()
	r, err := trySend(c, method, url, header, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func trySend(c *http.Client, method, url string, header map[string]string, body string) (reply, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: raw}
	_ = json.Unmarshal(raw, &r.env)
	return r, err
}

func saleHeaders(fx fixture, idempotencyKey string) map[string]string {
	return map[string]string{"X-API-Key": fx.writeKey, "Idempotency-Key": idempotencyKey, "Content-Type": "application/json"}
}

// checkClientAddresses: a spends its RATE_LIMIT_ANONYMOUS (5) on
// /v1/health through the proxy, and b, behind the same proxy, still has
// its own; the gateways log each under its own address, never the one a
// writes into X-Forwarded-For or X-Real-IP, nor the proxy's, with the
// proxy's request id as client_request_id.
func checkClientAddresses(t *testing.T, front string, gateways []*stack, a, b client) {
	forged := map[string]string{"X-Forwarded-For": "1.2.3.4", "X-Real-IP": "9.9.9.9"}
	var statuses []int
	var replies []reply
	for range 6 {
		got := send(t, a.Client, "GET", front+"/v1/health", forged, "")
		statuses = append(statuses, got.status)
		replies = append(replies, got)
		if got.status == 200 {
			wantLoggedAs(t, gateways, got, a.ip)
		}
	}
	checkPassedHeaders(t, replies)
	if want := []int{200, 200, 200, 200, 200, 429}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Errorf("a client's 6 health calls through the proxy = %v, want %v (its budget of 5)", statuses, want)
	}
	other := send(t, b.Client, "GET", front+"/v1/health", nil, "")
	if other.status != 200 {
		t.Errorf("another client's health call after the first spent its budget = %d %s, want 200: one budget for both", other.status, other.body)
	}
	wantLoggedAs(t, gateways, other, b.ip)
}

// wantLoggedAs checks the gateway's line of got: client_ip is ip, and
// client_request_id the proxy's own id.
func wantLoggedAs(t *testing.T, gateways []*stack, got reply, ip string) {
	t.Helper()
	line := waitForLine(t, gateways, "request_id", got.env.Meta.RequestID)
	if line["client_ip"] != ip {
		t.Errorf("a call of %s through the proxy was logged with client_ip %v: %v", ip, line["client_ip"], line)
	}
	if id, _ := line["client_request_id"].(string); !requestID.MatchString(id) {
		t.Errorf("a call through the proxy was logged with client_request_id %q, want the proxy's id (32 hex digits): %v", id, line)
	}
}

// requestID is an id as the gateway's and the README's proxies' are.
var requestID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// waitForLine is the access line of one of gateways whose field is value,
// waited for up to 10 s (the line is written as the answer is).
func waitForLine(t *testing.T, gateways []*stack, field, value string) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, g := range gateways {
			if line := lineWith(g.logs["gateway"].String(), field, value); line != nil {
				return line
			}
		}
	}
	t.Fatalf("no gateway logged an access line with %s %q", field, value)
	return nil
}

func lineWith(logs, field, value string) map[string]any {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line[field] == value && line["client_ip"] != nil {
			return line
		}
	}
	return nil
}

// checkIngressTimeouts: each snippet waits for the gateways longer than a
// sale's attempt and its repeat may take, 2 × (UPSTREAM_READ_TIMEOUT +
// UPSTREAM_CONNECT_TIMEOUT) at the gateway's defaults, and says that
// figure; nginx closes its kept connections before GATEWAY_IDLE_TIMEOUT
// does, so that it never sends on one the gateway is closing.
func checkIngressTimeouts(t *testing.T, snippets map[string]string, common []string) {
	env := map[string]string{}
	for _, kv := range common {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cfg, err := edge.LoadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	sale := 2 * (cfg.UpstreamReadTimeout + cfg.UpstreamConnectTimeout)
	for proxy, settings := range map[string][]string{
		"nginx":   {"proxy_read_timeout", "proxy_send_timeout"},
		"haproxy": {"timeout server", "timeout client"},
	} {
		for _, name := range settings {
			if d := seconds(t, snippets[proxy], name); d <= sale {
				t.Errorf("%s's %s = %v, want more than a sale's attempt and its repeat, %v", proxy, name, d, sale)
			}
		}
		if said := fmt.Sprintf("(%d s)", int(sale.Seconds())); !strings.Contains(snippets[proxy], said) {
			t.Errorf("%s's snippet does not say a sale's attempt and its repeat take %s", proxy, said)
		}
	}
	if d := seconds(t, snippets["nginx"], "keepalive_timeout"); d >= cfg.IdleTimeout {
		t.Errorf("nginx's keepalive_timeout = %v, want less than GATEWAY_IDLE_TIMEOUT, %v", d, cfg.IdleTimeout)
	}
}

// seconds is the duration setting name is given in conf, in seconds ("75s").
func seconds(t *testing.T, conf, name string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(name) + `\s+(\d+)s\b`).FindStringSubmatch(conf)
	if m == nil {
		t.Fatalf("the snippet sets no %s in seconds", name)
	}
	n, _ := strconv.Atoi(m[1])
	return time.Duration(n) * time.Second
}

// wantEnvelope checks that got is the proxy's own error as the README's
// snippet writes it: the envelope with code and a message, its request id
// in meta.request_id and X-Request-Id, X-Error-Code, and Retry-After: 1
// where retry says so.
func wantEnvelope(t *testing.T, what string, got reply, status int, code string, retry bool) {
	t.Helper()
	problems := []string{}
	if got.status != status || got.env.Error == nil || got.env.Error.Code != code || got.env.Error.Message == "" {
		problems = append(problems, fmt.Sprintf("want %d with the envelope of %s", status, code))
	}
	if ct := got.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		problems = append(problems, "Content-Type "+ct)
	}
	if id := got.env.Meta.RequestID; !requestID.MatchString(id) || got.header.Get("X-Request-Id") != id {
		problems = append(problems, fmt.Sprintf("request id %q, X-Request-Id %q: want the same 32 hex digits", id, got.header.Get("X-Request-Id")))
	}
	if got.header.Get("X-Error-Code") != code {
		problems = append(problems, "X-Error-Code "+got.header.Get("X-Error-Code"))
	}
	if retry && got.header.Get("Retry-After") != "1" {
		problems = append(problems, "Retry-After "+got.header.Get("Retry-After"))
	}
	if len(problems) > 0 {
		t.Errorf("%s = %d %s: %s", what, got.status, got.body, strings.Join(problems, "; "))
	}
}

// checkIngressErrors: what the proxy answers itself is the envelope; its
// timeout's request id leads to the gateway's line of the call it cut; a
// gateway's own error passes as the gateway wrote it.
func checkIngressErrors(t *testing.T, ing ingresses, proxy string, pool *pgxpool.Pool, fx fixture, gateways []*stack, g3 *stack) {
	t.Run("no gateway", func(t *testing.T) {
		front := ing.start(t, proxy, testenv.RefusingAddr(t), testenv.RefusingAddr(t))
		got := send(t, http.DefaultClient, "POST", front+"/v1/export/items/cut-"+proxy+"/sales/confirm", saleHeaders(fx, "down-"+proxy), order("down"))
		if proxy == "nginx" {
			wantEnvelope(t, "a sale with both gateways down", got, 502, "bad_gateway", true)
		} else {
			wantEnvelope(t, "a sale with both gateways down", got, 503, "upstream_unavailable", true)
		}
	})
	t.Run("its timeout", func(t *testing.T) {
		shorter := map[string][]string{
			"nginx":   {"proxy_read_timeout 75s", "proxy_read_timeout 1s"},
			"haproxy": {"timeout server 75s", "timeout server 1s"},
		}[proxy]
		front := ing.start(t, proxy, hostOf(gateways[0]), hostOf(gateways[1]), shorter...)
		tx := testenv.InTransaction(t, pool, "SELECT 1 FROM export_items WHERE owner_id = $1 AND id = $2 FOR UPDATE", fx.owner, "cut-"+proxy)
		got := send(t, http.DefaultClient, "POST", front+"/v1/export/items/cut-"+proxy+"/sales/confirm", saleHeaders(fx, "cut-"+proxy), order("cut"))
		_ = tx.Rollback(context.Background())
		wantEnvelope(t, "a confirm held on its row past the proxy's timeout", got, 504, "upstream_timeout", false)
		// The README's trace: the proxy's id is the gateway's
		// client_request_id, on the line of the call, which went on.
		line := waitForLine(t, gateways, "client_request_id", got.env.Meta.RequestID)
		if line["status"] != 200.0 || line["route"] == nil {
			t.Errorf("the gateway's line of the call the proxy cut = %v, want its 200", line)
		}
	})
	t.Run("a gateway's own error passes", func(t *testing.T) {
		front := ing.start(t, proxy, hostOf(g3), hostOf(g3))
		got := send(t, http.DefaultClient, "POST", front+"/v1/export/items/cut-"+proxy+"/sales/confirm", saleHeaders(fx, "own-"+proxy), order("own"))
		direct := send(t, http.DefaultClient, "POST", g3.baseURL+"/export/items/cut-"+proxy+"/sales/confirm", saleHeaders(fx, "own-direct-"+proxy), order("own"))
		if got.status != 503 || got.env.Error == nil || direct.env.Error == nil || got.env.Error.Message != direct.env.Error.Message {
			t.Fatalf("the gateway's 503 through the proxy = %d %s, want as it is sent: %s", got.status, got.body, direct.body)
		}
		waitForLine(t, []*stack{g3}, "request_id", got.env.Meta.RequestID) // the gateway's id, not the proxy's
	})
	if proxy == "nginx" {
		t.Run("what nginx refuses before reading", func(t *testing.T) {
			checkNginxRefusals(t, ing, gateways, fx)
		})
	} else {
		t.Run("what HAProxy refuses before reading", func(t *testing.T) {
			front := ing.start(t, proxy, hostOf(gateways[0]), hostOf(gateways[1]))
			got := send(t, http.DefaultClient, "GET", front+"/v1/health", map[string]string{"X-Big": strings.Repeat("a", 10<<10)}, "")
			if got.status != 431 || got.env.Error == nil || got.env.Error.Code != "headers_too_large" {
				t.Errorf("a 10 KiB head through HAProxy = %d %s, want the gateway's 431", got.status, got.body)
			}
			got, err := sendHead(front, "/v1/health", map[string]string{"X-Big": strings.Repeat("a", 17<<10)})
			if err != nil {
				t.Fatal(err)
			}
			if got.status != 400 || got.env.Error != nil {
				t.Errorf("a 17 KiB head through HAProxy = %d %s, want its own 400, not an envelope, as the README says", got.status, got.body)
			}
		})
	}
}

// checkNginxRefusals: nginx's 413 past client_max_body_size and its 494
// for a head over large_client_header_buffers are the envelope, with the
// gateway's words for the same refusals.
func checkNginxRefusals(t *testing.T, ing ingresses, gateways []*stack, fx fixture) {
	front := ing.start(t, "nginx", hostOf(gateways[0]), hostOf(gateways[1]))
	sale := "/export/items/cut-nginx/sales/confirm"
	big := strings.Repeat("x", 2<<20)
	got := send(t, http.DefaultClient, "POST", front+"/v1"+sale, saleHeaders(fx, "big"), big)
	wantEnvelope(t, "a 2 MiB body through nginx", got, 413, "payload_too_large", false)
	own := send(t, http.DefaultClient, "POST", gateways[0].baseURL+sale, saleHeaders(fx, "big"), big[:100<<10])
	if got.env.Error != nil && own.env.Error != nil && got.env.Error.Message != own.env.Error.Message {
		t.Errorf("nginx's 413 says %q, the gateway's %q", got.env.Error.Message, own.env.Error.Message)
	}
	through := send(t, http.DefaultClient, "POST", front+"/v1"+sale, saleHeaders(fx, "big"), big[:100<<10])
	if through.status != 413 || through.env.Error == nil || through.env.Error.Message != own.env.Error.Message {
		t.Errorf("a 100 KiB body through nginx = %d %s, want the gateway's 413", through.status, through.body)
	}
	head := map[string]string{"X-Big": strings.Repeat("a", 9<<10)}
	got = send(t, http.DefaultClient, "GET", front+"/v1/health", head, "")
	wantEnvelope(t, "a 9 KiB header line through nginx", got, 431, "headers_too_large", false)
	own = send(t, http.DefaultClient, "GET", gateways[0].baseURL+"/health", head, "")
	if got.env.Error != nil && own.env.Error != nil && got.env.Error.Message != own.env.Error.Message {
		t.Errorf("nginx's 431 says %q, the gateway's %q", got.env.Error.Message, own.env.Error.Message)
	}
	long := "/v1/health?x=" + strings.Repeat("a", 9<<10)
	got = send(t, http.DefaultClient, "GET", front+long, nil, "")
	wantEnvelope(t, "a 9 KiB request line through nginx", got, 431, "headers_too_large", false)
	// nginx's own 400s and its 505, each as the gateway answers the same.
	front = strings.TrimPrefix(front, "http://")
	for _, c := range []struct{ what, head, code string }{
		{"a header line without a colon", "GET /v1/health HTTP/1.1\r\nHost: a\r\nBad header\r\n\r\n", "bad_request"},
		{"a request line nginx cannot read", "GET /v1/he alth HTTP/1.1\r\nHost: a\r\n\r\n", "bad_request"},
		{"HTTP/2.0 in the request line", "GET /v1/health HTTP/2.0\r\nHost: a\r\n\r\n", "http_version_not_supported"},
	} {
		got, own := rawReply(t, front, c.head), rawReply(t, hostOf(gateways[0]), c.head)
		wantEnvelope(t, c.what+" through nginx", got, 400, c.code, false)
		if own.env.Error == nil || got.env.Error == nil || own.env.Error.Message != got.env.Error.Message {
			t.Errorf("%s: nginx answers %s, the gateway %s", c.what, got.body, own.body)
		}
	}
	// A path outside /v1/ is the gateway's 404, not nginx's page.
	got = send(t, http.DefaultClient, "GET", "http://"+front+"/", nil, "")
	if got.status != 404 || got.env.Error == nil || got.env.Error.Code != "not_found" {
		t.Errorf("GET / through nginx = %d %.200s, want the gateway's 404", got.status, got.body)
	}
}

// rawReply writes head to addr on a connection of its own and reads the
// answer.
func rawReply(t *testing.T, addr, head string) reply {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q to %s: %v", head, addr, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: raw}
	_ = json.Unmarshal(raw, &r.env)
	return r
}

// checkKeptConnections: 200 calls on one client connection reach the
// gateways on at most one connection each; nginx, without the snippet's
// proxy_http_version, opens one per call (what the line is for).
func checkKeptConnections(t *testing.T, ing ingresses, proxy string, gateways []*stack, fx fixture) {
	count := func(changes ...string) int64 {
		a1, n1 := countingRelay(t, hostOf(gateways[0]))
		a2, n2 := countingRelay(t, hostOf(gateways[1]))
		front := ing.start(t, proxy, a1, a2, changes...)
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1}}
		defer c.CloseIdleConnections()
		for i := range 200 {
			got := send(t, c, "GET", front+"/v1/export/items/ingress-"+proxy, map[string]string{"X-API-Key": fx.readKey}, "")
			if got.status != 200 {
				t.Fatalf("call %d = %d %s, want 200", i, got.status, got.body)
			}
		}
		return n1.Load() + n2.Load()
	}
	if n := count(); n > 2 {
		t.Errorf("200 calls on one connection through %s opened %d connections to the two gateways, want at most one each", proxy, n)
	}
	if proxy == "nginx" {
		if n := count("proxy_http_version 1.1;", ""); n != 200 {
			t.Errorf("without proxy_http_version 1.1, 200 calls opened %d connections, want 200: the line keeps them", n)
		}
	}
}

// countingRelay relays connections to upstream, counting those whose
// first request carries X-Forwarded-For: the calls a proxy passes on, not
// HAProxy's health checks, which carry none.
func countingRelay(t *testing.T, upstream string) (addr string, count *atomic.Int64) {
	t.Helper()
	ln := loopbackListener(t)
	count = &atomic.Int64{}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				conn.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, conn, up)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				relay(conn, up, count)
			}()
		}
	}()
	return ln.Addr().String(), count
}

// relay passes conn's bytes to up and back, counting conn if its first
// head carries X-Forwarded-For.
func relay(conn, up net.Conn, count *atomic.Int64) {
	defer conn.Close()
	defer up.Close()
	in := bufio.NewReader(conn)
	var head strings.Builder
	for !strings.HasSuffix(head.String(), "\r\n\r\n") {
		line, err := in.ReadString('\n')
		head.WriteString(line)
		if err != nil {
			return
		}
	}
	if strings.Contains(strings.ToLower(head.String()), "\nx-forwarded-for:") {
		count.Add(1)
	}
	if _, err := io.WriteString(up, head.String()); err != nil {
		return
	}
	done := make(chan struct{})
	go func() { _, _ = io.Copy(conn, up); conn.Close(); close(done) }()
	_, _ = io.Copy(up, in)
	up.Close()
	<-done
}

// checkStopCostsNothing: while clients read and sell through the proxy
// in front of the stack's gateway and stopping, stopping gets its stop
// signal; through its GATEWAY_SHUTDOWN_DELAY and its drain, every call is
// answered by a gateway (no 5xx, no connection lost), and stopping had
// some of them (else nothing was tried).
func checkStopCostsNothing(t *testing.T, front string, stopping *stack, fx fixture, item string) {
	var (
		mu       sync.Mutex
		failures []string
		answered int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
			defer c.CloseIdleConnections()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var got reply
				var err error
				if i%2 == 0 {
					got, err = trySend(c, "GET", front+"/v1/export/items/"+item, map[string]string{"X-API-Key": fx.readKey}, "")
				} else {
					got, err = trySend(c, "POST", front+"/v1/export/items/"+item+"/sales/confirm", saleHeaders(fx, fmt.Sprintf("%s-%d-%d", item, w, i)), order(item))
				}
				mu.Lock()
				answered++
				if err != nil || got.status >= 500 {
					failures = append(failures, fmt.Sprintf("%v %d %s", err, got.status, got.body))
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	stopping.sigterm()
	// Its 5 s delay, its drain, and a second after it.
	wantGone := time.Now().Add(8 * time.Second)
	for time.Now().Before(wantGone) {
		if c, err := net.Dial("tcp", hostOf(stopping)); err != nil {
			break
		} else {
			c.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	if n := strings.Count(stopping.logs["gateway"].String(), `"client_request_id"`); n == 0 {
		t.Errorf("the stopped gateway answered none of the %d calls: nothing was tried", answered)
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d calls failed while a gateway stopped: %q", len(failures), answered, failures[:min(len(failures), 5)])
	}
}

// checkResetSaleTriedElsewhere: a sale nginx sent on a connection the
// gateway reset before answering is sent on to the other gateway, and
// answered by it. A stopping gateway does that to every connection still
// waiting to be accepted when its drain closes the listener: the kernel
// resets them, after nginx has written its request on them (a POST nginx
// did not send again was its 502, 1 of 1,780 calls while a gateway stopped
// on a loaded machine). Here the first gateway is a listener that resets
// each connection once it has read a request on it, so that every run
// meets the reset the stop met now and then.
func checkResetSaleTriedElsewhere(t *testing.T, ing ingresses, proxy string, s *stack, fx fixture) {
	reset := resettingUpstream(t)
	front := ing.start(t, proxy, reset.addr, hostOf(s))
	// Round robin sends one of two requests to the first gateway; each
	// sells an item of its own.
	for i := 0; i < 2 && reset.requests.Load() == 0; i++ {
		item := fmt.Sprintf("reset-%s-%d", proxy, i)
		got := send(t, http.DefaultClient, "POST", front+"/v1/export/items/"+item+"/sales/confirm", saleHeaders(fx, item), order(item))
		if got.status != 200 {
			t.Errorf("a confirm through %s, whose first gateway reset its connection = %d %s, want the other gateway's 200", proxy, got.status, got.body)
		}
	}
	if reset.requests.Load() == 0 {
		t.Fatalf("%s sent no sale to the gateway that resets: nothing was tried", proxy)
	}
}

// resetting is a gateway's address that reads each POST sent to it and
// resets its connection instead of answering (requests counts them), and
// answers any other request 200, so that health checks keep it in.
type resetting struct {
	addr     string
	requests atomic.Int32
}

func resettingUpstream(t *testing.T) *resetting {
	ln, err := net.Listen("tcp", testenv.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r := &resetting{addr: ln.Addr().String()}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go r.readThenReset(conn.(*net.TCPConn))
		}
	}()
	return r
}

func (r *resetting) readThenReset(conn *net.TCPConn) {
	defer conn.Close()
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	if req.Method != http.MethodPost { // HAProxy's health checks: the gateway is up as far as it knows
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	r.requests.Add(1)
	_ = conn.SetLinger(0) // Close sends RST, as a listener closed with the connection in its queue does
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// checkProxysChecksUnlimited: HAProxy's health checks (every second, to
// each gateway, from 127.0.0.1, naming no client) have called /v1/health
// from that one address more often, since before (proxyHealthCalls when
// HAProxy started), than RATE_LIMIT_ANONYMOUS (5) allows a client, and
// none was refused: a trusted proxy's own calls spend no budget, so its
// checks never take a gateway out.
func checkProxysChecksUnlimited(t *testing.T, gateways []*stack, before map[float64]int) {
	after := proxyHealthCalls(gateways)
	if after[200]-before[200] <= 5 || after[429] > 0 {
		t.Errorf("the proxy's own health calls by status: %v, %v before HAProxy, want more than 5 more answered 200, none 429", after, before)
	}
}

// proxyHealthCalls counts the gateways' lines of /v1/health from the
// proxies' address, 127.0.0.1, by status.
func proxyHealthCalls(gateways []*stack) map[float64]int {
	statuses := map[float64]int{}
	for _, g := range gateways {
		sc := bufio.NewScanner(strings.NewReader(g.logs["gateway"].String()))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["route"] == "GET /v1/health" && line["client_ip"] == "127.0.0.1" {
				status, _ := line["status"].(float64)
				statuses[status]++
			}
		}
	}
	return statuses
}

// sendHead sends a GET of path with header to base on a connection of
// its own and reads the answer even where the write failed: HAProxy
// answers a head larger than its buffer with its 400 and closes with the
// rest unread, and a client still writing it gets a broken pipe, which
// net/http's client returns in place of the answer before it ("a 17 KiB
// head": 37 of 300 sent with send beside a CPU hog; 0 of 900 with this,
// also written in 4 KiB pieces, whose writes then failed 9 times in 10).
func sendHead(base, path string, header map[string]string) (reply, error) {
	host := strings.TrimPrefix(base, "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		return reply{}, err
	}
	defer conn.Close()
	var head strings.Builder
	fmt.Fprintf(&head, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", path, host)
	for k, v := range header {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	head.WriteString("\r\n")
	_, writeErr := io.WriteString(conn, head.String())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return reply{}, fmt.Errorf("GET %s%s: no answer (%v) after its write (%v)", base, path, err, writeErr)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: raw}
	_ = json.Unmarshal(raw, &r.env)
	return r, err
}
