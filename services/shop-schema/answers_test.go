package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"

	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
)

// TestWhatHostsDoToAnswers: what a host's server, or PHP, does to the
// webservice's answers (reference §4, §5): the right schema when the
// answer can still be read, else the error code with a message that says
// what the merchant is to fix; never a 500, and never the key in the
// answer, the log or a span.
func TestWhatHostsDoToAnswers(t *testing.T) {
	smallCaps := map[string]string{"SHOP_SCHEMA_MAX_RESPONSE_BYTES": "65536"}
	certificate := func(host string, notAfter time.Time) func(*fakeshop.Shop) {
		return func(s *fakeshop.Shop) {
			c := fakeshop.SelfSigned([]string{host}, time.Now().Add(-100*24*time.Hour), notAfter)
			s.Certificate = &c
		}
	}
	year := time.Now().Add(365 * 24 * time.Hour)
	tests := []struct {
		name        string
		setup       func(*fakeshop.Shop)
		env         map[string]string
		wantStatus  int
		wantCode    string // "" for the sample's schema
		wantMessage string // a part of the error's message
	}{
		{"gzipped", func(s *fakeshop.Shop) { s.Gzip = true }, nil, 200, "", ""},
		// Apache's AddDefaultCharset labels PHP's UTF-8 so.
		{"UTF-8 labelled iso-8859-1", func(s *fakeshop.Shop) { s.Charset = "iso-8859-1" }, nil, 200, "", ""},
		{"rewrite rule without [QSA]: XML at /api, dispatcher.php reads the query", func(s *fakeshop.Shop) { s.RewriteDropsQuery = true }, nil, 200, "", ""},
		{"endless answer", func(s *fakeshop.Shop) { s.Endless = true }, smallCaps, 502, "shop_too_large", "larger than 65536 bytes"},
		{"endless gzipped answer", func(s *fakeshop.Shop) { s.Endless, s.Gzip = true, true }, smallCaps, 502, "shop_too_large", "larger than 65536 bytes"},
		{"labelled gzip, not gzip", func(s *fakeshop.Shop) { s.BadGzip = true }, nil, 502, "shop_bad_response", "could not be decoded"},
		{"slow drip", func(s *fakeshop.Shop) { s.Drip = 20 * time.Millisecond }, map[string]string{"SHOP_SCHEMA_TIMEOUT": "500ms", "SHOP_SCHEMA_CONNECT_TIMEOUT": "500ms"}, 504, "shop_timeout", "did not answer in time"},
		// An answer that is not JSON says what it is, for the merchant
		// to know what to fix; it said "not JSON" whatever it was.
		{"XML only (before 1.6.0.9)", func(s *fakeshop.Shop) { s.XMLOnly = true }, nil, 502, "shop_bad_response", "answered XML"},
		{"PHP notice printed before the JSON", func(s *fakeshop.Shop) { s.PHPNotice = true }, nil, 502, "shop_bad_response", "display_errors"},
		{"maintenance page with 200", func(s *fakeshop.Shop) { s.HTML = true }, nil, 502, "shop_bad_response", "HTML page"},
		// PrestaShop writes UTF-8 only (json_encode); a server that
		// transcodes its answer, read as UTF-8, made every Cyrillic name
		// U+FFFD and answered 200.
		{"body re-encoded as windows-1251", func(s *fakeshop.Shop) { s.Charset = "windows-1251" }, nil, 502, "shop_bad_response", "not UTF-8"},
		{"a password in front of the shop (401 page)", func(s *fakeshop.Shop) { s.ErrorPage = http.StatusUnauthorized }, nil, 400, "shop_401", "password"},
		// TLS: the certificate, trusted unless SHOP_SCHEMA_CA_FILE is
		// emptied, is the shop's own (certificate) or httptest's. Each
		// failure says which of the three it is; it was one phrase for all.
		{"trusted certificate for 127.0.0.1", certificate("127.0.0.1", year), nil, 200, "", ""},
		{"self-signed certificate", nil, map[string]string{"SHOP_SCHEMA_CA_FILE": ""}, 502, "shop_tls_error", "not signed by a trusted authority"},
		{"certificate expired", certificate("127.0.0.1", time.Now().Add(-time.Hour)), nil, 502, "shop_tls_error", "has expired"},
		{"certificate for another name", certificate("shop.example.com", year), nil, 502, "shop_tls_error", "is for another name than"},
		{"server speaks TLS 1.1 at most", func(s *fakeshop.Shop) { s.MaxTLS = tls.VersionTLS11 }, nil, 502, "shop_tls_error", "older than 1.2"},
		{"server offers RSA key exchange only", func(s *fakeshop.Shop) { s.LegacyCiphers = true }, nil, 502, "shop_tls_error", "refused the TLS handshake"},
		// Without the rewrite rule, PrestaShop's front office redirects
		// /api/... to its canonical page, a 404 in the shop's language.
		{"no rewrite, /api redirected to a 404 page", func(s *fakeshop.Shop) {
			s.NoRewrite = true
			s.Redirect = func(r *http.Request) string {
				if strings.HasPrefix(r.URL.Path, "/api/") {
					return "/en/404"
				}
				return ""
			}
		}, nil, 200, "", ""},
		// A redirect refused says why: it was "an unusable address" for
		// each.
		{"redirect to http", func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return "http://127.0.0.1:1" + r.URL.RequestURI() }
		}, nil, 502, "shop_bad_response", "to an http:// address"},
		{"redirect loop", func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return r.URL.RequestURI() }
		}, nil, 502, "shop_bad_response", "redirected more than 3 times"},
		{"redirect to an invalid address", func(s *fakeshop.Shop) {
			s.Redirect = func(r *http.Request) string { return "https://127.0.0.1:0" + r.URL.RequestURI() }
		}, nil, 502, "shop_bad_response", "to an invalid address"},
	}
	for _, tt := range tests {
		for _, http2 := range []bool{false, true} {
			t.Run(map[bool]string{false: "HTTP/1.1 ", true: "HTTP/2 "}[http2]+tt.name, func(t *testing.T) {
				shop := fakeshop.Sample("8", false)
				shop.HTTP2 = http2
				if tt.setup != nil {
					tt.setup(shop)
				}
				shop.Start(t.Cleanup)
				svc := startService(t, shop, tt.env)
				status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
				if status != tt.wantStatus || tt.wantCode != "" && errCode(env) != tt.wantCode {
					t.Fatalf("POST schema = %d %s %+v, want %d %s\n%s", status, errCode(env), env.Error, tt.wantStatus, tt.wantCode, svc.logs)
				}
				if tt.wantCode == "" {
					got := decodeResult(t, env)
					got.ShopVersion = ""
					if diff := cmp.Diff(wantSample(), got); diff != "" {
						t.Errorf("schema mismatch (-want +got):\n%s", diff)
					}
				} else if !strings.Contains(env.Error.Message, tt.wantMessage) {
					t.Errorf("message %q, want it to say %q", env.Error.Message, tt.wantMessage)
				}
				checkSpanVocabulary(t, clientSpans(svc.spans.Ended()))
				// The shop spoke the protocol the case is named for.
				for _, s := range svc.spans.Ended() {
					if v := attrOf(s, "network.protocol.version").AsString(); v != "" && v != map[bool]string{false: "1.1", true: "2.0"}[http2] {
						t.Errorf("span of %s: network.protocol.version %q, want the case's protocol", spanURL(s), v)
					}
				}
				seen := []string{string(env.Data), svc.logs.String(), metricsText(t, svc.metrics)}
				if env.Error != nil {
					seen = append(seen, env.Error.Message)
				}
				for _, s := range svc.spans.Ended() {
					seen = append(seen, spanText(s))
				}
				for _, text := range seen {
					if strings.Contains(text, fakeshop.Key) || strings.Contains(text, strings.TrimPrefix(basicHeader(fakeshop.Key), "Basic ")) {
						t.Errorf("the key is in %q", text)
					}
				}
			})
		}
	}
}

// TestShopInASubfolderAskedWithoutIt: a shop installed in a subfolder,
// asked at its host's root, is found at neither /api nor dispatcher.php;
// the message says where the caller's base_url is likely wrong. It said
// "no webservice at this address".
func TestShopInASubfolderAskedWithoutIt(t *testing.T) {
	shop := fakeshop.Sample("1.7", false)
	shop.Prefix = "/prestashop"
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	status, env := svc.post(t, body(strings.TrimSuffix(shop.URL(), shop.Prefix), fakeshop.Key))
	if status != http.StatusBadGateway || errCode(env) != "shop_not_found" {
		t.Fatalf("POST schema = %d %s, want 502 shop_not_found", status, errCode(env))
	}
	if want := "its subfolder included"; !strings.Contains(env.Error.Message, want) {
		t.Errorf("message %q, want it to say %q", env.Error.Message, want)
	}
}

// TestAnswerHeadersOverTheLimit: answer headers over the 64 KiB the
// client allows are shop_too_large over HTTP/1.1 and HTTP/2 alike. Over
// HTTP/2, Go's reader ends the stream when the headers overflow in the
// last frame of their block (62 headers of 1 KiB, as Go's server frames
// them), and the connection
// with COMPRESSION_ERROR for one header too long or PROTOCOL_ERROR when
// more frames follow (100 headers); those were shop_bad_response, and the
// first shop_unreachable, which sends the merchant to check DNS and
// firewalls for a shop that answered.
func TestAnswerHeadersOverTheLimit(t *testing.T) {
	both := []bool{false, true}
	for _, tt := range []struct {
		name   string
		setup  func(*fakeshop.Shop)
		http2s []bool
	}{
		{"one header of 100 KiB", func(s *fakeshop.Shop) { s.HeaderPadding = 100 << 10 }, both},
		{"100 headers of 1 KiB", func(s *fakeshop.Shop) { s.HeaderLines = 100 }, both},
		// Under 64 KiB as HTTP/1.1 counts them, over as HTTP/2 does (32
		// bytes more a header).
		{"62 headers of 1 KiB", func(s *fakeshop.Shop) { s.HeaderLines = 62 }, []bool{true}},
	} {
		for _, http2 := range tt.http2s {
			t.Run(fmt.Sprintf("%s HTTP/2 %v", tt.name, http2), func(t *testing.T) {
				shop := fakeshop.Sample("8", false)
				shop.HTTP2 = http2
				tt.setup(shop)
				svc := readFails(t, shop, "shop_too_large", "larger than 64 KiB")
				checkSpanVocabulary(t, clientSpans(svc.spans.Ended()))
			})
		}
	}
}

// TestServerThatPicksAnOldTLSVersion: a server older than TLS 1.2 (an old
// OpenSSL or IIS) does not refuse the handshake with an alert, as Go's
// server does (the "TLS 1.1 at most" case above): it answers the
// ClientHello with a ServerHello of its own version, which the client
// refuses. That was shop_unreachable ("check DNS and firewalls").
func TestServerThatPicksAnOldTLSVersion(t *testing.T) {
	for name, version := range map[string]uint16{"TLS 1.0": tls.VersionTLS10, "TLS 1.1": tls.VersionTLS11} {
		t.Run(name, func(t *testing.T) {
			addr := serveServerHello(t, version)
			svc := startService(t, nil, nil)
			status, env := svc.post(t, body("https://"+addr, fakeshop.Key))
			if status != http.StatusBadGateway || errCode(env) != "shop_tls_error" {
				t.Fatalf("POST schema = %d %s %+v, want 502 shop_tls_error\n%s", status, errCode(env), env.Error, svc.logs)
			}
			if want := "older than 1.2"; !strings.Contains(env.Error.Message, want) {
				t.Errorf("message %q, want it to say %q", env.Error.Message, want)
			}
		})
	}
}

// serveServerHello listens on 127.0.0.1 and answers each connection's
// ClientHello with a bare ServerHello of version, the way a server that
// supports nothing newer negotiates, then reads until the client leaves.
func serveServerHello(t *testing.T, version uint16) string {
	t.Helper()
	// version, random (32 bytes), session id (none), cipher suite
	// TLS_RSA_WITH_AES_128_CBC_SHA, compression (none).
	hello := append([]byte{byte(version >> 8), byte(version)}, make([]byte, 32)...)
	hello = append(hello, 0, 0x00, 0x2f, 0)
	handshake := append([]byte{2, 0, 0, byte(len(hello))}, hello...)
	record := append([]byte{22, byte(version >> 8), byte(version), 0, byte(len(handshake))}, handshake...)
	return testenv.ServeConns(t, func(conn net.Conn) {
		if _, err := conn.Read(make([]byte, 4096)); err != nil {
			return
		}
		if _, err := conn.Write(record); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, conn)
	})
}

// TestShopWordsInTheLogAreBounded: Go's transport quotes what a shop
// wrote in its error (a status line that does not parse, up to the 64 KiB
// of headers allowed, each byte that is not text written \xff), and that
// error is the "shop call failed" line's: one answer of 60 KiB made a log
// line of 307,625 bytes. The line keeps the start of the error (the URL
// asked) and its end, with the key still out of both.
func TestShopWordsInTheLogAreBounded(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.StatusLine = func(key string) string { return "HTTP/1.1 " + key + strings.Repeat("\xff", 60<<10) + "END" }
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	if status, env := svc.post(t, body(shop.URL(), fakeshop.Key)); status != http.StatusBadGateway {
		t.Fatalf("POST schema = %d %s, want 502", status, errCode(env))
	}
	var line string
	for _, l := range strings.Split(svc.logs.String(), "\n") {
		if strings.Contains(l, `"shop call failed"`) {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no \"shop call failed\" line:\n%.2000s", svc.logs.String())
	}
	if len(line) > 8<<10 {
		t.Errorf("the \"shop call failed\" line is %d bytes, want at most 8 KiB", len(line))
	}
	for _, want := range []string{"/api/", "bytes left out", `END`} {
		if !strings.Contains(line, want) {
			t.Errorf("the line lacks %q: %.600s", want, line)
		}
	}
	if strings.Contains(line, fakeshop.Key) {
		t.Error("the line holds the key")
	}
}

// TestMalformedHTTP1Answer: a shop whose server answers what is not HTTP
// (a status line or a header that does not parse), or a body whose framing
// cannot be read, was reached, and is at fault: shop_bad_response, as over
// HTTP/2 (TestShopWordsDoNotSteerTheLabel). It was shop_unreachable, which
// sends the merchant to check DNS and firewalls.
func TestMalformedHTTP1Answer(t *testing.T) {
	const notHTTP, unframed = "not HTTP", "a body whose length cannot be read"
	for _, tt := range []struct{ name, answer, want string }{
		{"no status line", "<html><body>hello</body></html>", notHTTP},
		{"status code not a number", "HTTP/1.1 OK 200", notHTTP},
		{"header line without a colon", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Broken header", notHTTP},
		{"status line of 60 KiB, not text", "HTTP/1.1 " + strings.Repeat("\xff", 60<<10), notHTTP},
		{"Content-Length not a number", "HTTP/1.1 200 OK\r\nContent-Length: abc", unframed},
		{"Content-Length empty", "HTTP/1.1 200 OK\r\nContent-Length: ", unframed},
		{"two Content-Lengths that differ", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2", unframed},
		{"a Transfer-Encoding other than chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip", unframed},
		{"a coding before chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked", unframed},
		{"two Transfer-Encoding lines", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked", unframed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			shop := fakeshop.Sample("8", false)
			shop.StatusLine = func(string) string { return tt.answer }
			readFails(t, shop, "shop_bad_response", tt.want)
		})
	}
}

// readFails starts shop, has the service read its schema, and holds that
// the answer is 502 code with a message that says want.
func readFails(t *testing.T, shop *fakeshop.Shop, code, want string) *service {
	t.Helper()
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusBadGateway || errCode(env) != code {
		t.Fatalf("POST schema = %d %s %+v, want 502 %s", status, errCode(env), env.Error, code)
	}
	if !strings.Contains(env.Error.Message, want) {
		t.Errorf("message %q, want it to say %q", env.Error.Message, want)
	}
	return svc
}
