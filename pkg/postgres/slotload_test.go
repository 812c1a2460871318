package postgres_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkSlotWaitUnderLoad measures what callers of Acquire see while
// PostgreSQL refuses their pool a second connection (the role's CONNECTION
// LIMIT 1, as a rollout that filled max_connections does): 32 callers,
// each call with a 2 s deadline, run for 5 s, on queries of 1 ms and of
// 100 ms. "slot" is a pool sized 8 and held to 1 connection by the
// refusals (Acquire's wait for want of a slot); "pool" is a pool sized 1,
// whose calls queue in pgxpool's own line, for comparison. It reports the
// calls served, those that met their deadline, and the p50 and p99 of the
// served calls' wait for a connection:
//
//	go test ./postgres -run '^$' -bench SlotWaitUnderLoad -benchtime 1x
func BenchmarkSlotWaitUnderLoad(b *testing.B) {
	for _, query := range []time.Duration{time.Millisecond, 100 * time.Millisecond} {
		for _, pool := range []struct {
			name  string
			conns string
		}{{"slot", "8"}, {"pool", "1"}} {
			b.Run(pool.name+"/"+query.String(), func(b *testing.B) {
				for range b.N {
					loaded := runSlotLoad(b, pool.conns, query)
					b.ReportMetric(float64(loaded.served), "served")
					b.ReportMetric(float64(loaded.timedOut), "timed-out")
					b.ReportMetric(float64(loaded.failed), "failed")
					b.ReportMetric(loaded.percentile(50).Seconds()*1000, "p50-wait-ms")
					b.ReportMetric(loaded.percentile(99).Seconds()*1000, "p99-wait-ms")
				}
			})
		}
	}
}

// slotLoad is what the callers of one run saw.
type slotLoad struct {
	mu                       sync.Mutex
	served, timedOut, failed int
	waits                    []time.Duration // of the served calls
}

// runSlotLoad runs 32 callers for 5 s on a pool of maxConns connections
// held to one by its role's CONNECTION LIMIT, each call taking its
// connection through Acquire and holding it for a query of query.
func runSlotLoad(b *testing.B, maxConns string, query time.Duration) *slotLoad {
	const (
		callers  = 32
		deadline = 2 * time.Second
		run      = 5 * time.Second
	)
	dsn, limit := testenv.SlotLimitedRole(b, testenv.PostgresURL(b))
	pool, err := postgres.Open(context.Background(), dsn+" pool_max_conns="+maxConns)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	limit(1) // the pool's one session holds the role's one slot
	loaded := &slotLoad{}
	end := time.Now().Add(run)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for time.Now().Before(end) {
				loaded.call(pool, deadline, query)
			}
		})
	}
	wg.Wait()
	return loaded
}

// call is one caller's call: a connection of pool through Acquire, then
// a query of query, within deadline.
func (l *slotLoad) call(pool *pgxpool.Pool, deadline, query time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	started := time.Now()
	conn, err := postgres.Acquire(ctx, pool)
	waited := time.Since(started)
	if err == nil {
		_, err = conn.Exec(ctx, "SELECT pg_sleep($1)", query.Seconds())
		conn.Release()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil:
		l.served++
		l.waits = append(l.waits, waited)
	case errors.Is(err, context.DeadlineExceeded) || postgres.QueryCanceled(err):
		l.timedOut++
	default:
		l.failed++
	}
}

// percentile is the p-th percentile of the served calls' waits.
func (l *slotLoad) percentile(p int) time.Duration {
	if len(l.waits) == 0 {
		return 0
	}
	waits := slices.Clone(l.waits)
	slices.Sort(waits)
	return waits[(len(waits)-1)*p/100]
}
