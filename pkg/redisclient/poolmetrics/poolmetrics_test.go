package poolmetrics

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The series follow the pool: a command that dials counts a miss and a
// connection, the next one a hit on the idle connection, and a command
// that finds the one connection held past the pool timeout counts a
// timeout, the pool at its limit.
func TestSeriesFollowThePool(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opts.PoolSize, opts.PoolTimeout, opts.MaxRetries = 1, 50*time.Millisecond, -1
	client := redis.NewClient(opts)
	defer client.Close()
	reg := prometheus.NewPedanticRegistry()
	Register(reg, "redis", client)

	ctx := context.Background()
	for range 2 {
		if err := client.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	held := client.Conn()
	defer held.Close()
	if err := held.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Ping(ctx).Err(); !errors.Is(err, redis.ErrPoolTimeout) {
		t.Fatalf("Ping with the one connection held = %v, want %v", err, redis.ErrPoolTimeout)
	}

	want := `
# HELP redis_pool_max_conns Pool size limit.
# TYPE redis_pool_max_conns gauge
redis_pool_max_conns{pool="redis"} 1
# HELP redis_pool_misses_total Commands that found no idle connection and dialled a new one.
# TYPE redis_pool_misses_total counter
redis_pool_misses_total{pool="redis"} 1
# HELP redis_pool_total_conns Connections in the pool.
# TYPE redis_pool_total_conns gauge
redis_pool_total_conns{pool="redis"} 1
# HELP redis_pool_idle_conns Idle connections.
# TYPE redis_pool_idle_conns gauge
redis_pool_idle_conns{pool="redis"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "redis_pool_max_conns", "redis_pool_misses_total",
		"redis_pool_total_conns", "redis_pool_idle_conns"); err != nil {
		t.Error(err)
	}
	for name, atLeast := range map[string]float64{"redis_pool_hits_total": 2, "redis_pool_timeouts_total": 1} {
		if got := gathered(t, reg, name); got < atLeast {
			t.Errorf("%s = %v, want at least %v", name, got, atLeast)
		}
	}
}

// gathered is the value of the one series name on reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}
