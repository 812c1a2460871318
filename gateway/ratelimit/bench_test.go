package ratelimit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
)

// BenchmarkTake is the cost of one decision on the hot path (leases and
// pipelined Redis round trips), to set beside the gateway's CPU per request.
//
//	go test -run '^$' -bench Take ./ratelimit/
func BenchmarkTake(b *testing.B) {
	for _, bc := range []struct {
		name, rate string
		keys       int
	}{
		{"6000-M/keys=64", "6000-M", 64},
		{"1000000-M/keys=1", "1000000-M", 1},
		{"100-M/keys=64000(no-lease)", "100-M", 64000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rate, err := parseRate(bc.rate)
			if err != nil {
				b.Fatal(err)
			}
			l := New(NewSlidingStore(redisClient(b, testenv.RedisURL(b)), testenv.KeyPrefix(b)), Options{})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { l.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			keys := make([]string, bc.keys)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
			}
			var n, allowed atomic.Int64
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if l.Take(context.Background(), keys[int(n.Add(1))%len(keys)], rate).Allowed {
						allowed.Add(1)
					}
				}
			})
			b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
		})
	}
}
