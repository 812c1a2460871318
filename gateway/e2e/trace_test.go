package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/pkg/tracestore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fixture is one owner with seeded items, a read key and a write key.
type fixture struct {
	owner             string
	readKey, writeKey string
}

func newFixture(t *testing.T, pool *pgxpool.Pool) fixture {
	t.Helper()
	ctx := context.Background()
	var owner string
	if err := pool.QueryRow(ctx, "INSERT INTO owners (name) VALUES ('e2e') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO platforms (id) VALUES ('e2e-market')"); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Seed(ctx, pool, owner, 50, 1); err != nil {
		t.Fatal(err)
	}
	key := func(platform *string, scopes ...string) string {
		secret, prefix, err := apikey.Generate(scopes)
		if err != nil {
			t.Fatal(err)
		}
		hash := apikey.HashOf(secret)
		_, err = pool.Exec(ctx, `INSERT INTO api_keys (owner_id, platform_id, prefix, hash, scopes) VALUES ($1, $2, $3, $4, $5)`,
			owner, platform, prefix, hash[:], scopes)
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	platform := "e2e-market"
	return fixture{owner: owner, readKey: key(nil, "export:read"), writeKey: key(&platform, "sales:write")}
}

// call sends one request and returns the status and decoded envelope.
func call(t *testing.T, method, url, apiKey, body string, headers map[string]string) (int, envelope.Parsed, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if apiKey != "" {
		req.Header.Set("X-API-Key", apiKey)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env envelope.Parsed
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatalf("%s %s: body is not an envelope: %q", method, url, raw)
	}
	return resp.StatusCode, env, resp.Header
}

// waitForTrace polls until the trace holds a server span of service and a
// span from every service in want, or gives up after 15 s.
func waitForTrace(s *stack, traceID string, services ...string) []tracestore.Span {
	deadline := time.Now().Add(15 * time.Second)
	for {
		spans := s.traces.Trace(traceID)
		seen := map[string]bool{}
		for _, sp := range spans {
			if sp.Kind == "SPAN_KIND_SERVER" {
				seen[sp.Service] = true
			}
		}
		all := true
		for _, svc := range services {
			all = all && seen[svc]
		}
		if all || time.Now().After(deadline) {
			return spans
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestOneTracePerRequestWhoseIDIsTheRequestID(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))

	status, list, hdr := call(t, "GET", s.baseURL+"/export/items?limit=3", fx.readKey, "", nil)
	if status != 200 {
		t.Fatalf("GET /export/items = %d %+v, want 200", status, list.Error)
	}
	var items []struct{ ID string }
	if err := json.Unmarshal(list.Data, &items); err != nil || len(items) == 0 {
		t.Fatalf("list data = %s, want items", list.Data)
	}
	status, confirm, _ := call(t, "POST", s.baseURL+"/export/items/"+items[0].ID+"/sales/confirm", fx.writeKey,
		`{"external_order_id":"e2e-1"}`, map[string]string{"Idempotency-Key": "e2e-confirm-1"})
	if status != 200 {
		t.Fatalf("confirm = %d %+v, want 200", status, confirm.Error)
	}
	const wsKey = "WSKEY-e2e-0123456789ABCDEFGHIJKLMN"
	status, shop, _ := call(t, "POST", s.baseURL+"/sync/prestashop/schema", "",
		`{"base_url":"https://127.0.0.1/shop","ws_key":"`+wsKey+`"}`, nil)
	if status != 400 || shop.Error == nil || shop.Error.Code != "base_url_not_allowed" {
		t.Fatalf("shop schema with a loopback address = %d %+v, want 400 base_url_not_allowed\n%s", status, shop.Error, s.logs["shop-schema"])
	}
	status, refused, refusedHdr := call(t, "GET", s.baseURL+"/export/items", "cxr_not-a-key", "", nil)
	if status != 401 || refusedHdr.Get("X-Error-Code") != "unauthenticated" {
		t.Fatalf("GET with a bad key = %d, X-Error-Code %q; want 401 unauthenticated", status, refusedHdr.Get("X-Error-Code"))
	}

	if hdr.Get("X-Request-Id") != list.Meta.RequestID {
		t.Errorf("X-Request-Id = %q, meta.request_id = %q; want equal", hdr.Get("X-Request-Id"), list.Meta.RequestID)
	}
	for _, tc := range []struct {
		name, requestID, service string
	}{
		{"list", list.Meta.RequestID, "export-reader"},
		{"confirm", confirm.Meta.RequestID, "sales-writer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := waitForTrace(s, tc.requestID, "gateway", tc.service)
			checkTrace(t, spans, tc.requestID, tc.service)
			for _, process := range []string{"gateway", tc.service} {
				line := checkAccessLog(t, s.logs[process].String(), tc.requestID, "")
				checkLineNamesItsSpan(t, line, spans, process, fx.owner)
			}
		})
	}

	// SQL spans hold the statements, not the values bound to them: the
	// confirm's order id and Idempotency-Key are arguments of the writer's.
	for _, sp := range s.traces.Trace(confirm.Meta.RequestID) {
		for k, v := range sp.Attributes {
			if isSQL(sp) && (strings.Contains(v, "e2e-confirm-1") || strings.Contains(v, "e2e-1")) {
				t.Errorf("SQL span %q of %s: %s = %q holds a value of the request", sp.Name, sp.Service, k, v)
			}
		}
	}
	secrets := []string{fx.readKey, fx.writeKey, wsKey}
	time.Sleep(300 * time.Millisecond) // let the last batches arrive
	for _, sp := range s.traces.All() {
		raw, _ := json.Marshal(sp)
		for _, secret := range secrets {
			if strings.Contains(string(raw), secret) {
				t.Errorf("span %q of %s contains a secret", sp.Name, sp.Service)
			}
		}
	}
	for name, logs := range s.logs {
		for _, secret := range secrets {
			if strings.Contains(logs.String(), secret) {
				t.Errorf("the %s log contains a secret", name)
			}
		}
	}
	checkAccessLog(t, s.logs["gateway"].String(), list.Meta.RequestID, "")
	checkAccessLog(t, s.logs["export-reader"].String(), list.Meta.RequestID, "")
	// A failed call found by its request id says why it failed: the code
	// of the service's answer in both access lines and server spans, and
	// the gateway's own refusal in its line.
	checkAccessLog(t, s.logs["gateway"].String(), shop.Meta.RequestID, "base_url_not_allowed")
	checkAccessLog(t, s.logs["shop-schema"].String(), shop.Meta.RequestID, "base_url_not_allowed")
	servers := 0
	for _, sp := range waitForTrace(s, shop.Meta.RequestID, "gateway", "shop-schema") {
		if sp.Kind != "SPAN_KIND_SERVER" {
			continue
		}
		servers++
		// error.type is for failures: a 400 is the client's.
		if sp.Attributes["app.error_code"] != "base_url_not_allowed" || sp.Attributes["error.type"] != "" {
			t.Errorf("server span of %s for the refused shop call: app.error_code = %q, error.type = %q; want base_url_not_allowed and none",
				sp.Service, sp.Attributes["app.error_code"], sp.Attributes["error.type"])
		}
	}
	if servers != 2 {
		t.Errorf("refused shop call: %d server spans, want the gateway's and shop-schema's", servers)
	}
	checkAccessLog(t, s.logs["gateway"].String(), refused.Meta.RequestID, "unauthenticated")
}

// checkTrace asserts the shape of one request's trace: the gateway's server
// span is the root, the proxy hop is its descendant client span, the
// service's server span is a child of that client span, and the service ran
// SQL under it.
func checkTrace(t *testing.T, spans []tracestore.Span, requestID, service string) {
	t.Helper()
	byID := map[string]tracestore.Span{}
	for _, sp := range spans {
		if sp.TraceID != requestID {
			t.Fatalf("span %q has trace id %s, want %s", sp.Name, sp.TraceID, requestID)
		}
		byID[sp.SpanID] = sp
	}
	var root, serviceSpan *tracestore.Span
	roots, sql := 0, 0
	for i, sp := range spans {
		switch {
		case sp.ParentID == "":
			roots++
			root = &spans[i]
		case sp.Service == service && sp.Kind == "SPAN_KIND_SERVER":
			serviceSpan = &spans[i]
		}
		if sp.Service == service && sp.Kind == "SPAN_KIND_CLIENT" && isSQL(sp) {
			sql++
		}
	}
	if roots != 1 || root.Service != "gateway" || root.Kind != "SPAN_KIND_SERVER" {
		t.Fatalf("trace %s has %d roots (first %+v), want exactly one: the gateway's server span", requestID, roots, root)
	}
	// Only sales keys are bound to a platform; a read's span names none
	// rather than an empty one.
	if _, named := root.Attributes["platform.id"]; named != (service == "sales-writer") {
		t.Errorf("gateway span of a request to %s: platform.id present = %v, attributes %v", service, named, root.Attributes)
	}
	if serviceSpan == nil {
		t.Fatalf("trace %s has no server span of %s: %v", requestID, service, names(spans))
	}
	proxy, ok := byID[serviceSpan.ParentID]
	if !ok || proxy.Service != "gateway" || proxy.Kind != "SPAN_KIND_CLIENT" {
		t.Errorf("parent of the %s server span = %+v, want the gateway's proxy client span", service, proxy)
	}
	// The proxy span names the instance it reached, and its answer.
	if proxy.Attributes["server.address"] == "" || proxy.Attributes["server.port"] == "" ||
		proxy.Attributes["http.response.status_code"] == "" {
		t.Errorf("proxy span attributes %v, want server.address, server.port and http.response.status_code", proxy.Attributes)
	}
	if sql == 0 {
		t.Errorf("trace %s has no SQL span of %s: %v", requestID, service, names(spans))
	}
}

func isSQL(sp tracestore.Span) bool {
	for k := range sp.Attributes {
		if strings.HasPrefix(k, "db.") {
			return true
		}
	}
	return false
}

func names(spans []tracestore.Span) []string {
	var out []string
	for _, sp := range spans {
		out = append(out, sp.Service+":"+sp.Kind+":"+sp.Name)
	}
	return out
}

// checkAccessLog finds the access line of the request in a JSON log, with
// errorCode as its error_code ("": none), and returns it (nil if none).
func checkAccessLog(t *testing.T, logs, requestID, errorCode string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec["msg"] == "request" && rec["request_id"] == requestID {
			if rec["method"] == nil || rec["status"] == nil || rec["route"] == nil || rec["duration_ms"] == nil {
				t.Errorf("access line %s lacks method, status, route or duration", line)
			}
			if got, _ := rec["error_code"].(string); got != errorCode {
				t.Errorf("access line %s: error_code %q, want %q", line, got, errorCode)
			}
			return rec
		}
	}
	t.Errorf("no access line with request_id %s in:\n%s", requestID, logs)
	return nil
}

// checkLineNamesItsSpan: the access line of process leads to its server
// span in the request's trace (trace_id, span_id; issue 7's access line)
// and names the key's owner.
func checkLineNamesItsSpan(t *testing.T, line map[string]any, spans []tracestore.Span, process, owner string) {
	t.Helper()
	if line == nil {
		return
	}
	var server *tracestore.Span
	for i, sp := range spans {
		if sp.Service == process && sp.Kind == "SPAN_KIND_SERVER" {
			server = &spans[i]
		}
	}
	if server == nil {
		t.Errorf("no server span of %s in %v", process, names(spans))
		return
	}
	if line["trace_id"] != server.TraceID || line["span_id"] != server.SpanID || line["owner_id"] != owner {
		t.Errorf("%s access line: trace_id %v, span_id %v, owner_id %v; want its server span's %s, %s and owner %s",
			process, line["trace_id"], line["span_id"], line["owner_id"], server.TraceID, server.SpanID, owner)
	}
}

// dsnOf returns the connection string of pool's database.
func dsnOf(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	return pool.Config().ConnString()
}
