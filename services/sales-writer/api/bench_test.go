package api

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkConfirmCancelPair measures confirm+cancel pairs through the
// service's real handler (identity check, validation, PostgreSQL), without
// the gateway or a network hop. Each parallel worker sells its own items, so
// the figure is throughput, not contention. It reports pairs/s and the p99
// of one call.
func BenchmarkConfirmCancelPair(b *testing.B) {
	const itemsPerWorker = 16
	f := newFixture(b)
	// RunParallel runs parallelism × GOMAXPROCS workers: enough concurrent
	// calls to keep PostgreSQL busy while others are in flight.
	const parallelism = 8
	b.SetParallelism(parallelism)
	workers := parallelism * runtime.GOMAXPROCS(0)
	for i := range workers * itemsPerWorker {
		f.addItem(b, f.owner, fmt.Sprintf("coin-%d", i), true)
	}
	h := newHandler(b, servicePool(b, f.url), defaultRetention)
	id := f.writer("market-a")

	var nextWorker, failures atomic.Int64
	var mu sync.Mutex
	var latencies []time.Duration
	backends := backendPIDs(b, f.db)
	b.ResetTimer()
	start, cpu0, pg0 := time.Now(), processCPU(), backendsCPU(b, backends)
	b.RunParallel(func(pb *testing.PB) {
		w := int(nextWorker.Add(1) - 1)
		var own []time.Duration
		for j := 0; pb.Next(); j++ {
			item := fmt.Sprintf("coin-%d", w*itemsPerWorker+j%itemsPerWorker)
			body := fmt.Sprintf(`{"external_order_id":"o-%d-%d"}`, w, j)
			for _, op := range []string{"confirm", "cancel"} {
				t0 := time.Now()
				rec, _ := serve(b, h, f.signer, call{id: id, op: op, item: item, key: fmt.Sprintf("%s-%d-%d", op, w, j), body: body})
				own = append(own, time.Since(t0))
				if rec.Code != 200 {
					failures.Add(1)
				}
			}
		}
		mu.Lock()
		latencies = append(latencies, own...)
		mu.Unlock()
	})
	elapsed, cpu, pg := time.Since(start), processCPU()-cpu0, backendsCPU(b, backends)-pg0
	b.StopTimer()
	if n := failures.Load(); n > 0 {
		b.Errorf("%d calls did not answer 200", n)
	}
	slices.Sort(latencies)
	if len(latencies) > 0 {
		b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/pair")
	b.ReportMetric(float64(pg)/float64(b.N), "pg-cpu-ns/pair")
}

// processCPU is this process's user+system CPU time so far, in ns: the
// handler's and the benchmark's own requests and answers, which the wall
// time of a shared machine does not tell.
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// benchPoolSize is the handler's pool: SALES_WRITER_DB_MAX_CONNS' default.
const benchPoolSize = 8

// servicePool opens the pool as run does (otelpgx's tracer, the session
// settings), of benchPoolSize connections, and opens them all before the
// timer starts, so that backendPIDs finds every one.
func servicePool(b *testing.B, url string) *pgxpool.Pool {
	pool, err := postgres.Open(context.Background(), postgres.WithPoolSize(url, benchPoolSize),
		postgres.IndexScansOnly(), postgres.StatementTimeout(10*time.Second),
		postgres.ApplicationName(benchApplication), postgres.ReadCommitted())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	conns := make([]*pgxpool.Conn, 0, benchPoolSize)
	for range benchPoolSize {
		conn, err := pool.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Release()
	}
	return pool
}

// benchApplication names the handler pool's sessions apart from the
// fixture's.
const benchApplication = "sales-writer-bench"

// backendPIDs are the PostgreSQL backends of servicePool's sessions. None
// when PostgreSQL runs where /proc does not show it (another host, a
// container): pg-cpu-ns/pair then reads 0.
func backendPIDs(b *testing.B, db *pgxpool.Pool) []int {
	rows, err := db.Query(context.Background(),
		"SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()", benchApplication)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		b.Fatal(err)
	}
	return pids
}

// backendsCPU is the user+system CPU time of pids so far, in ns, read from
// /proc (clock ticks of 10 ms: a run of thousands of pairs reads it well).
func backendsCPU(b *testing.B, pids []int) int64 {
	var ticks int64
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // not visible here, or gone
		}
		// Fields after the command's closing parenthesis; utime and stime
		// are the 14th and 15th of the line, the 12th and 13th after it.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		for _, f := range fields[11:13] {
			n, _ := strconv.ParseInt(f, 10, 64)
			ticks += n
		}
	}
	return ticks * int64(time.Second) / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTicks = 100
