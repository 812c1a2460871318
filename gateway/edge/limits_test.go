package edge_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/redisclient"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"
)

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
