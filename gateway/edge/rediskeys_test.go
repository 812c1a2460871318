package edge_test

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/redisclient"
	"github.com/coinexport/export/pkg/testenv"
)

// The rate limiter's Redis keys name an API key by its id, never by the
// secret or its hash (issue 3: keys never reach "a Redis key name"): a
// Redis readable by more people than the key store (a shared cache, a
// MONITOR, a dump) must not hand out working keys. Every class the gateway
// limits writes a key here, so the test cannot pass on an empty Redis.
func TestRedisKeysNameTheKeyIDNeverTheKey(t *testing.T) {
	dsn, _, k := seed(t)
	upstream := echoUpstream(t, "upstream", nil)
	prefix := "rl:" + testenv.KeyPrefix(t)
	gw := gatewaytest.Start(t, map[string]string{"DATABASE_URL": dsn, "EXPORT_READER_URLS": upstream.URL,
		"SALES_WRITER_URLS": upstream.URL, "RATE_LIMIT_KEY_PREFIX": prefix})
	calls := []struct{ method, path, key, body string }{
		{"GET", "/v1/export/items", k.read, ""},
		{"POST", "/v1/export/items/coin-1/sales/confirm", k.write, `{"external_order_id":"o-1"}`},
		{"GET", "/v1/export/items", k.unknown, ""},
		{"GET", "/v1/health", "", ""},
	}
	for _, c := range calls {
		headers := map[string]string{"Idempotency-Key": "idem-1", "Content-Type": "application/json"}
		if c.key != "" {
			headers["X-API-Key"] = c.key
		}
		do(t, c.method, gw.URL+c.path, headers, strings.NewReader(c.body))
	}

	rdb, err := redisclient.Open(testenv.RedisURL(t), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	names, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(names, "\n")
	for _, id := range []string{k.readID, k.writeID} {
		if !strings.Contains(all, id) {
			t.Errorf("no Redis key names key id %s; keys:\n%s", id, all)
		}
	}
	for _, secret := range []string{k.read, k.write, k.unknown} {
		hash := apikey.HashOf(secret)
		for _, leak := range []string{secret, hex.EncodeToString(hash[:]), string(hash[:])} {
			if strings.Contains(all, leak) {
				t.Errorf("a Redis key names an API key or its hash; keys:\n%s", all)
			}
		}
	}
}
