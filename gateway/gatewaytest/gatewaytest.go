// Package gatewaytest starts a real gateway in-process for tests, on
// loopback ports of its own, against the PostgreSQL and Redis of
// pkg/testenv unless told otherwise.
package gatewaytest

import (
	"context"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/testenv"
)

// IdentitySecret is the identity secret a gateway started here signs with,
// unless env sets IDENTITY_SECRET; fake upstreams verify with it.
const IdentitySecret = "gatewaytest-identity-secret-0123456789abcdef"

// Server is a running gateway.
type Server struct {
	// URL is the public base, e.g. http://127.0.0.1:41234 (paths start /v1).
	URL string
	// AdminURL serves /metrics.
	AdminURL string
	// Logs holds every log line the gateway wrote.
	Logs *testenv.Output
}

// Start runs a gateway configured by env (the same variables as the
// binary) and stops it when the test ends. Unless env sets them,
// DATABASE_URL is a fresh migrated database, REDIS_URL the shared test
// Redis with a key prefix of this test's own, its calls' timeout 2 s, each
// service's URL an address that refuses connections, and the listen
// addresses are 127.0.0.1:0.
func Start(t testing.TB, env map[string]string) *Server {
	t.Helper()
	vars := map[string]string{
		"GATEWAY_ADDR":          "127.0.0.1:0",
		"GATEWAY_ADMIN_ADDR":    "127.0.0.1:0",
		"IDENTITY_SECRET":       IdentitySecret,
		"RATE_LIMIT_KEY_PREFIX": "rl:" + testenv.KeyPrefix(t),
		"LOG_LEVEL":             "debug",
		// The product's 50 ms lets a Redis stall on a loaded test machine
		// (every package's tests share two cores) hand decisions to the
		// in-process fallback, whose counts start again: a test counting
		// 200s up to its 429 then sees one 200 too many. No test here
		// relies on the timeout; a Redis that is down refuses at once.
		"RATE_LIMIT_REDIS_TIMEOUT": "2s",
	}
	for k, v := range env {
		vars[k] = v
	}
	if vars["DATABASE_URL"] == "" {
		vars["DATABASE_URL"] = testenv.PostgresURL(t)
	}
	if vars["REDIS_URL"] == "" {
		vars["REDIS_URL"] = testenv.RedisURL(t)
	}
	// Not the defaults, 127.0.0.1:8081-8083: a make run's services, if one
	// runs on the machine, would be probed and sent to.
	for _, urls := range []string{"EXPORT_READER_URLS", "SALES_WRITER_URLS", "SHOP_SCHEMA_URLS"} {
		if vars[urls] == "" {
			vars[urls] = "http://" + testenv.RefusingAddr(t)
		}
	}
	getenv := func(k string) string { return vars[k] }
	cfg, err := edge.LoadConfig(getenv)
	if err != nil {
		t.Fatalf("gatewaytest: config: %v", err)
	}
	logs := &testenv.Output{}
	g, err := edge.Start(context.Background(), cfg, logging.New(logs, cfg.LogLevel, "gateway"), getenv)
	if err != nil {
		t.Fatalf("gatewaytest: start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			t.Errorf("gatewaytest: shutdown: %v", err)
		}
	})
	// The revocation listener empties the key cache when it first connects:
	// a test that looked a key up before that would see it forgotten.
	for deadline := time.Now().Add(10 * time.Second); !g.HearsRevocations(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gatewaytest: the key store's revocation listener did not connect within 10 s")
		}
	}
	return &Server{URL: "http://" + g.Addr(), AdminURL: "http://" + g.AdminAddr(), Logs: logs}
}
