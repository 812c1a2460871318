package api

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
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
	h := newHandler(b, testenv.Pool(b, f.url+" pool_max_conns=8"), defaultRetention)
	id := f.writer("market-a")

	var nextWorker, failures atomic.Int64
	var mu sync.Mutex
	var latencies []time.Duration
	b.ResetTimer()
	start := time.Now()
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
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failures.Load(); n > 0 {
		b.Errorf("%d calls did not answer 200", n)
	}
	slices.Sort(latencies)
	if len(latencies) > 0 {
		b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
}
