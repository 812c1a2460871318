package edge_test

import (
	"strings"
	"testing"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/testenv"
)

// The bounded structures a flood fills show on /metrics, read at the
// scrape: the key cache's entries, the rate limiter's leases and, once
// Redis is gone, the in-process fallback's windows. Each reads 0 until
// something fills it, so a gauge that read nothing would fail here.
func TestHeldStructuresShowOnMetrics(t *testing.T) {
	dsn, _, k := seed(t)
	reader := echoUpstream(t, "reader", nil)
	redis := testenv.StartRedis(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": reader.URL,
		"REDIS_URL": redis.URL, "KEY_CACHE_SIZE": "1000"})
	wantSeries(t, scrape(t, gw.AdminURL), "gateway_",
		"gateway_key_cache_entries 0", "gateway_ratelimit_leases 0", "gateway_ratelimit_local_keys 0",
		"gateway_answers_held_bytes 0", `gateway_answers_past_held_limit_total{way="refused"} 0`, `gateway_answers_past_held_limit_total{way="streamed"} 0`)
	// Their bounds too, which the alerts read the gauges against: a bound
	// written into a rule would go on alerting at the old figure once the
	// code changed it.
	wantSeries(t, scrape(t, gw.AdminURL), "gateway_",
		"gateway_answers_held_max_bytes 3.3554432e+07", "gateway_ratelimit_max_leases 100000")
	// The client connections open (none between this test's requests, whose
	// client closes each), their bound and the refusals past it.
	wantSeries(t, scrape(t, gw.AdminURL), "gateway_connections",
		"gateway_connections_open ", "gateway_connections_max 4096", "gateway_connections_refused_total 0")

	items := gw.URL + "/v1/export/items"
	for _, key := range []string{k.read, k.write, k.revoked, k.unknown} {
		do(t, "GET", items, map[string]string{"X-API-Key": key}, nil)
	}
	metrics := scrape(t, gw.AdminURL)
	// Four keys cached, valid, revoked and unknown alike.
	wantSeries(t, metrics, "gateway_key_cache_entries", "gateway_key_cache_entries 4")
	// A lease per limit the requests were counted in: the valid key's
	// export_read, and its address's two budgets of failed keys.
	wantSeries(t, metrics, "gateway_ratelimit_leases", "gateway_ratelimit_leases 3")

	redis.Stop()
	if r := do(t, "GET", items, map[string]string{"X-API-Key": k.read}, nil); r.Status != 200 {
		t.Fatalf("GET with Redis down = %d %s, want 200", r.Status, r.Body)
	}
	metrics = scrape(t, gw.AdminURL)
	// The fallback holds the one window it decided in: the key's.
	wantSeries(t, metrics, "gateway_ratelimit_local_keys", "gateway_ratelimit_local_keys 1")
	if !strings.Contains(grep(metrics, "# HELP gateway_key_cache_entries"), "KEY_CACHE_SIZE (1000 here)") {
		t.Errorf("the key cache gauge's Help does not say its bound:\n%s", grep(metrics, "gateway_key_cache_entries"))
	}
}
