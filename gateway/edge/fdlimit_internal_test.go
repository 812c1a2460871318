package edge

import (
	"strings"
	"syscall"
	"testing"

	"github.com/coinexport/export/gateway/lingerclose"
)

// The room a descriptor limit leaves for client connections is what the
// gateway may hold besides them taken off: 1,024 + 256 lingering, 256
// refusals waiting, 512 connections and a probe's to each of 3 instances,
// the Redis pool (640: 10 per GOMAXPROCS of 64), 64 others.
func TestRoomForClients(t *testing.T) {
	cfg := Config{ExportReaderURLs: []string{"a"}, SalesWriterURLs: []string{"b"}, ShopSchemaURLs: []string{"c"}, UpstreamMaxConns: 512}
	const redisPool = 640
	const besides = 1024 + 256 + 256 + 3*(512+1) + redisPool + 64
	for limit, want := range map[uint64]uint64{1024: 0, besides: 0, besides + 4096: 4096, 1 << 20: 1<<20 - besides} {
		if got := roomForClients(limit, cfg, lingerclose.Defaults, redisPool); got != want {
			t.Errorf("roomForClients(%d) with a Redis pool of %d = %d, want %d", limit, redisPool, got, want)
		}
	}
}

// A cap the descriptor limit leaves no room for is said at start: the
// gateway then never refuses a connection 503, and new ones wait
// unanswered in the backlog once it is out of descriptors.
func TestACapPastTheDescriptorLimitIsSaidAtStart(t *testing.T) {
	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Fatal(err)
	}
	const limit = 8192 // below any cap of 7,000 once the gateway's others are taken off
	if was.Cur < limit {
		t.Skipf("the descriptor limit is %d, under the %d the test sets", was.Cur, limit)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: limit, Max: was.Max}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
			t.Errorf("restoring the descriptor limit: %v", err)
		}
	})
	const warning = "GATEWAY_MAX_CONNECTIONS is more than the file descriptor limit leaves room for"
	for capValue, warns := range map[string]bool{"7000": true, "1000": false, "0": false} {
		_, _, logs := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": capValue}, fakeKeys{})
		if got := strings.Contains(logs.String(), warning); got != warns {
			t.Errorf("GATEWAY_MAX_CONNECTIONS=%s under a limit of %d: warned %v, want %v: %s", capValue, limit, got, warns, logs.String())
		}
	}
}
