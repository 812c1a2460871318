package edge

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/coinexport/export/pkg/testenv"
)

// fuzzKey is where FuzzClientRequest puts its well-formed API key in the
// fuzzed bytes: any header, the target or the body may carry it.
const fuzzKey = "$KEY"

// clientRequestSeeds are FuzzClientRequest's requests, from the table
// tests of the gateway's refusals (routing, framing, keys, Connection,
// Host, user info, Content-Type, Idempotency-Key): method, request
// target, header lines (each ended by CRLF) and body.
var clientRequestSeeds = []struct{ method, target, headers, body string }{
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\n", ""},
	{"GET", "/v1/export/items?limit=5&lang=fr&cursor=c1&fields=id", "X-API-Key: $KEY\r\n", ""},
	{"GET", "/v1/export/items/coin-1", "X-API-Key: $KEY\r\n", ""},
	{"HEAD", "/v1/export/items/coin-1", "X-API-Key: $KEY\r\n", ""},
	{"GET", "/v1/health", "", ""},
	{"GET", "/v1/export/items", "", ""},
	{"GET", "/v1/export/items", "X-API-Key: cxr_nope\r\n", ""},
	{"GET", "/v1/export/items", "Authorization: Bearer $KEY\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nX-API-Key: $KEY\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key:  $KEY \r\n", ""},
	{"GET", "/v1/export/items?api_key=$KEY", "", ""},
	{"GET", "/v1/export/items/$KEY", "", ""},
	{"GET", "/v1/export/items?cursor=%ZZ", "X-API-Key: $KEY\r\n", ""},
	{"GET", "/v1/export/items/..%2F..%2Fhealthz", "X-API-Key: $KEY\r\n", ""},
	{"GET", "//v1/export/items", "X-API-Key: $KEY\r\n", ""},
	{"GET", "/v1/export/items/%2E%2E", "X-API-Key: $KEY\r\n", ""},
	{"GET", "/v1/export/items/" + strings.Repeat("a", 3000), "X-API-Key: $KEY\r\n", ""},
	{"GET", "http://cxr_" + strings.Repeat("A", 43) + "@gateway/v1/export/items", "", ""},
	{"GET", "http://user:$KEY@gateway/v1/export/items", "", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nConnection: Idempotency-Key\r\nIdempotency-Key: k\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nConnection: close, Accept-Language\r\nAccept-Language: fr\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nTransfer_Encoding: chunked\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nX API Key: $KEY\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\n folded\r\n", ""},
	{"DELETE", "/v1/export/items/coin-1", "X-API-Key: $KEY\r\n", ""},
	{"PATCH", "/v1/export/items", "X-API-Key: $KEY\r\n", ""},
	{"BREW", "/v1/export/items", "X-API-Key: $KEY\r\n", ""},
	{"POST", "/v1/export/items/coin-1/sales/confirm",
		"X-API-Key: $KEY\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 29\r\n",
		`{"external_order_id":"ord-1"}`},
	{"POST", "/v1/export/items/coin-1/sales/cancel",
		"X-API-Key: $KEY\r\nIdempotency-Key: $KEY\r\nContent-Type: application/json\r\nContent-Length: 29\r\n",
		`{"external_order_id":"ord-1"}`},
	{"POST", "/v1/export/items/coin-1/sales/confirm",
		"X-API-Key: $KEY\r\nIdempotency-Key: k1\r\nContent-Type: text/plain\r\nContent-Type: application/json\r\nContent-Length: 2\r\n", "{}"},
	{"POST", "/v1/export/items/coin-1/sales/confirm",
		"X-API-Key: $KEY\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\n"},
	{"POST", "/v1/export/items/coin-1/sales/confirm",
		"X-API-Key: $KEY\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n", "2 ;x=1\r\n{}\r\n0\r\n\r\n"},
	{"POST", "/v1/export/items/coin-1/sales/confirm",
		"X-API-Key: $KEY\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n",
		"2\r\n{}\r\n0\r\n\r\n"},
	{"POST", "/v1/export/items/coin-1/sales/confirm",
		"X-API-Key: $KEY\r\nIdempotency-Key: k1\r\nContent-Encoding: gzip\r\nContent-Type: application/json\r\nContent-Length: 2\r\n", "{}"},
	{"POST", "/v1/export/items/coin-1/sales/confirm", "X-API-Key: $KEY\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\n", ""},
	{"POST", "/v1/sync/prestashop/schema", "X-API-Key: $KEY\r\nContent-Type: application/json\r\nContent-Length: 2\r\n", "{}"},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nHost: other\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nX-Note: a\x01b\x1b[31m\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\nUser-Agent: \xff\xfe\r\nX-Request-Id: a\tb\r\n", ""},
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\ntraceparent: 00-zz\r\n", ""},
	// A second request after the first's head, served once the first's
	// answer is read: its line is this input's.
	{"GET", "/v1/export/items", "X-API-Key: $KEY\r\n\r\nGET /v1/export/items HTTP/1.1\r\nHost: gateway\r\nX-Request-Id: a\tb\r\n", ""},
	{"GET", "/v1/export/items/a%09b%00c%1B", "X-API-Key: $KEY\r\n", ""},
	{"POST", "/v1/export/items/coin-1/sales/confirm",
		"X-API-Key: $KEY\r\nIdempotency-Key: k\t1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n", "{}"},
}

// FuzzClientRequest sends the gateway whole requests from the fuzzer (its
// method, request target, header lines and body, a well-formed API key
// wherever "$KEY" stands), in front of an instance that answers every
// request it is sent 200, and checks the answer and the logs: no panic;
// no 5xx (the instance is healthy: any 5xx is the gateway's own failure on
// a client's bytes); every 4xx (but to HEAD) an envelope with a code, a
// message and a request id; neither the answer nor a log line holds the
// key; every log line is JSON without a control character in a value.
func FuzzClientRequest(f *testing.F) {
	for _, s := range clientRequestSeeds {
		f.Add(s.method, s.target, s.headers, []byte(s.body))
	}
	up := &scriptedUpstream{}
	up.set(answerOf("HTTP/1.1 200 OK", []string{"Content-Type: application/json", "Content-Length: 12"}, `{"data":{}}`+"\n"), afterKeep)
	addr := "http://" + testenv.ServeConns(f, up.serve)
	env := map[string]string{"EXPORT_READER_URLS": addr, "SALES_WRITER_URLS": addr, "SHOP_SCHEMA_URLS": addr,
		"RATE_LIMIT_ENABLED": "false", "GATEWAY_READ_TIMEOUT": "300ms", "GATEWAY_WRITE_TIMEOUT": "1s", "LOG_LEVEL": "info"}
	g, logs := startWithHook(f, env, func(g *Gateway) { g.keys = relayKeys{} })
	key := wellFormedKey(f)
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte) {
		raw := strings.ReplaceAll(method+" "+target+" HTTP/1.1\r\nHost: gateway\r\n"+headers+"Connection: close\r\n\r\n"+string(body),
			fuzzKey, key)
		status, answer, err := sendRaw(g.Addr(), method, raw)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		checkClientAnswer(t, raw, method, status, answer, key)
		// Every line of this input's requests is written once the gateway
		// has closed its connection (sendRaw closed the client's): a
		// request the fuzzer's bytes pipelined after the first is served
		// after the answer read, and its lines read with the next input's
		// were blamed on that one, which passes alone.
		waitOpen(t, g, 0)
		checkClientLogs(t, raw, logs.Drain(), key)
	})
}

// sendRaw writes raw to the gateway at addr on a connection of its own and
// reads the first answer, to a request of method: its status and its
// bytes (head and body). Only the first: a head ended early by the
// fuzzer's header lines leaves the connection kept alive.
func sendRaw(addr, method, raw string) (int, []byte, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(fuzzRelayClientBound))
	if _, err := io.WriteString(conn, raw); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		return 0, nil, fmt.Errorf("no HTTP answer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("the answer %d was cut short: %w", resp.StatusCode, err)
	}
	var head strings.Builder
	_ = resp.Header.Write(&head)
	return resp.StatusCode, []byte(head.String() + "\r\n" + string(body)), nil
}

// checkClientAnswer fails t if the gateway's answer to raw is a 5xx, a
// 4xx without the envelope, or holds key.
func checkClientAnswer(t *testing.T, raw, method string, status int, answer []byte, key string) {
	t.Helper()
	if strings.Contains(string(answer), key) {
		t.Fatalf("%q: the answer holds the key: %q", raw, answer)
	}
	if status >= 500 {
		t.Fatalf("%q: answered %d: %q", raw, status, answer)
	}
	if status < 400 || method == http.MethodHead {
		return
	}
	_, body, _ := strings.Cut(string(answer), "\r\n\r\n")
	var env struct {
		Error *struct{ Code, Message string } `json:"error"`
		Meta  struct {
			RequestID string `json:"request_id"`
		} `json:"meta"`
	}
	if err := json.Unmarshal([]byte(body), &env); err != nil || env.Error == nil || env.Error.Code == "" ||
		env.Error.Message == "" || env.Meta.RequestID == "" {
		t.Fatalf("%q: answered %d without the envelope: %q", raw, status, answer)
	}
}

// checkClientLogs fails t if the log lines written for raw hold key or a
// panic, are not JSON, or hold a control character in a value even
// escaped (a log viewer that shows values as they are prints it raw:
// httpserver.LoggableClientValue).
func checkClientLogs(t *testing.T, raw, lines, key string) {
	t.Helper()
	switch {
	case strings.Contains(lines, key):
		t.Fatalf("%q: the logs hold the key: %s", raw, lines)
	case strings.Contains(lines, "panic while serving"):
		t.Fatalf("%q: the gateway panicked: %s", raw, lines)
	}
	for line := range strings.Lines(lines) {
		var fields map[string]any
		if err := json.Unmarshal([]byte(line), &fields); err != nil {
			t.Fatalf("%q: a log line is no JSON (%v): %q", raw, err, line)
		}
		for name, v := range fields {
			if s, ok := v.(string); ok && strings.ContainsFunc(s, unicode.IsControl) {
				t.Fatalf("%q: the log line's %s holds a control character: %q", raw, name, line)
			}
		}
	}
}
