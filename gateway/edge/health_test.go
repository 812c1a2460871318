package edge

import (
	"context"
	"testing"

	"github.com/coinexport/export/pkg/redisclient"
	"github.com/coinexport/export/pkg/testenv"
)

// stalledPostgres returns the address of a server that accepts connections
// and never answers: a PostgreSQL frozen or partitioned away.
func stalledPostgres(t *testing.T) string {
	return testenv.SilentServer(t)
}

// A stalled PostgreSQL is down, and Redis, which answers, stays ok: the
// PostgreSQL ping must not use up the Redis ping's time.
func TestHealthCheckOfRedisIgnoresAStalledPostgres(t *testing.T) {
	pool := testenv.Pool(t, "postgres://postgres@"+stalledPostgres(t)+"/exportsvc?sslmode=disable")
	rdb, err := redisclient.Open(testenv.RedisURL(t), healthPingTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })

	var h healthState
	h.check(context.Background(), pool, rdb)
	if h.postgresOK.Load() {
		t.Error("check with a stalled PostgreSQL: postgres ok, want down")
	}
	if !h.redisOK.Load() {
		t.Error("check with a stalled PostgreSQL and a Redis that answers: redis degraded, want ok")
	}
}
