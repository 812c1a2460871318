package edge

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
)

// inFlightRequests names the requests in the handler, so that a drain that
// runs out of time can say which it cut off: their clients see the
// connection close with no answer and no request id, and the gateway
// writes no access line and exports no server span for them, and the
// drain's own WARN only counts them.
//
// Each request's entry is what it is named by, copied as it starts (the
// handler goes on writing its request while the drain reads these), in
// one of several shards, so that requests on other cores rarely wait on
// one lock.
type inFlightRequests struct {
	next   atomic.Uint64
	shards [inFlightShards]inFlightShard
}

const inFlightShards = 16

type inFlightShard struct {
	mu sync.Mutex
	m  map[uint64]inFlightEntry
}

// inFlightEntry is how a line names a request cut off: what its client can
// quote (its address, the time, the method and path, its own X-Request-Id)
// and the request id its spans and the services' lines carry.
type inFlightEntry struct {
	id, method, route, path, clientIP, clientRequestID string
	start                                              time.Time
}

// add records rq as in flight and returns the ticket remove takes.
func (f *inFlightRequests) add(rq *request) uint64 {
	n := f.next.Add(1)
	sh := &f.shards[n%inFlightShards]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[uint64]inFlightEntry)
	}
	sh.m[n] = inFlightEntry{id: rq.id, method: rq.method, route: rq.route, path: rq.path,
		clientIP: rq.clientIP, clientRequestID: rq.clientRequestID, start: rq.start}
	sh.mu.Unlock()
	return n
}

func (f *inFlightRequests) remove(n uint64) {
	sh := &f.shards[n%inFlightShards]
	sh.mu.Lock()
	delete(sh.m, n)
	sh.mu.Unlock()
}

// maxCutOffLines bounds the lines of one drain's cut-off: a gateway stopped
// under a flood of hung calls names this many, and the WARN before them
// says how many there were.
const maxCutOffLines = 1000

// logCutOff writes a WARN for each request still in flight (at most
// maxCutOffLines), with the fields of its access line that it had when it
// started, the path written as that line writes one (cut at 128
// characters; made so here, not as each request starts).
func (f *inFlightRequests) logCutOff(log *slog.Logger, now time.Time) {
	for _, e := range f.inFlight(maxCutOffLines) {
		attrs := []any{"method", e.method, "route", e.route, "path", httpserver.LoggableClientValue(e.path), "client_ip", e.clientIP,
			"duration_ms", float64(now.Sub(e.start).Microseconds()) / 1000, "request_id", e.id, "trace_id", e.id}
		if e.clientRequestID != "" {
			attrs = append(attrs, "client_request_id", e.clientRequestID)
		}
		log.Warn("request cut off by the drain", attrs...)
	}
}

// inFlight copies at most limit of the requests in flight, each shard's
// under its lock, so that their lines are written with none held: a log
// writer that blocks (a full pipe to the log collector) would otherwise
// keep every request that ends or starts meanwhile waiting on the shard.
func (f *inFlightRequests) inFlight(limit int) []inFlightEntry {
	var entries []inFlightEntry
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if len(entries) == limit {
				break
			}
			entries = append(entries, e)
		}
		sh.mu.Unlock()
	}
	return entries
}
