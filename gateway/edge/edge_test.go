package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/httpserver"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/redisclient"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"
)

func TestErrorAnswersAreEnvelopes(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{
		"DATABASE_URL":             dsn,
		"EXPORT_READER_URLS":       reader.URL,
		"SALES_WRITER_URLS":        brokenUpstream(t, new(atomic.Int64)).URL,
		"SHOP_SCHEMA_URLS":         slowUpstream(t, 3*time.Second).URL,
		"UPSTREAM_READ_TIMEOUT":    "300ms",
		"RATE_LIMIT_AUTH_FAILURES": "1000-M",
	})
	down := gatewaytest.Start(t, map[string]string{
		"DATABASE_URL":       dsn,
		"EXPORT_READER_URLS": closedURL(t),
	})
	items := gw.URL + "/v1/export/items"
	confirm := gw.URL + "/v1/export/items/coin-1/sales/confirm"
	tests := []struct {
		name    string
		method  string
		url     string
		headers map[string]string
		body    string
		status  int
		code    string
	}{
		{"missing key", "GET", items, nil, "", 401, "unauthenticated"},
		{"malformed key", "GET", items, map[string]string{"X-API-Key": "cxr_nope"}, "", 401, "unauthenticated"},
		{"unknown key", "GET", items, map[string]string{"X-API-Key": k.unknown}, "", 401, "unauthenticated"},
		{"revoked key", "GET", items, map[string]string{"X-API-Key": k.revoked}, "", 401, "unauthenticated"},
		{"key in query", "GET", items + "?api_key=" + k.read, nil, "", 401, "unauthenticated"},
		{"key in path", "GET", items + "/" + k.read, map[string]string{"X-API-Key": k.read}, "", 401, "unauthenticated"},
		{"key as a bare query name", "GET", items + "?" + k.write, map[string]string{"X-API-Key": k.read}, "", 401, "unauthenticated"},
		{"key inside a path segment", "GET", items + "/x" + k.read + ".json", map[string]string{"X-API-Key": k.read}, "", 401, "unauthenticated"},
		{"key inside a query value", "GET", items + "?updated_after=x" + k.read, map[string]string{"X-API-Key": k.read}, "", 401, "unauthenticated"},
		{"read key on a sales route", "POST", confirm, map[string]string{"X-API-Key": k.read}, "{}", 403, "forbidden"},
		{"sales key without platform", "POST", confirm, map[string]string{"X-API-Key": k.noPlatform}, "{}", 403, "platform_required"},
		{"write key on a read route", "GET", items, map[string]string{"X-API-Key": k.write}, "", 403, "forbidden"},
		{"unknown route", "GET", gw.URL + "/v1/nope", nil, "", 404, "not_found"},
		// Spec 9: the version is part of the base address; no route
		// answers without it or under another.
		{"route without its version", "GET", gw.URL + "/export/items", map[string]string{"X-API-Key": k.read}, "", 404, "not_found"},
		{"route of another version", "GET", gw.URL + "/v2/export/items", map[string]string{"X-API-Key": k.read}, "", 404, "not_found"},
		{"version in other case", "GET", gw.URL + "/V1/export/items", map[string]string{"X-API-Key": k.read}, "", 404, "not_found"},
		{"unknown deep route", "GET", items + "/a/b", map[string]string{"X-API-Key": k.read}, "", 404, "not_found"},
		// Spec 4.4: item_id is required; an empty one names no route.
		{"item route without an id", "GET", items + "/", map[string]string{"X-API-Key": k.read}, "", 404, "not_found"},
		// Spec 4.2: the platform segment "is written exactly as given".
		{"shop platform in other case", "POST", gw.URL + "/v1/sync/PrestaShop/schema", nil, "{}", 404, "not_found"},
		{"route in other case", "GET", gw.URL + "/v1/Export/items", map[string]string{"X-API-Key": k.read}, "", 404, "not_found"},
		{"wrong method", "DELETE", items + "/coin-1", nil, "", 405, "method_not_allowed"},
		{"unknown method", "FOO", items + "/coin-1", nil, "", 405, "method_not_allowed"},
		{"method in lower case", "get", gw.URL + "/v1/nope", nil, "", 404, "not_found"},
		{"headers too large", "GET", items, map[string]string{"X-Padding": strings.Repeat("p", 9000)}, "", 431, "headers_too_large"},
		{"URL too long", "GET", items + "?lang=" + strings.Repeat("u", 9000), nil, "", 431, "headers_too_large"},
		{"body too large", "POST", confirm, map[string]string{"X-API-Key": k.write}, strings.Repeat("x", 65<<10), 413, "payload_too_large"},
		{"body far too large", "POST", confirm, map[string]string{"X-API-Key": k.write}, strings.Repeat("x", 2<<20), 413, "payload_too_large"},
		{"upstream drops the connection", "POST", confirm, map[string]string{"X-API-Key": k.write}, "{}", 502, "bad_gateway"},
		{"compressed body", "POST", confirm, map[string]string{"X-API-Key": k.write, "Content-Encoding": "gzip"}, "\x1f\x8b", 415, "unsupported_content_encoding"},
		{"identity body", "POST", confirm, map[string]string{"X-API-Key": k.write, "Content-Encoding": "Identity"}, "{}", 502, "bad_gateway"},
		{"empty Content-Encoding", "POST", confirm, map[string]string{"X-API-Key": k.write, "Content-Encoding": " "}, "{}", 502, "bad_gateway"},
		{"compressed, no body", "GET", down.URL + "/v1/export/items", map[string]string{"X-API-Key": k.read, "Content-Encoding": "gzip"}, "", 503, "upstream_unavailable"},
		{"upstream down", "GET", down.URL + "/v1/export/items", map[string]string{"X-API-Key": k.read}, "", 503, "upstream_unavailable"},
		{"upstream too slow", "POST", gw.URL + "/v1/sync/prestashop/schema", nil, "{}", 504, "upstream_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(tt.body)
			if len(tt.body) > 1<<20 {
				// Only the length is declared: the gateway refuses on it
				// unread and closes, and a client still writing the body
				// would race that close (a broken pipe, not the answer).
				body = newStalledBody(int64(len(tt.body)))
			}
			r := do(t, tt.method, tt.url, tt.headers, body)
			checkEnvelope(t, r)
			if r.Status != tt.status || r.Env.Error == nil || r.Env.Error.Code != tt.code {
				t.Fatalf("%s %s = %d %s, want %d with code %s", tt.method, tt.name, r.Status, r.Body, tt.status, tt.code)
			}
			if strings.Contains(string(r.Body), "127.0.0.1") || strings.Contains(string(r.Body), "dial") {
				t.Errorf("body %s shows an internal address or a raw error", r.Body)
			}
			if got := r.Header.Get("X-Error-Code"); got != tt.code {
				t.Errorf("X-Error-Code = %q, want %q", got, tt.code)
			}
			if tt.status == 415 && r.Header.Get("Accept-Encoding") != "identity" {
				t.Errorf("Accept-Encoding = %q, want identity", r.Header.Get("Accept-Encoding"))
			}
			if tt.status == 503 && r.Header.Get("Retry-After") != "1" {
				t.Errorf("Retry-After = %q, want 1", r.Header.Get("Retry-After"))
			}
			if tt.status == 405 && r.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q, want GET, HEAD", r.Header.Get("Allow"))
			}
		})
	}
	// Every 401 of a key that did not pass has the same body but for the
	// request id: none tells a malformed key from an unknown or revoked one.
	// (A key in the URL is told why: its owner must revoke it.)
	var bodies []string
	for _, tt := range tests[:4] {
		r := do(t, tt.method, tt.url, tt.headers, nil)
		bodies = append(bodies, strings.Replace(string(r.Body), r.Env.Meta.RequestID, "ID", 1))
	}
	for i, b := range bodies[1:] {
		if diff := cmp.Diff(bodies[0], b); diff != "" {
			t.Errorf("401 body of %q differs from %q (-want +got):\n%s", tests[i+1].name, tests[0].name, diff)
		}
	}
	if strings.Contains(gw.Logs.String(), k.read) || strings.Contains(gw.Logs.String(), k.write) {
		t.Error("an API key appears in the gateway's logs")
	}
}

func TestProxySendsOnlySignedIdentity(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	r := do(t, "GET", gw.URL+"/v1/export/items/coin%201?lang=RUS&limit=2", map[string]string{
		"X-API-Key":         k.read,
		"X-Owner-Id":        k.ownerB,
		"X-Identity-Owner":  k.ownerB,
		"X-Identity-Scopes": "sales:write",
		"X-Platform-Id":     "evil",
		"X-Forwarded-For":   "10.0.0.1",
		"Cookie":            "session=1",
		"traceparent":       "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"Idempotency-Key":   "idem-1",
		"Accept-Language":   "ru",
		"X-Internal-Admin":  "true",
		"X-Request-Id":      "client-chosen",
	}, nil)
	checkEnvelope(t, r)
	if r.Status != 200 {
		t.Fatalf("GET with a read key = %d %s, want 200", r.Status, r.Body)
	}
	s := decodeSeen(t, r)
	if s.Identity.OwnerID != k.ownerA || s.Identity.KeyID != k.readID || s.Identity.RequestID != r.Env.Meta.RequestID {
		t.Errorf("upstream identity = %+v, want owner %s, key %s, request id %s", s.Identity, k.ownerA, k.readID, r.Env.Meta.RequestID)
	}
	if diff := cmp.Diff([]string{"export:read"}, s.Identity.Scopes); diff != "" {
		t.Errorf("upstream scopes (-want +got):\n%s", diff)
	}
	if s.Path != "/v1/export/items/coin%201?lang=RUS&limit=2" {
		t.Errorf("upstream path = %q, want the original path and query", s.Path)
	}
	for _, h := range []string{"X-Api-Key", "X-Owner-Id", "X-Platform-Id", "Cookie", "X-Internal-Admin", "X-Request-Id"} {
		if v, ok := s.Headers[h]; ok {
			t.Errorf("upstream received %s: %q, want it stripped", h, v)
		}
	}
	if got := s.Headers["X-Forwarded-For"]; len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("upstream X-Forwarded-For = %q, want the client's address only", got)
	}
	if tp := s.Headers["Traceparent"]; len(tp) != 1 || !strings.Contains(tp[0], r.Env.Meta.RequestID) {
		t.Errorf("upstream traceparent = %q, want the gateway's trace %s", tp, r.Env.Meta.RequestID)
	}
	if r.Env.Meta.RequestID == "0af7651916cd43dd8448eb211c80319c" {
		t.Error("the gateway adopted the client's traceparent as request id")
	}
	for _, h := range []string{"Idempotency-Key", "Accept-Language"} {
		if len(s.Headers[h]) != 1 {
			t.Errorf("upstream lacks %s, want it forwarded", h)
		}
	}
	// The upstream's own Content-Encoding passes through untouched.
	gz := do(t, "GET", gw.URL+"/v1/export/items?gzip=1", map[string]string{"X-API-Key": k.read, "Accept-Encoding": "gzip"}, nil)
	if gz.Header.Get("Content-Encoding") != "gzip" {
		t.Errorf("Content-Encoding = %q, want the upstream's gzip kept", gz.Header.Get("Content-Encoding"))
	}
}

// A body sent without Content-Type reaches the service without one, and
// one sent with it keeps it: fasthttp's client added
// application/octet-stream, so sales-writer refused a type the client
// never sent (found with Python requests' data=, which sends none).
func TestContentTypeIsForwardedAsSent(t *testing.T) {
	dsn, _, k := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SALES_WRITER_URLS": echoUpstream(t, "writer", nil).URL})
	confirm := gw.URL + "/v1/export/items/coin-1/sales/confirm"
	for _, sent := range []string{"", "application/json", "text/plain;charset=UTF-8"} {
		headers := map[string]string{"X-API-Key": k.write, "Idempotency-Key": "ct-" + sent}
		if sent != "" {
			headers["Content-Type"] = sent
		}
		r := do(t, "POST", confirm, headers, strings.NewReader(`{"external_order_id":"o"}`))
		if r.Status != 200 {
			t.Fatalf("confirm with Content-Type %q = %d %s, want 200", sent, r.Status, r.Body)
		}
		var want []string
		if sent != "" {
			want = []string{sent}
		}
		if got := decodeSeen(t, r).Headers["Content-Type"]; !cmp.Equal(got, want) {
			t.Errorf("confirm sent with Content-Type %q reached the service with %q, want %q", sent, got, want)
		}
	}
}

func TestRevocationAppliesWithinOneSecond(t *testing.T) {
	dsn, pool, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"KEY_CACHE_TTL": "1h"})
	headers := map[string]string{"X-API-Key": k.read}
	for i := 0; i < 2; i++ { // the second answer comes from the cache
		if r := do(t, "GET", gw.URL+"/v1/export/items", headers, nil); r.Status != 200 {
			t.Fatalf("GET before revocation = %d, want 200", r.Status)
		}
	}
	// What `exportctl key revoke` does.
	if _, err := pool.Exec(context.Background(), `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, k.readID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	r := do(t, "GET", gw.URL+"/v1/export/items", headers, nil)
	checkEnvelope(t, r)
	if r.Status != 401 {
		t.Fatalf("GET 1s after revocation = %d, want 401", r.Status)
	}
}

func TestRateLimits(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"RATE_LIMIT_EXPORT_READ": "3-M", "RATE_LIMIT_AUTH_FAILURES": "2-M", "RATE_LIMIT_ANONYMOUS": "100-M",
		// The key must stay cached however slow the machine is: the test is
		// about a cached key passing while its IP is over the failure budget.
		"KEY_CACHE_TTL": "1h", "KEY_CACHE_UNHEARD_TTL": "1h"})
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" { // the gateway's probe
			envelope.WriteData(w, http.StatusOK, map[string]string{"status": "ok"}, envelope.Meta{})
			return
		}
		w.Header().Set("Retry-After", "1")
		envelope.WriteError(w, http.StatusTooManyRequests, "rate_limited", "too many shop schema reads in progress", "")
	}))
	t.Cleanup(shop.Close)
	busy := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": shop.URL})
	items := gw.URL + "/v1/export/items"
	for i := 0; i < 3; i++ {
		r := do(t, "GET", items, map[string]string{"X-API-Key": k.read}, nil)
		if r.Status != 200 {
			t.Fatalf("request %d of 3 = %d, want 200", i+1, r.Status)
		}
		want := map[string]string{"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": strconv.Itoa(2 - i)}
		for h, v := range want {
			if got := r.Header.Get(h); got != v {
				t.Errorf("request %d: %s = %q, want %q", i+1, h, got, v)
			}
		}
	}
	r := do(t, "GET", items, map[string]string{"X-API-Key": k.read}, nil)
	checkEnvelope(t, r)
	if r.Status != 429 || r.Env.Error.Code != "rate_limited" {
		t.Fatalf("4th request on 3-M = %d %s, want 429 rate_limited", r.Status, r.Body)
	}
	retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 61 {
		t.Errorf("Retry-After = %q, want whole seconds in 1..61", r.Header.Get("Retry-After"))
	}
	reset, _ := strconv.ParseInt(r.Header.Get("X-Ratelimit-Reset"), 10, 64)
	if reset < time.Now().Unix() {
		t.Errorf("X-RateLimit-Reset = %d, want a future Unix time", reset)
	}
	// Another owner's key has its own budget.
	if r := do(t, "GET", items, map[string]string{"X-API-Key": k.readB}, nil); r.Status != 200 {
		t.Errorf("owner B after owner A hit its limit = %d, want 200", r.Status)
	}
	// Failed authentications are limited per client IP.
	bad := map[string]string{"X-API-Key": "cxr_guess"}
	for i, want := range []int{401, 401, 429} {
		if r := do(t, "GET", items, bad, nil); r.Status != want {
			t.Errorf("failed authentication %d = %d, want %d", i+1, r.Status, want)
		}
	}
	// Over its failure budget, the IP's unknown keys are not looked up, but a
	// key already cached still works.
	r = do(t, "GET", items, map[string]string{"X-API-Key": k.unknown}, nil)
	if r.Status != 429 || r.Header.Get("Retry-After") == "" {
		t.Errorf("unknown key from an IP over its failure budget = %d (Retry-After %q), want 429 with Retry-After",
			r.Status, r.Header.Get("Retry-After"))
	}
	// Such a 429 says why, to the client and in the access line: the key
	// was not checked, its address being over its guess budget.
	if r.Env.Error == nil || !strings.Contains(r.Env.Error.Message, "failed authentications from this address") {
		t.Errorf("429 of a key not looked up: %s, want a message that names the failed-authentication budget", r.Body)
	}
	if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); !strings.Contains(line, `"auth_failure":"throttled"`) ||
		!strings.Contains(line, `"rate_limit_class":"auth_guesses"`) {
		t.Errorf("access line of that 429 = %s, want auth_failure throttled and rate_limit_class auth_guesses", line)
	}
	if r := do(t, "GET", items, map[string]string{"X-API-Key": k.readB}, nil); r.Status != 200 {
		t.Errorf("cached key from an IP over its failure budget = %d, want 200", r.Status)
	}
	// A service's own 429 (shop-schema's reads in flight) carries its
	// Retry-After and none of the gateway's X-RateLimit-* headers, whose
	// Remaining would contradict it.
	if r := do(t, "POST", busy.URL+"/v1/sync/prestashop/schema", nil, strings.NewReader("{}")); r.Status != 429 ||
		r.Header.Get("Retry-After") != "1" || r.Header.Get("X-Ratelimit-Remaining") != "" {
		t.Errorf("service's 429 = %d with Retry-After %q and X-RateLimit-Remaining %q, want 429, 1 and none",
			r.Status, r.Header.Get("Retry-After"), r.Header.Get("X-Ratelimit-Remaining"))
	}
	// Health is limited per IP, separately.
	if r := do(t, "GET", gw.URL+"/v1/health", nil, nil); r.Status != 200 || r.Header.Get("X-Ratelimit-Limit") != "100" {
		t.Errorf("health = %d with X-RateLimit-Limit %q, want 200 with 100", r.Status, r.Header.Get("X-Ratelimit-Limit"))
	}
}

// A revoked key is answered as any failed authentication (401, then 429
// past the address's budget: no client can tell it from an unknown one),
// but it is no guess: it spends none of the address's guess budget, so
// after a rotation, workers still on the old key do not get the new key's
// first call from the same address refused 429 (a probe: 10 stale workers
// locked a new key out for 61 s). Guesses still do.
func TestRevokedKeyIsNoGuess(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"RATE_LIMIT_AUTH_FAILURES": "2-M"})
	items := gw.URL + "/v1/export/items"
	for i, want := range []int{401, 401, 429, 429, 429} {
		if r := do(t, "GET", items, map[string]string{"X-API-Key": k.revoked}, nil); r.Status != want {
			t.Fatalf("revoked key, call %d = %d, want %d", i+1, r.Status, want)
		}
	}
	if r := do(t, "GET", items, map[string]string{"X-API-Key": k.read}, nil); r.Status != 200 {
		t.Fatalf("a new, uncached key after the revoked one's calls = %d %s, want 200", r.Status, r.Body)
	}
	for range 2 {
		do(t, "GET", items, map[string]string{"X-API-Key": k.unknown}, nil)
	}
	r := do(t, "GET", items, map[string]string{"X-API-Key": k.readB}, nil)
	if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); r.Status != 429 || !strings.Contains(line, `"auth_failure":"throttled"`) {
		t.Errorf("an uncached key after two guesses = %d (%s), want 429 throttled: not looked up", r.Status, line)
	}
}

// Guesses sent together from one address are looked up in PostgreSQL no
// more than its guess budget allows. A guess is taken from the budget only
// once its lookup has failed, and the budget alone let through every guess
// sent at once: 600 unknown keys sent together from one address were all
// looked up against a budget of 60. Here the lookups are held (api_keys
// locked) while the guesses arrive, so all of them are in flight together;
// those over the budget are answered 429 throttled at once, unlooked up.
func TestGuessesSentTogetherAreLookedUpWithinTheBudget(t *testing.T) {
	dsn, pool, _ := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"RATE_LIMIT_AUTH_FAILURES": "3-M", "KEY_LOOKUP_TIMEOUT": "30s"})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below; a second time is a no-op
	if _, err := tx.Exec(ctx, `LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	const guesses, budget = 10, 3
	type answer struct {
		status    int
		requestID string
		body      []byte
		err       error
	}
	answers := make(chan answer, guesses)
	for range guesses {
		key, _, err := apikey.Generate([]string{identity.ScopeExportRead})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			req, _ := http.NewRequest("GET", gw.URL+"/v1/export/items", nil)
			req.Header.Set("X-API-Key", key)
			resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- answer{status: resp.StatusCode, requestID: resp.Header.Get("X-Request-Id"), body: body, err: err}
		}()
	}
	// Those over the budget are answered while the lookups wait; without
	// the bound every one waits, and the lock is let go after a while.
	var got []answer
	for deadline := time.After(10 * time.Second); len(got) < guesses-budget; {
		select {
		case a := <-answers:
			got = append(got, a)
			continue
		case <-deadline:
		}
		break
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for len(got) < guesses {
		got = append(got, <-answers)
	}
	lookedUp, throttled := 0, 0
	for _, a := range got {
		if a.err != nil {
			t.Fatal(a.err)
		}
		line := accessLine(gw.Logs.String(), a.requestID)
		switch {
		case strings.Contains(line, `"auth_failure":"unknown"`):
			lookedUp++
		case a.status == 429 && strings.Contains(line, `"auth_failure":"throttled"`):
			throttled++
			// Named apart from the guess budget (auth_guesses, whose
			// Retry-After may be a minute), so that the request id tells
			// which of the two refused it: both read auth_failures.
			if !strings.Contains(line, `"rate_limit_class":"auth_guesses_in_lookup"`) {
				t.Errorf("access line of a guess over the keys in lookup = %s, want rate_limit_class auth_guesses_in_lookup", line)
			}
			// Nor does it tell the client of failed authentications,
			// which it has not had.
			if !bytes.Contains(a.body, []byte("being checked at once")) {
				t.Errorf("429 of a guess over the keys in lookup: %s, want a message naming the keys being checked at once", a.body)
			}
		default:
			t.Errorf("a guess answered %d, access line %s; want 401 unknown or 429 throttled", a.status, line)
		}
	}
	if lookedUp != budget || throttled != guesses-budget {
		t.Errorf("%d guesses sent together on a budget of %d: %d looked up, %d throttled; want %d and %d",
			guesses, budget, lookedUp, throttled, budget, guesses-budget)
	}
	limited := fmt.Sprintf(`gateway_ratelimit_decisions_total{backend="process",class="auth_guesses_in_lookup",decision="limited"} %d`, guesses-budget)
	if metrics := scrape(t, gw.AdminURL); !bytes.Contains(metrics, []byte(limited)) {
		t.Errorf("metrics lack %s:\n%s", limited, grep(metrics, "gateway_ratelimit_decisions_total"))
	}
}

// A key in the URL of a route that takes no key (spec 5: health, shop
// schema) is no failed login: health is served, the shop schema route is
// answered 400 invalid_parameter without being proxied (the key travels no
// further), and neither counts against the address's failure budget, which
// a monitor behind a shared address would otherwise use up for everyone.
func TestKeyInURLOfARouteWithoutKey(t *testing.T) {
	dsn, _, k := seed(t)
	var shopHits atomic.Int64
	echo := echoUpstream(t, "any", &shopHits)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"EXPORT_READER_URLS": echo.URL, "SHOP_SCHEMA_URLS": echo.URL, "RATE_LIMIT_AUTH_FAILURES": "1-M"})
	for i := range 3 {
		if r := do(t, "GET", gw.URL+"/v1/health?key="+k.read, nil, nil); r.Status != 200 {
			t.Fatalf("health with a key in its query, %d = %d %s, want 200", i+1, r.Status, r.Body)
		}
	}
	r := do(t, "POST", gw.URL+"/v1/sync/prestashop/schema?api_key="+k.read, map[string]string{"Content-Type": "application/json"}, strings.NewReader("{}"))
	checkEnvelope(t, r)
	if r.Status != 400 || r.Env.Error.Code != "invalid_parameter" || shopHits.Load() != 0 {
		t.Errorf("shop schema with a key in its query = %d %s (proxied %d times), want 400 invalid_parameter, not proxied",
			r.Status, r.Body, shopHits.Load())
	}
	if r := do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": k.readB}, nil); r.Status != 200 {
		t.Errorf("a key not yet cached, after those = %d %s, want 200 (no failed login was counted)", r.Status, r.Body)
	}
	if r := do(t, "GET", gw.URL+"/v1/export/items?key="+k.read, nil, nil); r.Status != 401 {
		t.Errorf("a route that takes a key, with one in its query = %d, want 401", r.Status)
	}
}

// The routes without a key (spec 4.1 "no authentication", 4.2 "no service
// API key is used or required", spec 5) answer a request carrying an
// X-API-Key header as one without: no 401 for a malformed, unknown or
// revoked key, none for two of them, and the shop schema call goes on
// anonymous, the key neither taken as its identity nor forwarded.
func TestRoutesWithoutAKeyIgnoreOneSent(t *testing.T) {
	dsn, _, k := seed(t)
	echo := echoUpstream(t, "shop", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": echo.URL,
		"RATE_LIMIT_AUTH_FAILURES": "1-M"})
	for _, key := range []string{"cxr_nope", k.unknown, k.revoked, k.read, k.write, k.read + ", " + k.write} {
		health := do(t, "GET", gw.URL+"/v1/health", map[string]string{"X-API-Key": key}, nil)
		checkEnvelope(t, health)
		if health.Status != 200 || health.Env.Error != nil {
			t.Errorf("GET /health with X-API-Key %.8s… = %d %s, want 200", key, health.Status, health.Body)
		}
		schema := do(t, "POST", gw.URL+"/v1/sync/prestashop/schema",
			map[string]string{"X-API-Key": key, "Content-Type": "application/json"}, strings.NewReader("{}"))
		checkEnvelope(t, schema)
		if schema.Status != 200 {
			t.Errorf("POST shop schema with X-API-Key %.8s… = %d %s, want it proxied (200 from the fake service)", key, schema.Status, schema.Body)
			continue
		}
		s := decodeSeen(t, schema)
		if !s.Identity.Anonymous() || s.Identity.KeyID != "" {
			t.Errorf("shop schema with X-API-Key %.8s…: the service got identity %+v, want anonymous", key, s.Identity)
		}
		if v, ok := s.Headers["X-Api-Key"]; ok {
			t.Errorf("shop schema: the service received X-API-Key %q, want it stripped", v)
		}
	}
}

// Each class of route counts against its own limit: running out of one
// (the shop schema route's, a write key's) leaves the others untouched.
func TestEachClassHasItsOwnLimit(t *testing.T) {
	dsn, _, k := seed(t)
	echo := echoUpstream(t, "any", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"EXPORT_READER_URLS": echo.URL, "SALES_WRITER_URLS": echo.URL, "SHOP_SCHEMA_URLS": echo.URL,
		"RATE_LIMIT_ANONYMOUS": "2-M", "RATE_LIMIT_SHOP_SCHEMA": "1-M", "RATE_LIMIT_SALES_WRITE": "1-M",
		"RATE_LIMIT_EXPORT_READ": "100-M"})
	schema := func() int {
		return do(t, "POST", gw.URL+"/v1/sync/prestashop/schema", nil, strings.NewReader("{}")).Status
	}
	health := func() int { return do(t, "GET", gw.URL+"/v1/health", nil, nil).Status }
	confirm := func(key string) int {
		return do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm",
			map[string]string{"X-API-Key": key, "Idempotency-Key": "k1"}, strings.NewReader("{}")).Status
	}
	read := func() int {
		return do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": k.read}, nil).Status
	}
	steps := []struct {
		name string
		call func() int
		want int
	}{
		{"shop schema 1 of 1", schema, 200},
		{"shop schema 2 of 1", schema, 429},
		{"health 1 of 2 after the shop schema's limit", health, 200},
		{"health 2 of 2", health, 200},
		{"health 3 of 2", health, 429},
		{"confirm 1 of 1", func() int { return confirm(k.write) }, 200},
		{"confirm 2 of 1", func() int { return confirm(k.write) }, 429},
		{"read after the write key's limit", read, 200},
	}
	for _, st := range steps {
		if got := st.call(); got != st.want {
			t.Errorf("%s = %d, want %d", st.name, got, st.want)
		}
	}
}

func TestRedisOutage(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	redis := testenv.StartRedis(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"REDIS_URL": redis.URL, "RATE_LIMIT_EXPORT_READ": "3-M"})
	items := gw.URL + "/v1/export/items"
	headers := map[string]string{"X-API-Key": k.read}
	if r := do(t, "GET", items, headers, nil); r.Status != 200 {
		t.Fatalf("GET with Redis up = %d, want 200", r.Status)
	}
	redis.Stop()
	for i := 0; i < 2; i++ {
		if r := do(t, "GET", items, headers, nil); r.Status != 200 {
			t.Fatalf("GET %d with Redis down = %d %s, want 200", i+1, r.Status, r.Body)
		}
	}
	if got := healthCheck(t, gw.URL, "redis"); got != "degraded" {
		t.Errorf("health redis with Redis down = %q, want degraded", got)
	}
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return healthCheck(t, gw.URL, "redis") == "ok" })
	// The new Redis is empty: three pass again, the fourth is limited.
	statuses := []int{}
	for i := 0; i < 4; i++ {
		statuses = append(statuses, do(t, "GET", items, headers, nil).Status)
	}
	if diff := cmp.Diff([]int{200, 200, 200, 429}, statuses); diff != "" {
		t.Errorf("statuses after Redis came back (-want +got):\n%s", diff)
	}
	metrics := scrape(t, gw.AdminURL)
	if !bytes.Contains(metrics, []byte(`gateway_ratelimit_decisions_total{backend="local",class="export_read",decision="allowed"} 2`)) {
		t.Errorf("metrics lack the two local decisions:\n%s", grep(metrics, "gateway_ratelimit"))
	}
}

// RATE_LIMIT_REDIS_TIMEOUT is the wait for Redis, above 100 ms too: a
// Redis paused for 300 ms under a 2 s timeout still decides, where the
// client's old fixed 100 ms I/O bound handed the decision to the
// in-process fallback.
func TestRedisTimeoutAbove100msIsHonoured(t *testing.T) {
	_, _, metrics := getWhileRedisPaused(t, "2s", 300)
	if !bytes.Contains(metrics, []byte(`gateway_ratelimit_decisions_total{backend="redis",class="export_read",decision="allowed"} 1`)) ||
		!bytes.Contains(metrics, []byte(`gateway_ratelimit_decisions_total{backend="local",class="export_read",decision="allowed"} 0`)) {
		t.Errorf("the decision was not Redis's:\n%s", grep(metrics, "gateway_ratelimit_decisions"))
	}
}

// A Redis that stops answering (paused past RATE_LIMIT_REDIS_TIMEOUT, as
// a stalled or overloaded server would be, not refusing as a stopped one
// does) holds no request beyond the timeout: the decision falls to the
// in-process fallback, and Redis decides again once it answers. The
// limiter's timeout and the Redis client's I/O bound (start) hold it:
// with both longer than the pause, the request waits for it and Redis
// decides (as TestRedisTimeoutAbove100msIsHonoured wants of a 2 s timeout).
func TestRedisStalledPastItsTimeoutDecidesInProcess(t *testing.T) {
	gw, k, metrics := getWhileRedisPaused(t, "100ms", 2000)
	if !bytes.Contains(metrics, []byte(`gateway_ratelimit_decisions_total{backend="local",class="export_read",decision="allowed"} 1`)) ||
		!bytes.Contains(metrics, []byte(`gateway_ratelimit_decisions_total{backend="redis",class="export_read",decision="allowed"} 0`)) {
		t.Fatalf("the decision under a paused Redis was not the fallback's:\n%s", grep(metrics, "gateway_ratelimit_decisions"))
	}
	waitFor(t, 15*time.Second, func() bool {
		do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": k.read}, nil)
		return !bytes.Contains(scrape(t, gw.AdminURL),
			[]byte(`gateway_ratelimit_decisions_total{backend="redis",class="export_read",decision="allowed"} 0`))
	})
}

// getWhileRedisPaused starts a gateway with RATE_LIMIT_REDIS_TIMEOUT
// timeout on a Redis of its own (a pause stalls every client), pauses that
// Redis for pauseMs, and sends one GET, which must be answered 200; it
// returns the gateway, the keys, and the gateway's metrics after it.
func getWhileRedisPaused(t *testing.T, timeout string, pauseMs int) (*gatewaytest.Server, keys, []byte) {
	t.Helper()
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	redis := testenv.StartRedis(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"REDIS_URL": redis.URL, "RATE_LIMIT_REDIS_TIMEOUT": timeout})
	admin, err := redisclient.Open(redis.URL, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", pauseMs).Err(); err != nil {
		t.Fatal(err)
	}
	if r := do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": k.read}, nil); r.Status != 200 {
		t.Fatalf("GET while Redis is paused for %d ms = %d %s, want 200", pauseMs, r.Status, r.Body)
	}
	return gw, k, scrape(t, gw.AdminURL)
}

// The admin port's net/http answers what it cannot read, and what its
// handler has no route for, with the envelope too, its request id in
// X-Request-Id and in the log: a request without Host (400 bad_request),
// and "OPTIONS *", which net/http would answer itself with an empty 200
// (the services' admin ports are the same, pkg/httpserver).
func TestAdminOddRequestsAreEnvelopes(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	for _, tt := range []struct {
		name, request string
		status        int
		code          string
	}{
		{"no Host", "GET /metrics HTTP/1.1\r\n\r\n", 400, "bad_request"},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, "not_found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t, gw.AdminURL)
			if _, err := io.WriteString(conn, tt.request); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var env envelope.Parsed
			if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != tt.status || env.Error == nil ||
				env.Error.Code != tt.code || env.Meta.RequestID == "" || resp.Header.Get("X-Request-Id") != env.Meta.RequestID {
				t.Fatalf("admin %q = %d %q (X-Request-Id %q), want %d %s with its request id",
					tt.request, resp.StatusCode, body, resp.Header.Get("X-Request-Id"), tt.status, tt.code)
			}
			if tt.status == 400 { // what the handler answers is not logged; what net/http could not read is
				waitFor(t, 5*time.Second, func() bool { return strings.Contains(gw.Logs.String(), env.Meta.RequestID) })
			}
		})
	}
}

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

func TestHealth(t *testing.T) {
	dsn, _, _ := seed(t)
	reader := echoUpstream(t, "reader", nil)
	writer := echoUpstream(t, "writer", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"SALES_WRITER_URLS": writer.URL + "," + closedURL(t), "SHOP_SCHEMA_URLS": closedURL(t),
		"UPSTREAM_PROBE_INTERVAL": "100ms"})
	want := map[string]string{"postgres": "ok", "redis": "ok", "export-reader": "ok",
		"sales-writer": "degraded", "shop-schema": "down"}
	var got healthBody
	waitFor(t, 5*time.Second, func() bool {
		got = health(t, gw.URL)
		return cmp.Equal(want, got.Checks)
	})
	if diff := cmp.Diff(want, got.Checks); diff != "" {
		t.Errorf("health checks (-want +got):\n%s", diff)
	}
	if got.Version != "1.3.1" || got.Status != "degraded" {
		t.Errorf("health = %+v, want version 1.3.1, status degraded", got)
	} // /metrics counts each upstream's instances up and out, for alerts
	// that must know which upstream is losing instances.
	metrics := scrape(t, gw.AdminURL)
	wantSeries(t, metrics, "gateway_upstream_instances",
		`gateway_upstream_instances{state="up",upstream="export-reader"} 1`,
		`gateway_upstream_instances{state="out",upstream="export-reader"} 0`,
		`gateway_upstream_instances{state="up",upstream="sales-writer"} 1`,
		`gateway_upstream_instances{state="out",upstream="sales-writer"} 1`,
		`gateway_upstream_instances{state="out",upstream="shop-schema"} 1`,
	)
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

func TestBurstStraddlingASecondBoundary(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"RATE_LIMIT_EXPORT_READ": "5-S"})
	// Start the burst just before a clock second ends: a fixed window would
	// admit 5 in each second, 10 in all.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1950 * time.Millisecond)))
	statuses := make(chan int, 10)
	for i := 0; i < 10; i++ {
		go func() {
			// Not do(): t.Fatal must not run outside the test goroutine.
			req, _ := http.NewRequest("GET", gw.URL+"/v1/export/items", nil)
			req.Header.Set("X-API-Key", k.read)
			resp, err := client.Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	passed := 0
	for i := 0; i < 10; i++ {
		if <-statuses == 200 {
			passed++
		}
	}
	if passed != 5 {
		t.Fatalf("a burst of 10 straddling a second boundary on 5-S let %d through, want 5", passed)
	}
}

func TestHeadIsServedLikeGet(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	for _, tt := range []struct {
		name, url, key string
		status         int
	}{
		{"health", gw.URL + "/v1/health", "", 200},
		{"item with a read key", gw.URL + "/v1/export/items/coin-1", k.read, 200},
		{"item without a key", gw.URL + "/v1/export/items/coin-1", "", 401},
		{"item with a write key", gw.URL + "/v1/export/items/coin-1", k.write, 403},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest("HEAD", tt.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.key != "" {
				req.Header.Set("X-API-Key", tt.key)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || len(body) != 0 {
				t.Errorf("HEAD = %d with %d body bytes, want %d and none", resp.StatusCode, len(body), tt.status)
			}
			if !hex32.MatchString(resp.Header.Get("X-Request-Id")) {
				t.Errorf("X-Request-Id = %q", resp.Header.Get("X-Request-Id"))
			}
		})
	}
}

func TestSeveralAPIKeysAreRefused(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	for _, order := range [][]string{{k.read, k.write}, {k.write, k.read}, {k.read, k.read}} {
		req, err := http.NewRequest("GET", gw.URL+"/v1/export/items/coin-1", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range order {
			req.Header.Add("X-API-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var env envelope.Parsed
		if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != 401 || env.Error == nil ||
			env.Error.Code != "unauthenticated" || !strings.Contains(env.Error.Message, "one X-API-Key") {
			t.Errorf("two X-API-Key headers = %d %s, want 401 unauthenticated asking for one", resp.StatusCode, body)
		}
	}
}

// TestClientChosenMethodsStayOutOfLogs: a method outside the known ones is
// logged as _OTHER, and so is a request that could not be read, not as the
// GET that fasthttp assumes by default.
func TestClientChosenMethodsStayOutOfLogs(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	r := do(t, "SECRETMETHOD", gw.URL+"/v1/health", nil, nil)
	checkEnvelope(t, r)
	if r.Status != 405 || r.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("SECRETMETHOD /v1/health = %d, Allow %q; want 405, GET, HEAD", r.Status, r.Header.Get("Allow"))
	}
	conn := dial(t, gw.URL)
	if _, err := io.WriteString(conn, "GARBAGE\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(conn)
	if !strings.Contains(string(answer), `"code":"bad_request"`) {
		t.Errorf("a malformed request got %q, want a bad_request envelope", answer)
	}
	// Its headers read (a POST), its body not: fasthttp has reset it.
	chunks := dial(t, gw.URL)
	if _, err := io.WriteString(chunks, "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\n"+
		"Transfer-Encoding: chunked\r\n\r\nzz\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if answer, _ := io.ReadAll(chunks); !strings.Contains(string(answer), " 400 ") || !strings.Contains(string(answer), `"code":"bad_request"`) {
		t.Errorf("an unreadable chunked body got %q, want 400 bad_request", answer)
	}
	waitFor(t, 2*time.Second, func() bool { return strings.Count(gw.Logs.String(), `"method":"_OTHER"`) >= 3 })
	logs := gw.Logs.String()
	if strings.Contains(logs, "SECRETMETHOD") {
		t.Error("the client's method token reached the logs")
	}
	if strings.Contains(logs, `"method":"GET","route":"unrouted"`) {
		t.Errorf("a request that could not be read is logged as a GET:\n%s", logs)
	}
	if n := strings.Count(logs, `"method":"_OTHER"`); n != 3 {
		t.Errorf("%d access lines with method _OTHER, want 3 (the unknown method and the two unreadable requests):\n%s", n, logs)
	}
}

// A 405 is named after the path it was sent to, the pattern alone (no
// method: it is none of the path's routes), in its access line and
// metrics, and a 404 unmatched: the label tells which known path is sent
// a wrong method.
func TestMethodNotAllowedIsNamedAfterItsPath(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	for _, tt := range []struct{ method, path, route string }{
		{"GET", "/v1/export/items/coin-1/sales/confirm", "/v1/export/items/{item_id}/sales/confirm"},
		{"FOO", "/v1/health", "/v1/health"},
		{"GET", "/v1/nothing", "unmatched"},
	} {
		r := do(t, tt.method, gw.URL+tt.path, nil, nil)
		checkEnvelope(t, r)
		if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); !strings.Contains(line, `"route":"`+tt.route+`"`) {
			t.Errorf("%s %s = %d, access line %s; want route %q", tt.method, tt.path, r.Status, line, tt.route)
		}
		series := `gateway_http_requests_total{route="` + tt.route + `",status_class="4xx"} 1`
		if metrics := scrape(t, gw.AdminURL); !bytes.Contains(metrics, []byte(series)) {
			t.Errorf("%s %s: metrics lack %s:\n%s", tt.method, tt.path, series, grep(metrics, "gateway_http_requests_total"))
		}
	}
}

// With UPSTREAM_RESOLVE_INTERVAL set, the gateway resolves an upstream's
// host name and sends to the addresses it resolves to, logging the change;
// requests keep being served throughout. (upstream's tests cover several
// replicas behind one name; the system resolver maps localhost to
// 127.0.0.1 here.)
func TestUpstreamNamesAreResolvedWhenAsked(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	port := reader.Listener.Addr().(*net.TCPAddr).Port
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"EXPORT_READER_URLS":        fmt.Sprintf("http://localhost:%d", port),
		"UPSTREAM_RESOLVE_INTERVAL": "100ms"})
	want := fmt.Sprintf(`"instances":["http://127.0.0.1:%d"]`, port)
	waitFor(t, 5*time.Second, func() bool { return strings.Contains(gw.Logs.String(), want) })
	if changes := grep([]byte(gw.Logs.String()), `"msg":"upstream instances changed"`); !strings.Contains(changes, `"upstream":"export-reader"`) {
		t.Errorf("no log of the change for export-reader; logs of changes:\n%s", changes)
	}
	for range 3 {
		if r := do(t, "GET", gw.URL+"/v1/export/items/coin-1", map[string]string{"X-API-Key": k.read}, nil); r.Status != 200 {
			t.Fatalf("GET through the resolved instance = %d %s, want 200", r.Status, r.Body)
		}
	}
	// The error series follow the instances: the address's are there, the
	// name's, which is no instance any more, are gone.
	resolved := fmt.Sprintf(`gateway_upstream_errors_total{kind="timeout",upstream="export-reader",upstream_instance="http://127.0.0.1:%d"} 0`, port)
	waitFor(t, 5*time.Second, func() bool { return bytes.Contains(scrape(t, gw.AdminURL), []byte(resolved)) })
	if named := fmt.Sprintf(`upstream_instance="http://localhost:%d"`, port); bytes.Contains(scrape(t, gw.AdminURL), []byte(named)) {
		t.Errorf("metrics keep series of %s, no instance since it was resolved:\n%s", named,
			grep(scrape(t, gw.AdminURL), "gateway_upstream_errors_total"))
	}
}

// The service is asked for the path and query the client sent, raw, so it
// serves the route the gateway authorized: fasthttp's rebuilt URI turned
// "a%2F..%2F..%2Fitems" (the item route here) into the list there. Paths
// the services' mux would clean or refuse are answered here.
func TestForwardedPathIsTheRoutedPath(t *testing.T) {
	dsn, _, k := seed(t)
	var hits atomic.Int64
	reader := echoUpstream(t, "reader", &hits)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL})
	tests := []struct {
		target string
		status int
		code   string // of an error
	}{
		{"/v1/export/items/a%2F..%2F..%2Fitems?limit=1", 200, ""},
		{"/v1/export/items/..%2F..%2F..%2Fhealthz", 200, ""},
		{"/v1/export/items/coin%2D1?lang=%ZZ&limit=%2B5", 200, ""},
		{"/v1/export/items/..", 404, "not_found"},
		{"/v1/export/items/.", 404, "not_found"},
		{"/v1/export/items/..?limit=1", 404, "not_found"},
		{"/v1/export/items/%ZZ", 400, "invalid_path"},
		{"/v1/export/items/coin%2", 400, "invalid_path"},
	}
	for _, tt := range tests {
		before := hits.Load()
		r := doRaw(t, gw.URL, "GET", tt.target, map[string]string{"X-API-Key": k.read})
		checkEnvelope(t, r)
		if tt.status != 200 {
			if r.Status != tt.status || r.Env.Error == nil || r.Env.Error.Code != tt.code {
				t.Errorf("GET %s = %d %s, want %d %s", tt.target, r.Status, r.Body, tt.status, tt.code)
			}
			if hits.Load() != before {
				t.Errorf("GET %s reached the service", tt.target)
			}
			continue
		}
		if s := decodeSeen(t, r); r.Status != 200 || s.Path != tt.target {
			t.Errorf("GET %s = %d, the service was asked for %q; want 200 and the path as sent", tt.target, r.Status, s.Path)
		}
	}
}

// doRaw sends one request with target written into the request line as it
// is (Go's client would refuse or re-encode some of them).
func doRaw(t *testing.T, baseURL, method, target string, headers map[string]string) response {
	t.Helper()
	conn := dial(t, baseURL)
	var req strings.Builder
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n", method, target)
	for k, v := range headers {
		fmt.Fprintf(&req, "%s: %s\r\n", k, v)
	}
	req.WriteString("\r\n")
	if _, err := conn.Write([]byte(req.String())); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // no answer fails, not hangs
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := response{Status: resp.StatusCode, Header: resp.Header, Body: b}
	if err := json.Unmarshal(b, &r.Env); err != nil {
		t.Fatalf("%s %s: body is not an envelope: %q", method, target, b)
	}
	return r
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
// method and path would read GET /).
func TestBodyTooLargeIsNamedAfterItsRoute(t *testing.T) {
	dsn, _, _ := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	confirm := "/v1/export/items/coin-1/sales/confirm"
	const route = `"method":"POST","route":"POST /v1/export/items/{item_id}/sales/confirm","status":413`
	json := map[string]string{"Content-Type": "application/json"}
	overLimit := strings.Repeat(" ", edge.BodyLimit+1)
	answers := map[string]response{
		"declared length": do(t, "POST", gw.URL+confirm, json, strings.NewReader(overLimit)),
		"Expect: 100-continue": doRaw(t, gw.URL, "POST", confirm, map[string]string{"Content-Type": "application/json",
			"Expect": "100-continue", "Content-Length": strconv.Itoa(edge.BodyLimit + 1)}),
	}
	for how, r := range answers {
		if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); r.Status != 413 || !strings.Contains(line, route) {
			t.Errorf("%s: %d, access line %s; want 413 with %s", how, r.Status, line, route)
		}
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
	sent := map[string]string{
		"nothing":           "",
		"half a head":       "GET /v1/health HTTP/1.1\r\nHo",
		"half a body":       halfABody,
		"half a body, shut": halfABody, // closed, not reset
		"half a chunked body": "POST /v1/sync/prestashop/schema HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"10\r\n{\"base_url\":\"htt",
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
			if strings.Contains(l, `"route":"unrouted"`) {
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
			conn := dial(t, gw.URL)
			req := fmt.Sprintf(head, tt.proto, tt.headers) + "\r\n" + tt.body + smuggled
			if _, err := conn.Write([]byte(req)); err != nil {
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

// accessLine is the gateway's access line of the request, from its logs.
func accessLine(logs, requestID string) string {
	for l := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(l, requestID) && strings.Contains(l, `"msg":"request"`) {
			return l
		}
	}
	return ""
}

// The gateway signs its health probes, so a service that would refuse
// every request's identity (another IDENTITY_SECRET) fails its probe: it is
// taken out and /v1/health shows it down, instead of looking healthy while
// every call through it is a 502.
func TestServiceWithAnotherSecretIsShownDown(t *testing.T) {
	dsn, _, _ := seed(t)
	verify := func(secret string) string {
		signer, err := identity.NewSigner(secret)
		if err != nil {
			t.Fatal(err)
		}
		srv := httpserver.New(httpserver.Config{Service: "reader", Log: slog.New(slog.NewJSONHandler(io.Discard, nil)), Signer: signer},
			http.NewServeMux())
		ts := httptest.NewServer(srv.Handler())
		t.Cleanup(ts.Close)
		return ts.URL
	}
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "UPSTREAM_PROBE_INTERVAL": "100ms",
		"EXPORT_READER_URLS": verify(gatewaytest.IdentitySecret), "SALES_WRITER_URLS": verify(gatewaytest.IdentitySecret + "-other")})
	waitFor(t, 5*time.Second, func() bool { return healthCheck(t, gw.URL, "sales-writer") == "down" })
	if got := healthCheck(t, gw.URL, "export-reader"); got != "ok" {
		t.Errorf("health of a service with the same secret = %q, want ok", got)
	}
	// The log says why, so on-call looks at the secret, not the database.
	if !strings.Contains(gw.Logs.String(), `"reason":"its health probe was answered 503 identity_refused"`) {
		t.Errorf("no log line names the identity refusal:\n%s", gw.Logs.String())
	}
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

// A client address may have RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT shop schema
// calls in flight, and no more: one address pointing the route at a shop
// that never answers cannot hold every slot of shop-schema. Another
// address is not affected, and a slot freed is taken again.
// The cap holds with RATE_LIMIT_ENABLED=false too: it guards
// shop-schema's slots, not a budget.
func TestShopSchemaCallsInFlightPerAddress(t *testing.T) {
	for _, limits := range []string{"true", "false"} {
		t.Run("RATE_LIMIT_ENABLED="+limits, func(t *testing.T) { testShopSchemaCallsInFlight(t, limits) })
	}
}

func testShopSchemaCallsInFlight(t *testing.T, limits string) {
	dsn, _, _ := seed(t)
	testSlotsHeld(t, slotsCase{
		settings: func(upstream string) map[string]string {
			return map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": upstream,
				"RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT": "2", "RATE_LIMIT_SHOP_SCHEMA": "1000-M", "RATE_LIMIT_ENABLED": limits,
				"GATEWAY_PROXY_HEADER": "X-Forwarded-For", "GATEWAY_TRUSTED_PROXIES": "127.0.0.1/32"}
		},
		holder: func(gw *gatewaytest.Server) []func() response {
			call := func(ip string) func() response {
				return func() response {
					return do(t, "POST", gw.URL+"/v1/sync/prestashop/schema",
						map[string]string{"X-Forwarded-For": ip, "Content-Type": "application/json"}, strings.NewReader(`{}`))
				}
			}
			return []func() response{call("203.0.113.7"), call("203.0.113.7"), call("203.0.113.7"), call("198.51.100.9")}
		},
		class: "shop_schema_in_flight", says: "from this client address",
	})
}

// An owner may have its share of RATE_LIMIT_OWNER_IN_FLIGHT requests in
// flight on the routes of one service, all of its keys together, and no
// more: the per-key rate limits let an owner with many keys queue more
// requests than the services serve, ahead of every other owner's (README,
// "Tenants sharing a stack"). Another owner is not affected, and a slot
// freed is taken again. The cap holds with RATE_LIMIT_ENABLED=false too:
// it bounds a queue, not a budget.
func TestOwnerRequestsInFlight(t *testing.T) {
	for _, limits := range []string{"true", "false"} {
		t.Run("RATE_LIMIT_ENABLED="+limits, func(t *testing.T) { testOwnerRequestsInFlight(t, limits) })
	}
}

func testOwnerRequestsInFlight(t *testing.T, limits string) {
	dsn, pool, k := seed(t)
	read2 := insertKey(t, pool, k.ownerA, nil, identity.ScopeExportRead)
	testSlotsHeld(t, slotsCase{
		settings: func(upstream string) map[string]string {
			// 3 slots, 1 of them the sale routes': 2 for the export routes.
			return map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": upstream,
				"SALES_WRITER_URLS": upstream, "RATE_LIMIT_OWNER_IN_FLIGHT": "3", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1",
				"RATE_LIMIT_ENABLED": limits, "KEY_CACHE_TTL": "1h", "KEY_CACHE_UNHEARD_TTL": "1h"}
		},
		// Owner A: a list page with each of its two read keys, then one
		// more; owner B: a list page.
		holder: func(gw *gatewaytest.Server) []func() response {
			list := func(key string) func() response {
				return func() response {
					return do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": key}, nil)
				}
			}
			return []func() response{list(k.read), list(read2), list(k.read), list(k.readB)}
		},
		class: "owner_in_flight_export", says: "on the export routes",
	})
}

// The owner's slots are split between the services, each share counted
// apart: sales held by a sales-writer that stopped answering (each until
// UPSTREAM_READ_TIMEOUT, its client gone) fill the sale routes' share, and
// the owner's syncs, which export-reader answers at once, still pass; list
// pages held by a stalled export-reader leave the owner's sales theirs.
// And the owner holds no more than the setting in all. With one count, a
// platform replaying its backlog into a hung writer had the owner's syncs
// refused 429 "too many requests in flight" until the writer's calls timed
// out; with a full count in each service, an owner flooding both queued
// twice the setting, and a whole setting's worth of sales in front of the
// writer's connections, ahead of its neighbours' sales.
func TestOwnerSlotsAreSplitBetweenTheServices(t *testing.T) {
	dsn, _, k := seed(t)
	writer, salesArrived, releaseSales := holdingUpstream(t, func(int64) bool { return true })
	reader, listsArrived, releaseLists := holdingUpstream(t, func(n int64) bool { return n <= 2 })
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader,
		"SALES_WRITER_URLS": writer, "RATE_LIMIT_OWNER_IN_FLIGHT": "3", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1"})
	sale := func(order string) response {
		return do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.write,
			"Idempotency-Key": order, "Content-Type": "application/json"}, strings.NewReader(`{"external_order_id":"`+order+`"}`))
	}
	list := func() response {
		return do(t, "GET", gw.URL+"/v1/export/items", map[string]string{"X-API-Key": k.read}, nil)
	}
	held := make(chan int, 3)
	go func() { held <- sale("order-1").Status }()
	waitFor(t, 5*time.Second, func() bool { return salesArrived.Load() == 1 })
	saleRefused := sale("order-2")
	if r := saleRefused; r.Status != 429 || r.Env.Error == nil ||
		!strings.Contains(r.Env.Error.Message, "sale routes") || !strings.Contains(r.Env.Error.Message, "at most 1") {
		t.Errorf("a second sale in flight = %d %s, want 429 naming the sale routes' 1 slot", r.Status, r.Body)
	}
	// The writer holds the sale routes' share; the export routes have
	// theirs, and the owner fills it.
	for range 2 {
		go func() { held <- list().Status }()
	}
	waitFor(t, 5*time.Second, func() bool { return listsArrived.Load() == 2 })
	listRefused := list()
	if r := listRefused; r.Status != 429 || r.Env.Error == nil ||
		!strings.Contains(r.Env.Error.Message, "export routes") || !strings.Contains(r.Env.Error.Message, "at most 2") {
		t.Errorf("a list page with 3 of the owner's requests in flight = %d %s, want 429 naming the export routes' 2 slots", r.Status, r.Body)
	}
	// The SRE, who has the request id and not the message, is told which
	// share was full by the access line (and the span), and the metric
	// counts each share apart: one owner_in_flight for both hid whether
	// sales-writer hung (the sale share full) or the owner synced hard.
	for _, c := range []struct {
		r     response
		class string
	}{{saleRefused, "owner_in_flight_sale"}, {listRefused, "owner_in_flight_export"}} {
		if c.r.Env.Meta.RequestID == "" {
			continue
		}
		if line := accessLine(gw.Logs.String(), c.r.Env.Meta.RequestID); !strings.Contains(line, `"rate_limit_class":"`+c.class+`"`) {
			t.Errorf("access line of the 429 = %s, want rate_limit_class %s", line, c.class)
		}
		limited := `gateway_ratelimit_decisions_total{backend="process",class="` + c.class + `",decision="limited"} 1`
		if metrics := scrape(t, gw.AdminURL); !bytes.Contains(metrics, []byte(limited)) {
			t.Errorf("metrics lack %s:\n%s", limited, grep(metrics, "gateway_ratelimit_decisions_total"))
		}
	}
	// The reader holds the export routes' share; once the writer answers,
	// the sale routes' slot is free again (released to the sale routes'
	// count: to the export routes' instead, the sale below would be
	// refused).
	releaseSales()
	if got := <-held; got != 200 {
		t.Errorf("the sale held by the writer = %d, want 200 once it answers", got)
	}
	if r := sale("order-3"); r.Status != 200 {
		t.Errorf("a sale while the owner's list pages fill the export routes' share = %d %s, want 200", r.Status, r.Body)
	}
	releaseLists()
	for range 2 {
		if got := <-held; got != 200 {
			t.Errorf("a list page held by the reader = %d, want 200 once it answers", got)
		}
	}
}

// slotsCase is a cap of 2 requests in flight per holder (an address, an
// owner).
type slotsCase struct {
	settings func(upstream string) map[string]string // the gateway's, its upstreams all at upstream
	// holder gives four requests: three of one holder (the first two take
	// its slots, the third is one too many) and one of another holder.
	holder func(gw *gatewaytest.Server) []func() response
	class  string // the cap's rate_limit_class
	says   string // what the 429's message names besides the limit
}

// testSlotsHeld holds a holder's two slots with requests the upstream
// keeps waiting: its third request is refused 429 rate_limited naming the
// cap (message, Retry-After, access line, decisions metric), another
// holder's request goes through meanwhile, every request let through is
// answered 200 once the upstream lets go, and the first holder is served
// again once its slots are free.
func testSlotsHeld(t *testing.T, c slotsCase) {
	t.Helper()
	upstream, arrived, release := holdingUpstream(t, func(int64) bool { return true })
	gw := gatewaytest.Start(t, c.settings(upstream))
	calls := c.holder(gw)
	first, second, over, other := calls[0], calls[1], calls[2], calls[3]
	answers := make(chan int, 3)
	go func() { answers <- first().Status }()
	go func() { answers <- second().Status }()
	waitFor(t, 5*time.Second, func() bool { return arrived.Load() == 2 })
	r := over()
	checkEnvelope(t, r)
	if r.Status != 429 || r.Env.Error == nil || r.Env.Error.Code != "rate_limited" || r.Header.Get("Retry-After") != "1" ||
		!strings.Contains(r.Env.Error.Message, "at most 2") || !strings.Contains(r.Env.Error.Message, c.says) {
		t.Errorf("a holder's third request in flight = %d %s (Retry-After %q), want 429 rate_limited naming the limit and %q",
			r.Status, r.Body, r.Header.Get("Retry-After"), c.says)
	}
	// Named as every limit's 429 is, in its access line and its decisions.
	if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); !strings.Contains(line, `"rate_limit_class":"`+c.class+`"`) {
		t.Errorf("access line of the 429 = %s, want rate_limit_class %s", line, c.class)
	}
	limited := `gateway_ratelimit_decisions_total{backend="process",class="` + c.class + `",decision="limited"} 1`
	if metrics := scrape(t, gw.AdminURL); !bytes.Contains(metrics, []byte(limited)) {
		t.Errorf("metrics lack %s:\n%s", limited, grep(metrics, "gateway_ratelimit_decisions_total"))
	}
	// Another holder's request goes through while the first holds both of its slots.
	go func() { answers <- other().Status }()
	waitFor(t, 5*time.Second, func() bool { return arrived.Load() == 3 })
	release()
	for range 3 {
		if got := <-answers; got != 200 {
			t.Errorf("a request within its holder's slots = %d, want 200", got)
		}
	}
	if r := over(); r.Status != 200 {
		t.Errorf("a request after the slots were freed = %d %s, want 200", r.Status, r.Body)
	}
}

// A request refused by its owner's in-flight cap spends nothing of its
// key's rate limit: the cap is decided first, in the process. An owner at
// its cap whose clients retry after Retry-After would otherwise use up its
// keys' budgets on requests that did no work, and be refused by the rate
// limit once a slot is free.
func TestOwnerCapSpendsNoKeyBudget(t *testing.T) {
	dsn, _, k := seed(t)
	testCapSpendsNoBudget(t, capCase{
		settings: func(upstream string) map[string]string {
			return map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": upstream, "SALES_WRITER_URLS": upstream,
				"RATE_LIMIT_OWNER_IN_FLIGHT": "2", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1", "RATE_LIMIT_EXPORT_READ": "3-M"}
		},
		method: "GET", path: "/v1/export/items", headers: map[string]string{"X-API-Key": k.read},
		class: "owner_in_flight_export",
	})
}

// The address's shop schema slot is taken before its rate limit, as the
// owner's is on the keyed routes: a call the cap refuses spends none of
// the address's budget, so the calls it sends once a slot is free pass.
func TestShopSchemaCapSpendsNoAddressBudget(t *testing.T) {
	dsn, _, _ := seed(t)
	testCapSpendsNoBudget(t, capCase{
		settings: func(upstream string) map[string]string {
			return map[string]string{"DATABASE_URL": dsn, "SHOP_SCHEMA_URLS": upstream,
				"RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT": "1", "RATE_LIMIT_SHOP_SCHEMA": "3-M"}
		},
		method: "POST", path: "/v1/sync/prestashop/schema", headers: map[string]string{"Content-Type": "application/json"},
		body: `{}`, class: "shop_schema_in_flight",
	})
}

// capCase is a route under an in-flight cap of 1 and a rate limit of 3 a
// minute, both of one holder (an owner, an address).
type capCase struct {
	settings     func(upstream string) map[string]string // the gateway's, its upstreams all at upstream
	method, path string
	headers      map[string]string
	body         string
	class        string // the cap's rate_limit_class
}

// testCapSpendsNoBudget holds the cap's one slot with a request the
// upstream keeps waiting, sends three more, each refused 429 by the cap
// without a decision of the rate limit (no X-RateLimit-* header), then
// frees the slot: two more requests must pass, as the refused ones spent
// none of the 3 a minute.
func testCapSpendsNoBudget(t *testing.T, c capCase) {
	t.Helper()
	upstream, arrived, release := holdingUpstream(t, func(n int64) bool { return n == 1 }) // the first holds the one slot
	gw := gatewaytest.Start(t, c.settings(upstream))
	send := func() response {
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		return do(t, c.method, gw.URL+c.path, c.headers, body)
	}
	held := make(chan int, 1)
	go func() { held <- send().Status }()
	waitFor(t, 5*time.Second, func() bool { return arrived.Load() == 1 })
	for range 3 {
		r := send()
		if line := accessLine(gw.Logs.String(), r.Env.Meta.RequestID); r.Status != 429 ||
			!strings.Contains(line, `"rate_limit_class":"`+c.class+`"`) {
			t.Errorf("a request over the cap = %d, access line %s; want 429 by %s", r.Status, line, c.class)
		}
		if got := r.Header.Get("X-RateLimit-Remaining"); got != "" {
			t.Errorf("a 429 of the cap: X-RateLimit-Remaining = %q, want none (no decision of the rate limit)", got)
		}
	}
	release()
	if got := <-held; got != 200 {
		t.Errorf("the request holding the slot = %d, want 200", got)
	}
	// 1 of 3 spent: two more pass.
	for i := range 2 {
		if r := send(); r.Status != 200 {
			t.Errorf("request %d within the budget after the cap's refusals = %d %s, want 200", i+2, r.Status, r.Body)
		}
	}
}

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

// A shop schema read changes nothing, so, as a GET, it is sent again when
// its connection was found closed before any answer: the usual fate of a
// kept-alive connection to a shop-schema instance that restarted (an ops
// probe got a 502 from 5 of 6 restarts with another instance up). Its 502
// does not speak of a write; that of a sale sent with an Idempotency-Key
// tells the client to retry under the same key.
func TestShopSchemaReadIsRepeatedWhenItsConnectionClosed(t *testing.T) {
	dsn, _, k := seed(t)
	var broken, good atomic.Int64
	brokenURL := brokenUpstream(t, &broken).URL
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"SHOP_SCHEMA_URLS": brokenURL + "," + echoUpstream(t, "good", &good).URL})
	json := map[string]string{"Content-Type": "application/json"}
	for i := range 4 {
		if r := do(t, "POST", gw.URL+"/v1/sync/prestashop/schema", json, strings.NewReader(`{}`)); r.Status != 200 {
			t.Fatalf("shop schema read %d = %d %s, want 200 (sent again to the good instance)", i+1, r.Status, r.Body)
		}
	}
	if broken.Load() == 0 {
		t.Fatal("no read reached the broken instance first; the test proved nothing")
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

// A 403 names the scope the route needs and the key's, so that a client
// holding a read key and a write key sees which one it sent.
func TestForbiddenNamesTheScopes(t *testing.T) {
	dsn, _, k := seed(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn})
	r := do(t, "POST", gw.URL+"/v1/export/items/coin-1/sales/confirm", map[string]string{"X-API-Key": k.read,
		"Content-Type": "application/json"}, strings.NewReader(`{"external_order_id":"o"}`))
	want := "this route needs an API key with the sales:write scope; this key has export:read"
	if r.Status != 403 || r.Env.Error == nil || r.Env.Error.Message != want {
		t.Errorf("confirm with a read key = %d %s, want 403 %q", r.Status, r.Body, want)
	}
}

// Error answers are counted by route and error code, the gateway's own
// refusals (which reach no service) and the services' relayed answers alike:
// the status class alone does not tell a rise of 401s from one of 404s or
// 429s. A code not shaped like one is counted as "other".
func TestErrorAnswersAreCountedByRouteAndCode(t *testing.T) {
	dsn, _, k := seed(t)
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := "item_already_sold"
		if strings.HasPrefix(r.URL.Path, "/v1/export/items/odd") {
			code = "Not A Code!"
		}
		envelope.WriteError(w, http.StatusConflict, code, "refused", httpserver.RandomRequestID())
	}))
	t.Cleanup(refusing.Close)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn,
		"EXPORT_READER_URLS": echoUpstream(t, "reader", nil).URL, "SALES_WRITER_URLS": refusing.URL})
	items := gw.URL + "/v1/export/items"
	write := map[string]string{"X-API-Key": k.write, "Content-Type": "application/json", "Idempotency-Key": "k1"}
	for _, rq := range []struct {
		method, url string
		headers     map[string]string
		status      int
	}{
		{"GET", items, nil, 401},
		{"GET", items, map[string]string{"X-API-Key": k.revoked}, 401},
		{"GET", items + "/coin-1", map[string]string{"X-API-Key": k.read}, 200},
		{"GET", gw.URL + "/v1/nope", nil, 404},
		{"DELETE", items + "/coin-1", nil, 405},
		{"POST", items + "/coin-1/sales/confirm", write, 409},
		{"POST", items + "/odd/sales/confirm", write, 409},
	} {
		if r := do(t, rq.method, rq.url, rq.headers, strings.NewReader(`{"external_order_id":"o"}`)); r.Status != rq.status {
			t.Fatalf("%s %s = %d %s, want %d", rq.method, rq.url, r.Status, r.Body, rq.status)
		}
	}
	metrics := scrape(t, gw.AdminURL)
	wantSeries(t, metrics, "gateway_http_errors_total",
		`gateway_http_errors_total{code="unauthenticated",route="GET /v1/export/items"} 2`,
		`gateway_http_errors_total{code="not_found",route="unmatched"} 1`,
		`gateway_http_errors_total{code="method_not_allowed",route="/v1/export/items/{item_id}"} 1`,
		`gateway_http_errors_total{code="item_already_sold",route="POST /v1/export/items/{item_id}/sales/confirm"} 1`,
		`gateway_http_errors_total{code="other",route="POST /v1/export/items/{item_id}/sales/confirm"} 1`,
	)
	if got := grep(metrics, `gateway_http_errors_total{code="none"`); got != "" {
		t.Errorf("an answer was counted as an error without a code: %s", got)
	}
	if got := grep(metrics, `route="GET /v1/export/items/{item_id}"`); strings.Contains(got, "gateway_http_errors_total") {
		t.Errorf("a 200 was counted as an error: %s", got)
	}
}

// holdingUpstream is an upstream that answers 200 with an empty object,
// holding each request whose arrival number (1, 2, …) hold picks until
// release is called, or 10 s: a gateway letting a request too many
// through fails the test rather than hanging it. arrived counts the
// requests that reached it (health checks aside).
func holdingUpstream(t *testing.T, hold func(n int64) bool) (url string, arrived *atomic.Int64, release func()) {
	t.Helper()
	released := make(chan struct{})
	arrived = new(atomic.Int64)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		if hold(arrived.Add(1)) {
			select {
			case <-released:
			case <-time.After(10 * time.Second):
			}
		}
		envelope.WriteData(w, http.StatusOK, map[string]string{}, envelope.Meta{})
	}))
	t.Cleanup(upstream.Close)
	return upstream.URL, arrived, sync.OnceFunc(func() { close(released) })
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
