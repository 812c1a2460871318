package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/testenv"
)

// What the README's "Passing through" says reaches a client through the
// proxies as the gateway sent it: a list page gzipped (Content-Encoding,
// Vary), the shop schema route's answer whole with its length, both also
// to an HTTP/1.0 client, and (checkPassedHeaders, on the calls of "the
// client's own address") the rate-limit headers, a 429's Retry-After and
// X-Request-Id. And its warning: a one-address header that the proxy does
// not write is the client's own, believed.

// schemaShopCategories is the shop's size in the README's figure: 2,999
// categories in three languages, a schema of about 500 KB.
const schemaShopCategories = 2999

// startSchemaShop is a PrestaShop webservice on 127.0.0.1 over HTTPS with
// three languages and schemaShopCategories categories, each named in all
// three, sent in one page (shop-schema reads a page longer than it asked
// for as all there is).
func startSchemaShop(t *testing.T) fakeShop {
	t.Helper()
	var categories strings.Builder
	categories.WriteString(`{"categories":[`)
	for id := 1; id <= schemaShopCategories; id++ {
		if id > 1 {
			categories.WriteString(",")
		}
		fmt.Fprintf(&categories, `{"id":"%d","id_parent":"%d","level_depth":"%d","active":"1","position":"%d","is_root_category":"%d",`+
			`"name":[{"id":"1","value":"Category %[1]d"},{"id":"2","value":"Категория %[1]d"},{"id":"3","value":"Категорія %[1]d"}]}`,
			id, (id-1)/10, min(id-1, 1), id%10, boolDigit(id == 2))
	}
	categories.WriteString("]}")
	rows := map[string]string{
		"languages": `{"languages":[{"id":"1","name":"English","iso_code":"en","language_code":"en-us","locale":"en-US","active":"1"},` +
			`{"id":"2","name":"Русский","iso_code":"ru","language_code":"ru-ru","locale":"ru-RU","active":"1"},` +
			`{"id":"3","name":"Українська","iso_code":"uk","language_code":"uk-ua","locale":"uk-UA","active":"1"}]}`,
		"categories":             categories.String(),
		"product_features":       shopRows["product_features"],
		"product_feature_values": shopRows["product_feature_values"],
	}
	srv := testenv.LoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := rows[strings.TrimPrefix(r.URL.Path, "/api/")]
		if !ok || shopKeyOf(r) != shopKey {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, body)
	}))
	srv.StartTLS()
	caFile := filepath.Join(t.TempDir(), "shop-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return fakeShop{url: srv.URL, caFile: caFile}
}

func boolDigit(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkPassedHeaders: the answers of the gateways' per-address limit
// through the proxy (RATE_LIMIT_ANONYMOUS, 5) carry its X-RateLimit-*
// headers, the 429 its Retry-After, and each its X-Request-Id, the
// gateway's id in meta.request_id.
func checkPassedHeaders(t *testing.T, got []reply) {
	t.Helper()
	for i, r := range got {
		problems := []string{}
		if r.header.Get("X-RateLimit-Limit") != "5" {
			problems = append(problems, "X-RateLimit-Limit "+r.header.Get("X-RateLimit-Limit"))
		}
		for _, name := range []string{"X-RateLimit-Remaining", "X-RateLimit-Reset"} {
			if _, err := strconv.ParseUint(r.header.Get(name), 10, 64); err != nil {
				problems = append(problems, name+" "+r.header.Get(name))
			}
		}
		if r.status == 429 {
			if n, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || n < 1 || r.header.Get("X-RateLimit-Remaining") != "0" {
				problems = append(problems, fmt.Sprintf("Retry-After %q, X-RateLimit-Remaining %q", r.header.Get("Retry-After"), r.header.Get("X-RateLimit-Remaining")))
			}
		}
		if id := r.header.Get("X-Request-Id"); !requestID.MatchString(id) || id != r.env.Meta.RequestID {
			problems = append(problems, fmt.Sprintf("X-Request-Id %q, meta.request_id %q", id, r.env.Meta.RequestID))
		}
		if len(problems) > 0 {
			t.Errorf("health call %d through the proxy = %d: %s, want the gateway's headers as it sent them", i+1, r.status, strings.Join(problems, "; "))
		}
	}
}

// checkPassingThrough: through the proxy at front, for client c, a list
// page asked for gzipped comes gzipped, with Vary, and reads as the
// gateway's own answer; the shop schema of schemaShopCategories comes
// whole with its Content-Length; an HTTP/1.0 client gets both with their
// length, never chunked.
func checkPassingThrough(t *testing.T, front string, g *stack, fx fixture, shop fakeShop, c client) {
	const page = "/export/items?limit=50"
	key := map[string]string{"X-API-Key": fx.readKey}
	direct := send(t, http.DefaultClient, "GET", g.baseURL+page, key, "")
	if direct.status != 200 || len(direct.body) < 4<<10 {
		t.Fatalf("the list page from the gateway = %d, %d bytes: want a page worth compressing", direct.status, len(direct.body))
	}
	gzipped := map[string]string{"X-API-Key": fx.readKey, "Accept-Encoding": "gzip"}
	// A transport that leaves the answer as it came: Go's own asks for
	// gzip and takes Content-Encoding and Content-Length away as it reads.
	raw := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: c.Transport.(*http.Transport).DialContext, DisableCompression: true}}
	defer raw.CloseIdleConnections()
	got := send(t, raw, "GET", front+"/v1"+page, gzipped, "")
	wantGzippedPage(t, "HTTP/1.1", got, direct, lengthOf(got))
	got, framing := http10(t, c.ip, front, "GET", "/v1"+page, gzipped, "")
	wantGzippedPage(t, "HTTP/1.0", got, direct, framing)

	schema := `{"base_url":"` + shop.url + `","ws_key":"` + shopKey + `"}`
	got = send(t, raw, "POST", front+"/v1/sync/prestashop/schema", map[string]string{"Content-Type": "application/json", "Accept-Encoding": "gzip"}, schema)
	framing = lengthOf(got)
	if got.header.Get("Content-Encoding") != "gzip" {
		t.Errorf("the shop schema asked for gzipped through the proxy came with Content-Encoding %q, want gzip", got.header.Get("Content-Encoding"))
	} else {
		got.body = gunzip(t, "the shop schema", got.body)
		_ = json.Unmarshal(got.body, &got.env)
	}
	wantWholeSchema(t, "HTTP/1.1", got, framing)
	got, framing = http10(t, c.ip, front, "POST", "/v1/sync/prestashop/schema", map[string]string{"Content-Type": "application/json"}, schema)
	wantWholeSchema(t, "HTTP/1.0", got, framing)
}

// lengthOf says what is wrong with got's Content-Length: missing, or not
// the length of the body as it came.
func lengthOf(got reply) string {
	if n := got.header.Get("Content-Length"); n != strconv.Itoa(len(got.body)) {
		return fmt.Sprintf("Content-Length %q for a body of %d bytes", n, len(got.body))
	}
	return ""
}

func gunzip(t *testing.T, what string, body []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%s, gzipped through the proxy: %v", what, err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s, gzipped through the proxy: %v", what, err)
	}
	return plain
}

// wantGzippedPage checks that got is the list page gzipped, with Vary:
// Accept-Encoding, whose items are direct's; framing is what is wrong with
// its length (lengthOf, http10).
func wantGzippedPage(t *testing.T, proto string, got, direct reply, framing string) {
	t.Helper()
	if got.status != 200 || got.header.Get("Content-Encoding") != "gzip" || !strings.Contains(got.header.Get("Vary"), "Accept-Encoding") || framing != "" {
		t.Errorf("a list page asked for gzipped by an %s client through the proxy = %d, Content-Encoding %q, Vary %q, %s: want gzip, Vary: Accept-Encoding and its length, as the gateway sent it",
			proto, got.status, got.header.Get("Content-Encoding"), got.header.Get("Vary"), framing)
		return
	}
	var env envelope.Parsed
	if plain := gunzip(t, "the list page", got.body); json.Unmarshal(plain, &env) != nil || !bytes.Equal(env.Data, direct.env.Data) {
		t.Errorf("the gzipped list page through the proxy (%s), %d bytes, reads as %d bytes, not the gateway's page of %d", proto, len(got.body), len(plain), len(direct.body))
	}
}

// wantWholeSchema checks that got is the shop's schema, every category in
// it, with its length (framing: lengthOf, http10).
func wantWholeSchema(t *testing.T, proto string, got reply, framing string) {
	t.Helper()
	var schema struct {
		Categories []json.RawMessage `json:"categories"`
	}
	if got.status != 200 || json.Unmarshal(got.env.Data, &schema) != nil || len(schema.Categories) != schemaShopCategories || framing != "" {
		t.Errorf("the shop schema through the proxy to an %s client = %d, %d bytes, %d categories, %s: want its %d, with its length: %.200s",
			proto, got.status, len(got.body), len(schema.Categories), framing, schemaShopCategories, got.body)
	}
}

// http10 sends one HTTP/1.0 request to front (a base URL) from ip, as curl
// -0 does, and reads the answer to the connection's end. framing is what
// is wrong with how the answer was framed for such a client: it must
// carry Content-Length, the length of its body, and no Transfer-Encoding
// (RFC 9112 7.1: no chunks towards HTTP/1.0).
func http10(t *testing.T, ip, front, method, path string, header map[string]string, body string) (got reply, framing string) {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	host := strings.TrimPrefix(front, "http://")
	conn, err := dialer.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	var head strings.Builder
	fmt.Fprintf(&head, "%s %s HTTP/1.0\r\nHost: %s\r\n", method, path, host)
	for k, v := range header {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	if body != "" {
		fmt.Fprintf(&head, "Content-Length: %d\r\n", len(body))
	}
	head.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, head.String()); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(conn) // HTTP/1.0: the proxy closes the connection after its answer
	if err != nil {
		t.Fatalf("%s %s as HTTP/1.0 through %s: %v", method, path, front, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(all)), nil)
	if err != nil {
		t.Fatalf("%s %s as HTTP/1.0 through %s: %v", method, path, front, err)
	}
	got = reply{status: resp.StatusCode, header: resp.Header}
	got.body, err = io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s as HTTP/1.0 through %s: %v", method, path, front, err)
	}
	_ = json.Unmarshal(got.body, &got.env)
	// The raw answer: Go's reader takes a chunked answer apart whatever
	// its version, so its framing is read from the head itself.
	rawHead, _, _ := bytes.Cut(all, []byte("\r\n\r\n"))
	lowered := strings.ToLower(string(rawHead))
	switch {
	case strings.Contains(lowered, "\ntransfer-encoding:"):
		framing = "a Transfer-Encoding line in its head"
	case resp.ContentLength != int64(len(got.body)):
		framing = fmt.Sprintf("Content-Length %d for a body of %d bytes", resp.ContentLength, len(got.body))
	}
	return got, framing
}

// checkOneAddressHeaderBelieved: behind the proxy's snippet, which writes
// no X-Real-IP, a gateway reading the client from X-Real-IP believes the
// one the client wrote: the README's warning, which the proxy's own line
// setting it would answer.
func checkOneAddressHeaderBelieved(t *testing.T, front string, realIP *stack, c client) {
	got := send(t, c.Client, "GET", front+"/v1/health", map[string]string{"X-Real-IP": "9.9.9.9"}, "")
	line := waitForLine(t, []*stack{realIP}, "request_id", got.env.Meta.RequestID)
	if line["client_ip"] != "9.9.9.9" {
		t.Errorf("a client's own X-Real-IP: 9.9.9.9 through the proxy to a gateway reading X-Real-IP was logged as %v, want 9.9.9.9 believed, as the README warns", line["client_ip"])
	}
}

// settingRealIP is the change to proxy's snippet that the README names
// for a one-address header (its X-Real-IP paragraph): the proxy's line
// setting X-Real-IP on every request, after the line setting X-Request-Id.
func settingRealIP(t *testing.T, proxy string) []string {
	t.Helper()
	after, line := "proxy_set_header X-Request-Id $request_id;", "proxy_set_header X-Real-IP $remote_addr;"
	if proxy == "haproxy" {
		after, line = `http-request set-header X-Request-Id "%[unique-id]"`, "http-request set-header X-Real-IP %[src]"
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "`"+line+"`") {
		t.Fatalf("README.md names no %q for %s's X-Real-IP: the test adds the line it names", line, proxy)
	}
	return []string{after, after + "\n  " + line}
}

// checkOneAddressHeaderSet: behind the proxy's snippet with its line
// setting X-Real-IP (settingRealIP), a gateway reading the client from
// X-Real-IP logs the client's own address, not the one the client wrote:
// the README's "with that line, its own address".
func checkOneAddressHeaderSet(t *testing.T, front string, realIP *stack, c client) {
	got := send(t, c.Client, "GET", front+"/v1/health", map[string]string{"X-Real-IP": "9.9.9.9"}, "")
	line := waitForLine(t, []*stack{realIP}, "request_id", got.env.Meta.RequestID)
	if line["client_ip"] != c.ip {
		t.Errorf("a client's own X-Real-IP: 9.9.9.9 through the proxy setting X-Real-IP to a gateway reading it was logged as %v, want the client's %s", line["client_ip"], c.ip)
	}
}
