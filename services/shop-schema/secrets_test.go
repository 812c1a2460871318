package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
	"github.com/coinexport/export/services/shop-schema/internal/shopschema"
)

// spanText flattens everything a span exports: name, attributes, events,
// status and links, so a secret anywhere in it is found.
func spanText(s sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|", s.Name(), s.Status().Code, s.Status().Description)
	for _, a := range s.Attributes() {
		fmt.Fprintf(&b, "%s=%s|", a.Key, a.Value.String())
	}
	for _, e := range s.Events() {
		fmt.Fprintf(&b, "event %s|", e.Name)
		for _, a := range e.Attributes {
			fmt.Fprintf(&b, "%s=%s|", a.Key, a.Value.String())
		}
	}
	return b.String()
}

// TestKeyNeverLeaks runs schema calls that succeed and fail, with the
// server span and the outbound client spans recorded, and looks for the
// key (and its Basic encoding) in every log line and span, the answer and
// the metrics.
func TestKeyNeverLeaks(t *testing.T) {
	// The server span comes from the global provider (pkg/httpserver).
	server := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(server)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	wrongKey := "LEAKCANARY0123456789LEAKCANARY01"
	shortKey := "SHORTLEAKCANARY"
	tests := []struct {
		name, key string
		setup     func(*fakeshop.Shop)
		wantCode  string
	}{
		{"success", fakeshop.Key, nil, ""},
		{"wrong key", wrongKey, nil, "shop_401"},
		{"wrong shop", fakeshop.Key, func(s *fakeshop.Shop) { s.WrongShop = true }, "shop_403"},
		{"server error", fakeshop.Key, func(s *fakeshop.Shop) { s.ServerError = true }, "shop_unavailable"},
		{"no rewrite", fakeshop.Key, func(s *fakeshop.Shop) { s.NoRewrite = true }, ""},
		// A shop's redirect is the shop's to write: one that puts the key
		// into the Location must not have it copied into our error chain
		// (logged) or the next hop's url.full.
		{"redirect with the key in the query, followed", fakeshop.Key, func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string {
				if r.URL.Query().Has("ws_key") {
					return ""
				}
				return s.URL() + strings.TrimPrefix(r.URL.RequestURI(), s.Prefix) + "&ws_key=" + fakeshop.Key
			}
		}, ""},
		// 10.0.0.1 is refused before any connection (TestRedirectToLoopbackRefused
		// shows the check happens before the dial).
		{"redirect with the key in the query, refused", fakeshop.Key, func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return "https://10.0.0.1/api/categories?x=1&ws_key=" + fakeshop.Key }
		}, "base_url_not_allowed"},
		{"redirect with the key in the path, refused", fakeshop.Key, func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return "https://10.0.0.1/" + fakeshop.Key + "/api/categories" }
		}, "base_url_not_allowed"},
		// The same key %-encoded, or in lower case, is the key all the same
		// (127.0.0.2 is not allow-listed: refused before any connection).
		{"redirect with the key %-encoded in the path, refused", fakeshop.Key, func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string {
				return "https://127.0.0.2/" + percentEncoded(fakeshop.Key) + "/api?url=" + percentEncoded(fakeshop.Key)
			}
		}, "base_url_not_allowed"},
		{"redirect with the key in lower case in the host, refused", fakeshop.Key, func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return "https://" + strings.ToLower(fakeshop.Key) + ".localhost/api" }
		}, "base_url_not_allowed"},
		// A public name passes the redirect check and is looked up at the
		// dial (here, noDNS fails it): the hop's span is started first.
		{"redirect with the key in a public host name, followed", fakeshop.Key, func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return "https://" + fakeshop.Key + ".example.com/api/categories" }
		}, "shop_unreachable"},
		// net/http quotes a malformed status line in its error, which is
		// logged: a shop that writes the key back there.
		{"status line echoing the key", fakeshop.Key, func(s *fakeshop.Shop) {
			s.StatusLine = func(key string) string { return "HTTP/1.1 " + key }
		}, "shop_bad_response"},
		{"status line echoing the key %-encoded", fakeshop.Key, func(s *fakeshop.Shop) {
			s.StatusLine = func(key string) string { return "HTTP/1.1 " + percentEncoded(key) }
		}, "shop_bad_response"},
		// The decoder's error, which is logged, quotes a string where an
		// integer belongs: a shop that writes the key back there.
		{"body echoing the key as an id", fakeshop.Key, func(s *fakeshop.Shop) {
			s.StatusLine = func(key string) string {
				var lists []string
				for _, resource := range []string{"languages", "categories", "product_features", "product_feature_values"} {
					lists = append(lists, fmt.Sprintf(`%q:[{"id":%q}]`, resource, key))
				}
				return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{" + strings.Join(lists, ",") + "}"
			}
		}, "shop_bad_response"},
		// Go quotes what does not parse with strconv.Quote, which writes a
		// key's quotes, backslashes and characters that are not printable
		// escaped (\", \\, \u2028): a key holding one, written back in a
		// header line that does not parse or in a Location that does not,
		// reached the "shop call failed" line in that form, which no match
		// of the key as sent found. (A control character, which Go escapes
		// too, is refused with the body: TestSchemaInput.)
		{"header line echoing a key with a line separator", "LEAKCANARY0123\u2028456789LEAKCANARY", func(s *fakeshop.Shop) {
			s.StatusLine = func(key string) string { return "HTTP/1.1 500 Internal Server Error\r\nX-Echo: " + key + "\x01" }
		}, "shop_bad_response"},
		{"redirect echoing a key with a quote in a Location that does not parse", `LEAKCANARY0123"456789LEAKCANARY`, func(s *fakeshop.Shop) {
			s.StatusLine = func(key string) string {
				return "HTTP/1.1 302 Found\r\nContent-Length: 0\r\nLocation: https://shop example.com/api/?x=" + key
			}
		}, "shop_unreachable"},
		{"header line echoing a key with a quote", `LEAKCANARY0123"456789\LEAKCANARY`, func(s *fakeshop.Shop) {
			s.StatusLine = func(key string) string { return "HTTP/1.1 500 Internal Server Error\r\nX-Echo: " + key + "\x01" }
		}, "shop_bad_response"},
		// PSWS-Version is the shop's to write, and goes into the answer
		// and the "shop schema read" line: a shop that writes the key back
		// there. A PrestaShop key is 32 characters, which did not fit the
		// 31 a version was let be; a shorter one does, once a server other
		// than PrestaShop accepts it.
		{"version header echoing the key", shortKey, func(s *fakeshop.Shop) {
			s.StatusLine = func(key string) string {
				return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nPSWS-Version: 8." + strings.ToLower(key) +
					"\r\nConnection: close\r\n\r\n" + `{"languages":[],"categories":[],"product_features":[],"product_feature_values":[]}`
			}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shop := fakeshop.Sample("9", true)
			if tt.setup != nil {
				tt.setup(shop)
			}
			shop.Start(t.Cleanup)
			svc := startServiceWith(t, shop, nil, noDNS{})
			_, env := svc.post(t, body(shop.URL(), tt.key))
			if errCode(env) != tt.wantCode && !(tt.wantCode == "" && env.Error == nil) {
				t.Fatalf("POST schema = %s, want %q", errCode(env), tt.wantCode)
			}
			// A redirect away from the shop that fails (refused, or not
			// resolved) comes before the shop reads the key.
			redirectedAway := shop.Redirect != nil && tt.wantCode != ""
			if len(shop.Requests()) == 0 {
				t.Fatal("the shop received no request")
			}
			if got := shop.Keys(); len(got) == 0 && !redirectedAway || len(got) > 0 && got[0] != tt.key {
				t.Fatalf("shop received keys %q, want %q as Basic user", got, tt.key)
			}
			spans := svc.spans.Ended()
			if len(spans) == 0 {
				t.Fatal("no client span recorded")
			}
			var all strings.Builder
			all.WriteString(svc.logs.String())
			for _, s := range append(spans, server.Ended()...) {
				all.WriteString(spanText(s))
			}
			if env.Error != nil {
				all.WriteString(env.Error.Message)
			}
			all.Write(env.Data)
			all.WriteString(metricsText(t, svc.metrics)) // no metric label either (issue 6)
			basic := strings.TrimPrefix(basicHeader(tt.key), "Basic ")
			// The key as Go quotes it, and that as the JSON log line writes it.
			quoted := strconv.Quote(tt.key)
			quoted = quoted[1 : len(quoted)-1]
			inLog := strconv.Quote(quoted)
			for _, secret := range []string{tt.key, basic, strings.ToLower(tt.key), percentEncoded(tt.key), quoted, inLog[1 : len(inLog)-1]} {
				if strings.Contains(all.String(), secret) {
					t.Errorf("logs, spans, metrics or the answer contain the key (%q)", secret)
				}
			}
			if !strings.Contains(all.String(), "/api/categories") && !strings.Contains(all.String(), "dispatcher.php") {
				t.Errorf("client spans lack the shop URL; the test would not see a key put there:\n%s", all.String())
			}
		})
	}
}

// metricsText is what the service's /metrics serves from reg.
func metricsText(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "shop_schema_reads_total{") {
		t.Fatalf("no shop_schema_reads_total in the metrics; the test would not see a key in its labels:\n%s", rec.Body)
	}
	return rec.Body.String()
}

// noDNS finds no name: the shop is at an address, and a redirect to a
// name fails at the dial, without the network.
type noDNS struct{}

func (noDNS) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("no such host")
}

func basicHeader(key string) string {
	r, _ := http.NewRequest("GET", "https://x", nil)
	r.SetBasicAuth(key, "")
	return r.Header.Get("Authorization")
}

// rebindResolver answers a public address the first time a name is looked
// up (the validation check) and loopback afterwards (the dial): DNS
// rebinding.
type rebindResolver struct{ calls atomic.Int64 }

func (r *rebindResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host != "rebind.example.com." {
		return nil, errors.New("no such host")
	}
	if r.calls.Add(1) == 1 {
		return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
	}
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// TestDNSRebindingRefusedAtConnect: the name passes validation with a
// public address, then resolves to the loopback shop when dialed; the
// dialer's Control hook refuses it and the shop sees no connection.
func TestDNSRebindingRefusedAtConnect(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	_, port, _ := net.SplitHostPort(shop.Addr())
	vars := map[string]string{"IDENTITY_SECRET": testSecret, "SHOP_SCHEMA_PORTS": "443," + port}
	cfg, err := loadConfig(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Output{}
	resolver := &rebindResolver{}
	srv, err := newServer(cfg, logging.New(logs, "info", "shop-schema"), noop.NewTracerProvider(), resolver)
	if err != nil {
		t.Fatal(err)
	}
	svc := &service{url: startHandler(t, srv.Handler()), logs: logs}
	svc.signer, _ = identity.NewSigner(testSecret)
	status, env := svc.post(t, body("https://rebind.example.com:"+port, fakeshop.Key))
	if status != http.StatusBadRequest || errCode(env) != "base_url_not_allowed" {
		t.Errorf("POST schema with a rebinding name = %d %s, want 400 base_url_not_allowed", status, errCode(env))
	}
	if resolver.calls.Load() < 2 {
		t.Errorf("resolver called %d times, want the validation and the dial lookups", resolver.calls.Load())
	}
	if n := shop.Connections(); n != 0 {
		t.Errorf("shop accepted %d connections, want 0", n)
	}
}

// percentEncoded writes every byte of s as %XX.
func percentEncoded(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// dialCounter resolves every name to loopback and counts the lookups: for
// an allow-listed name the guard's dialer makes one per connection, and
// nothing else looks it up.
type dialCounter struct{ lookups atomic.Int64 }

func (d *dialCounter) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	d.lookups.Add(1)
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// Every connection to a shop is opened by the guard's dialer, over HTTP/2
// (negotiated by ALPN) and HTTP/1.1 (a shop that offers no h2) alike: the
// HTTP/2 client, golang.org/x/net's since 5029d21, takes the connections
// net/http dialled and opens none of its own, whose address no guard
// would check. The reads' spans say which protocol was spoken.
func TestEveryShopConnectionIsDialledByTheGuard(t *testing.T) {
	for _, http2 := range []bool{true, false} {
		shop := fakeshop.Sample("8", false)
		shop.HTTP2 = http2
		shop.Start(t.Cleanup)
		_, port, _ := net.SplitHostPort(shop.Addr())
		dials := &dialCounter{}
		// example.com: a name httptest's certificate holds.
		svc := startServiceWith(t, shop, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": "example.com"}, dials)
		for range 3 {
			if status, env := svc.post(t, body("https://example.com:"+port, fakeshop.Key)); status != http.StatusOK {
				t.Fatalf("POST schema (HTTP/2 %v) = %d %+v, want 200", http2, status, env.Error)
			}
		}
		if conns := shop.Connections(); conns == 0 || conns != dials.lookups.Load() {
			t.Errorf("HTTP/2 %v: the shop accepted %d connections, the guard's dialer opened %d; want every one by the guard",
				http2, conns, dials.lookups.Load())
		}
		want := map[bool]string{true: "2.0", false: "1.1"}[http2]
		spoken := map[string]int{}
		for _, span := range svc.spans.Ended() {
			for _, a := range span.Attributes() {
				if a.Key == "network.protocol.version" {
					spoken[a.Value.AsString()]++
				}
			}
		}
		if len(spoken) != 1 || spoken[want] == 0 {
			t.Errorf("HTTP/2 %v: the shop requests' spans say protocols %v, want %s alone", http2, spoken, want)
		}
	}
}

// TestKeyInBaseURLsHostIsNotLogged: a caller that writes its key into
// base_url's host (as a subdomain) has it sent to DNS, but not written to
// the log lines that name the shop's host (shop_host), which the client
// spans' server.address already withheld.
func TestKeyInBaseURLsHostIsNotLogged(t *testing.T) {
	for _, base := range []string{
		"https://" + fakeshop.Key + ".example.com",    // passes the guard; its lookup fails (shop_unreachable)
		"https://" + fakeshop.Key + ".example.com:22", // refused for its port before any lookup
	} {
		svc := startServiceWith(t, nil, nil, noDNS{})
		svc.post(t, body(base, fakeshop.Key))
		logs := svc.logs.String()
		if !strings.Contains(logs, `"shop_host"`) {
			t.Fatalf("no line names shop_host; the test would not see the key there:\n%s", logs)
		}
		if strings.Contains(strings.ToLower(logs), strings.ToLower(fakeshop.Key)) {
			t.Errorf("POST schema for %s: the logs hold the key:\n%s", base, logs)
		}
	}
}

// TestAPIKeyInBaseURLIsRefused: a caller that pastes one of this service's
// API keys into base_url (as a path segment, %-encoded or not, where a shop
// installed in a subfolder has its folder) is refused invalid_base_url
// before any call. Sent, the key would travel in a URL to the shop, and
// the URL of every shop request is in the client spans' url.full and, when
// the shop cannot be reached, in the WARN "shop call failed" (spec 5: keys
// never in URLs or logs).
func TestAPIKeyInBaseURLIsRefused(t *testing.T) {
	apiKey, _, err := apikey.Generate([]string{"export:read"})
	if err != nil {
		t.Fatal(err)
	}
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	closed := closedLoopbackPort(t)
	for _, base := range []string{
		shop.URL() + "/" + apiKey, // the shop answers 404 (shop_not_found)
		shop.URL() + "/shop/%" + fmt.Sprintf("%X", apiKey[0]) + apiKey[1:], // %-encoded
		"https://" + closed + "/shop/" + apiKey,                            // unreachable: the error quotes the URL
		// Its checksum cut off or mistyped, a key is no key, but its secret
		// is whole (apikey.ContainsKeySecret).
		shop.URL() + "/" + apiKey[:len(apiKey)-6],
		shop.URL() + "/shop/%" + fmt.Sprintf("%X", apiKey[0]) + apiKey[1:len(apiKey)-1] + "-",
	} {
		svc := startServiceWith(t, shop, nil, noDNS{})
		before := len(shop.Requests())
		status, env := svc.post(t, body(base, fakeshop.Key))
		if status != http.StatusBadRequest || errCode(env) != "invalid_base_url" {
			t.Errorf("POST schema with an API key in base_url = %d %s, want 400 invalid_base_url", status, errCode(env))
		}
		if n := len(shop.Requests()) - before; n > 0 {
			t.Errorf("the shop received %d requests, the key in their URL", n)
		}
		var all strings.Builder
		all.WriteString(svc.logs.String())
		for _, s := range svc.spans.Ended() {
			all.WriteString(spanText(s))
		}
		if env.Error != nil {
			all.WriteString(env.Error.Message)
		}
		if strings.Contains(all.String(), apiKey) {
			t.Errorf("POST schema with an API key in base_url: the logs, spans or answer hold it:\n%s", all.String())
		}
	}
}

// closedLoopbackPort is 127.0.0.1:port of a port just released: nothing
// listens there.
func closedLoopbackPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestAPIKeyAsWSKeyIsNotSent: one of this service's API keys sent as
// ws_key (the two keys mixed up) is refused invalid_body before any call:
// sent, it would reach the shop's server as the Basic user of every
// request, a third party's logs.
func TestAPIKeyAsWSKeyIsNotSent(t *testing.T) {
	apiKey, _, err := apikey.Generate([]string{"sales:write"})
	if err != nil {
		t.Fatal(err)
	}
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	svc := startServiceWith(t, shop, nil, noDNS{})
	// Whole, without its checksum, and without its tag (the rest is the
	// whole secret).
	for _, key := range []string{apiKey, " " + apiKey[:len(apiKey)-6] + " ", apiKey[len(apikey.TagWrite):]} {
		status, env := svc.post(t, body(shop.URL(), key))
		if status != http.StatusBadRequest || errCode(env) != "invalid_body" {
			t.Errorf("POST schema with an API key as ws_key = %d %s, want 400 invalid_body", status, errCode(env))
		}
	}
	if got := shop.Keys(); len(got) > 0 {
		t.Errorf("the shop received %d requests with a Basic user, the API key", len(got))
	}
	if strings.Contains(svc.logs.String(), apiKey[:len(apiKey)-6]) {
		t.Errorf("the logs hold the API key:\n%s", svc.logs.String())
	}
}

// An API key typed into the shop's host name, as a host name spells it
// ("cxr-…", any case), is never looked up or recorded: a whole key's secret
// is refused 400 invalid_base_url before any lookup (a lookup would send it
// to DNS resolvers, the dial to the shop in the TLS handshake and the Host
// header), and a key cut short, which is sent, is "[key]" wherever the host
// is recorded: the log lines' shop_host, the client spans' server.address
// and url.full, and the logged error, where Go quotes the host
// ("certificate is valid for …, not cxr-…").
func TestAnAPIKeyInTheShopsHostNameIsNeverRecorded(t *testing.T) {
	server := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(server)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	key, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		t.Fatal(err)
	}
	body43 := key[len(apikey.TagRead) : apikey.Len-6]
	cutShort := body43[:20]
	for _, tt := range []struct {
		name, label, secret string
		wantCode            string // the shop's certificate is not for the name: a key cut short reaches the TLS handshake
		wantLookups         bool
	}{
		{"whole key, hyphenated", "cxr-" + key[len(apikey.TagRead):], body43, shopschema.CodeInvalidBaseURL, false},
		{"whole key, upper case", "CXR-" + strings.ToUpper(key[len(apikey.TagRead):]), body43, shopschema.CodeInvalidBaseURL, false},
		{"checksum cut off", "cxr-" + body43, body43, shopschema.CodeInvalidBaseURL, false},
		{"whole key, full-width", "ｃｘｒ－" + key[len(apikey.TagRead):], body43, shopschema.CodeInvalidBaseURL, false},
		{"whole key, its '_' dropped", "cxr" + key[len(apikey.TagRead):], body43, shopschema.CodeInvalidBaseURL, false},
		// IDNA keeps U+2010 and its punycode drops it: xn--cxr<key>-….
		{"whole key, a Unicode hyphen", "cxr\u2010" + key[len(apikey.TagRead):], body43, shopschema.CodeInvalidBaseURL, false},
		{"key cut short", "cxr-" + cutShort, cutShort, "shop_tls_error", true},
		// The tag a label of its own: "cxr" reads as a word, not a tag.
		{"whole key, a '.' for its '_'", "cxr." + key[len(apikey.TagRead):], body43, shopschema.CodeInvalidBaseURL, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			shop := fakeshop.Sample("8", false)
			shop.Start(t.Cleanup)
			_, port, _ := net.SplitHostPort(shop.Addr())
			lookups := &dialCounter{}
			svc := startServiceWith(t, shop, map[string]string{"SHOP_SCHEMA_PORTS": "443," + port}, lookups)
			status, env := svc.post(t, body("https://"+tt.label+".shop.example:"+port+"/", fakeshop.Key))
			if status/100 == 2 || errCode(env) != tt.wantCode {
				t.Fatalf("POST schema = %d %s, want %s", status, errCode(env), tt.wantCode)
			}
			if looked := lookups.lookups.Load() > 0; looked != tt.wantLookups {
				t.Errorf("the host was looked up: %v, want %v", looked, tt.wantLookups)
			}
			var all strings.Builder
			all.WriteString(svc.logs.String())
			for _, s := range append(svc.spans.Ended(), server.Ended()...) {
				all.WriteString(spanText(s))
			}
			all.WriteString(env.Error.Message)
			all.WriteString(metricsText(t, svc.metrics))
			recorded := strings.ToLower(all.String())
			if strings.Contains(recorded, strings.ToLower(tt.secret)) {
				t.Errorf("logs, spans, metrics or the answer hold the key's secret:\n%s", all.String())
			}
			wantHost := "[key].shop.example"
			if strings.HasPrefix(tt.label, "cxr.") {
				wantHost = "cxr." + wantHost // a word of its own, no secret
			}
			if !strings.Contains(svc.logs.String(), `"shop_host":"`+wantHost+`"`) {
				t.Errorf("the log lines do not name the host as %s:\n%s", wantHost, svc.logs.String())
			}
			if !tt.wantLookups {
				return
			}
			spans := clientSpans(svc.spans.Ended())
			if len(spans) == 0 || !strings.Contains(all.String(), "server.address=[key].shop.example|") ||
				!strings.Contains(all.String(), "https://[key].shop.example:"+port+"/") {
				t.Errorf("client spans = %+v, want server.address and url.full with the host as [key].shop.example", spans)
			}
			if !strings.Contains(svc.logs.String(), "not [key].shop.example") {
				t.Errorf("the logged error does not quote the host redacted; the test would not see a key there:\n%s", svc.logs.String())
			}
		})
	}
	// The key is named before any other fault of the URL, so that its
	// sender is told to revoke it, as for a key in its path.
	svc := startServiceWith(t, nil, nil, noDNS{})
	if status, env := svc.post(t, body("http://cxr-"+key[len(apikey.TagRead):]+".shop.example/", fakeshop.Key)); status != http.StatusBadRequest ||
		errCode(env) != shopschema.CodeInvalidBaseURL || !strings.Contains(env.Error.Message, "revoke it") {
		t.Errorf("POST schema with a key in an http URL's host = %d %s, want 400 invalid_base_url saying to revoke the key", status, errCode(env))
	}
}

// TestKeyInTheUserAgentIsNotRecorded: the server span records the
// client's User-Agent, which the gateway forwards as sent, before the body
// and so the ws_key are read. A sale module that wrote its key there (as
// the key, in lower case, as its Basic credential or %-encoded) had it in
// every trace: the live stack's trace store kept it whole. The span keeps
// a User-Agent without the key.
func TestKeyInTheUserAgentIsNotRecorded(t *testing.T) {
	server := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(server)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	shop := fakeshop.Sample("9", true)
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)

	basic := strings.TrimPrefix(basicHeader(fakeshop.Key), "Basic ")
	withKey := "coin-sync/2.1 (" + fakeshop.Key + ")"
	sent := body(shop.URL(), fakeshop.Key)
	for _, tt := range []struct {
		name, userAgent, body, wantCode string
	}{
		{"the key", withKey, sent, ""},
		{"the key in lower case", "coin-sync/2.1 " + strings.ToLower(fakeshop.Key), sent, ""},
		{"the Basic credential", "coin-sync/2.1 " + basic, sent, ""},
		{"the key %-encoded", "coin-sync/2.1 " + percentEncoded(fakeshop.Key), sent, ""},
		// 32 characters, unknown to the shop
		{"the key, the shop refusing it", "coin-sync/2.1 " + fakeshop.Key, body(shop.URL(), strings.ToLower(fakeshop.Key)), "shop_401"},
		// the service reads the key trimmed, as the shop gets it
		{"the key, the body's with a line break after it", withKey, body(shop.URL(), fakeshop.Key+"\n"), ""},
		{"the key, the body refused for another property", withKey,
			`{"base_url":"` + shop.URL() + `","ws_key":"` + fakeshop.Key + `","shop_id":1}`, "invalid_body"},
		{"the key, the body refused for its base_url", withKey, `{"base_url":1,"ws_key":"` + fakeshop.Key + `"}`, "invalid_base_url"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			server.Reset()
			_, _, env := svc.sendWith(t, http.Header{"Content-Type": {"application/json"}, "User-Agent": {tt.userAgent}}, "", tt.body)
			if errCode(env) != tt.wantCode && !(tt.wantCode == "" && env.Error == nil) {
				t.Fatalf("POST schema = %s, want %q", errCode(env), tt.wantCode)
			}
			got := serverSpanUserAgent(t, server)
			for _, secret := range []string{fakeshop.Key, strings.ToLower(fakeshop.Key), basic, percentEncoded(fakeshop.Key)} {
				if strings.Contains(got, secret) {
					t.Errorf("server span's user_agent.original = %q: holds the key", got)
				}
			}
		})
	}
	t.Run("a User-Agent without the key is kept", func(t *testing.T) {
		server.Reset()
		svc.sendWith(t, http.Header{"Content-Type": {"application/json"}, "User-Agent": {"coin-sync/2.1"}}, "", body(shop.URL(), fakeshop.Key))
		if got := serverSpanUserAgent(t, server); got != "coin-sync/2.1" {
			t.Errorf("server span's user_agent.original = %q, want the client's", got)
		}
	})
}

// serverSpanUserAgent is the user_agent.original of the one server span
// recorded.
func serverSpanUserAgent(t *testing.T, server *tracetest.SpanRecorder) string {
	t.Helper()
	var found []string
	for _, s := range server.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			found = append(found, attrOf(s, "user_agent.original").AsString())
		}
	}
	if len(found) != 1 {
		t.Fatalf("server spans' user_agent.original: %q, want one", found)
	}
	return found[0]
}
