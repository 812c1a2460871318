package edge_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/coinexport/export/gateway/gatewaytest"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/proxy"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// BenchmarkGateway measures the gateway's throughput on GET by id (make
// bench's GET scenario; until session 40 a small list page, whose relay is
// now its own: BenchmarkGatewaySyncPage) with rate limits off and on (limits no key reaches, so every request is
// proxied and pays for its decision), against a trivial upstream, and a
// plain Fiber proxy hop beside it; compare ns/op and cpu-ns/op +
// redis-cpu-ns/op. The upstream runs in this process, so its parsing of
// the gateway's extra headers (identity, traceparent) counts against the
// gateway here, not in make bench (there nginx's client sends the
// identity too).
//
//	go test -run '^$' -bench Gateway -benchtime 5s ./edge/
func BenchmarkGateway(b *testing.B) {
	upstream := fastUpstream(b)
	dsn := testenv.PostgresURL(b)
	pool := testenv.Pool(b, dsn)
	keys := benchKeys(b, pool, 64)
	rdb := redis.NewClient(mustParseRedis(b, testenv.RedisURL(b)))
	defer rdb.Close()
	for _, bc := range []struct {
		name    string
		enabled string
		limit   string
		keys    []string
	}{
		{"limits=off", "false", "6000-M", keys},
		// The default limit, spread over 64 keys so none is refused.
		{"limits=on/keys=64", "true", "6000-M", keys},
		// One hot key with a limit it never reaches.
		{"limits=on/keys=1", "true", "1000000-M", keys[:1]},
	} {
		b.Run(bc.name, func(b *testing.B) {
			gw := gatewaytest.Start(b, map[string]string{
				"DATABASE_URL": dsn, "EXPORT_READER_URLS": upstream, "LOG_LEVEL": "error",
				"RATE_LIMIT_ENABLED": bc.enabled, "RATE_LIMIT_EXPORT_READ": bc.limit,
			})
			client := &fasthttp.HostClient{Addr: gw.URL[len("http://"):], MaxConns: 256}
			for _, k := range bc.keys { // warm the key cache
				benchGet(b, client, itemPath, k)
			}
			runGets(b, client, itemPath, bc.keys, rdb)
		})
	}
	// The reference: Fiber's proxy and nothing else (gateway/cmd/plainhop),
	// with the same client and upstream, so the difference of cpu-ns/op is
	// what the gateway's own work costs.
	b.Run("plainhop", func(b *testing.B) {
		client := &fasthttp.HostClient{Addr: plainHop(b, upstream), MaxConns: 256}
		benchGet(b, client, itemPath, keys[0])
		runGets(b, client, itemPath, keys, rdb)
	})
}

// runGets sends b.N GETs from 8 goroutines per CPU over client and
// reports the CPU time per request of this process and of Redis.
func runGets(b *testing.B, client *fasthttp.HostClient, path string, keys []string, rdb *redis.Client) {
	var n atomic.Int64
	b.SetParallelism(8)
	cpu0, redis0 := processCPU(), redisCPU(b, rdb)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			benchGet(b, client, path, keys[int(n.Add(1))%len(keys)])
		}
	})
	b.StopTimer()
	// CPU per request is steadier than wall time on a shared machine; the
	// process holds the client and upstream too, which cost the same
	// whatever sits between them.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(redisCPU(b, rdb)-redis0)/float64(b.N), "redis-cpu-ns/op")
}

// plainHop serves Fiber's proxy middleware in front of upstream, as
// gateway/cmd/plainhop does, and returns its address.
func plainHop(b *testing.B, upstream string) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(func(c *fiber.Ctx) error { return proxy.Do(c, upstream+c.OriginalURL()) })
	go app.Listener(l)
	b.Cleanup(func() { _ = app.Shutdown() })
	return l.Addr().String()
}

// Paths the benchmarks GET: an item, as make bench's GET scenario (the
// routes whose answers are read whole), and a list page, whose relay is
// its own (proxyUntilRelayed).
const (
	itemPath = "/v1/export/items/bench-item"
	pagePath = "/v1/export/items?limit=100"
)

func benchGet(b *testing.B, client *fasthttp.HostClient, path, key string) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + client.Addr + path)
	req.Header.Set("X-API-Key", key)
	if err := client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
		b.Errorf("GET = %d, %v, want 200", resp.StatusCode(), err)
	}
}

// fastUpstream answers every request with a small page, as cheaply as
// possible, so the gateway's own cost dominates.
func fastUpstream(b *testing.B) string {
	return upstreamAnswering(b, []byte(`{"data":[],"meta":{"request_id":"x","next_cursor":null}}`))
}

// upstreamAnswering answers every request with body, as JSON, and returns
// its URL.
func upstreamAnswering(b *testing.B, body []byte) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
		c.SetContentType("application/json")
		c.SetBody(body)
	}}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Shutdown() })
	return "http://" + l.Addr().String()
}

func benchKeys(b *testing.B, pool *pgxpool.Pool, n int) []string {
	ctx := context.Background()
	var owner string
	if err := pool.QueryRow(ctx, `INSERT INTO owners (name) VALUES ('bench') RETURNING id`).Scan(&owner); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		secret, prefix, err := apikey.Generate([]string{identity.ScopeExportRead})
		if err != nil {
			b.Fatal(err)
		}
		h := apikey.HashOf(secret)
		if _, err := pool.Exec(ctx, `INSERT INTO api_keys (owner_id, prefix, hash, scopes, name) VALUES ($1, $2, $3, $4, $5)`,
			owner, prefix, h[:], []string{identity.ScopeExportRead}, "bench-"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		keys[i] = secret
	}
	return keys
}

// processCPU is the user+system CPU time of this process so far, in ns.
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// redisCPU is the Redis server's user+system CPU time so far, in ns.
func redisCPU(b *testing.B, rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return int64(total * 1e9)
}

func mustParseRedis(b *testing.B, url string) *redis.Options {
	opts, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	return opts
}

// BenchmarkGatewaySyncPage measures the gateway's CPU per list page of a
// sync (~100 KB, a 100-item page of make bench's items) through the list
// route, which asks for its answers as streams and reads them whole within
// heldAnswersLimit, against a plain Fiber proxy hop with the same client
// and upstream (runGets: 8 client goroutines per CPU).
//
//	go test -run '^$' -bench GatewaySyncPage -benchtime 20000x -benchmem ./edge/
func BenchmarkGatewaySyncPage(b *testing.B) {
	upstream := pageUpstream(b, 100<<10)
	dsn := testenv.PostgresURL(b)
	keys := benchKeys(b, testenv.Pool(b, dsn), 1)
	rdb := redis.NewClient(mustParseRedis(b, testenv.RedisURL(b)))
	defer rdb.Close()
	b.Run("gateway", func(b *testing.B) {
		gw := gatewaytest.Start(b, map[string]string{
			"DATABASE_URL": dsn, "EXPORT_READER_URLS": upstream, "LOG_LEVEL": "error",
			"RATE_LIMIT_ENABLED": "false",
		})
		client := &fasthttp.HostClient{Addr: gw.URL[len("http://"):], MaxConns: 64}
		benchGet(b, client, pagePath, keys[0])
		runGets(b, client, pagePath, keys, rdb)
	})
	b.Run("plainhop", func(b *testing.B) {
		client := &fasthttp.HostClient{Addr: plainHop(b, upstream), MaxConns: 64}
		benchGet(b, client, pagePath, keys[0])
		runGets(b, client, pagePath, keys, rdb)
	})
}

// pageUpstream answers every request with a JSON page of size bytes.
func pageUpstream(b *testing.B, size int) string {
	return upstreamAnswering(b, []byte(`{"data":["`+strings.Repeat("x", size-64)+`"],"meta":{"request_id":"x","next_cursor":null}}`))
}
