package testenv

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
)

// FreeAddr returns a loopback address with a port free at the time of the
// call, for a server the test starts itself (a binary's run, a process).
// It never returns one address twice in a test binary: the kernel may hand
// a port just closed to the next caller, and two servers of one stack were
// then given the same one.
func FreeAddr(t testing.TB) string {
	t.Helper()
	givenMu.Lock()
	defer givenMu.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !given[addr] {
			given[addr] = true
			return addr
		}
	}
	t.Fatal("testenv: no loopback port that was not handed out already")
	return ""
}

// given holds the addresses FreeAddr returned.
var (
	givenMu sync.Mutex
	given   = map[string]bool{}
)

// Output collects what a server under test writes (its logs) while the
// test reads it: writes and reads may come from different goroutines.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// WantUnreadyUntilMigrated checks a service's readiness against the schema:
// start runs the service's binary on a database one migration behind the
// build, listening on addr and logging to logs, and returns the function
// that stops it. Its /healthz must answer 503 not_ready, with a log line
// saying what to run, until the migration is there, and 200 after.
func WantUnreadyUntilMigrated(t *testing.T, start func(dsn, addr string, logs *Output) (stop func())) {
	t.Helper()
	dsn := PostgresURL(t)
	migrated := forgetLatestMigration(t, dsn)
	addr := FreeAddr(t)
	var out Output
	defer start(dsn, addr, &out)()
	url := "http://" + addr + "/healthz"
	if status, code := health(t, url); status != http.StatusServiceUnavailable || code != "not_ready" {
		t.Errorf("/healthz with the schema behind = %d %q, want 503 not_ready", status, code)
	}
	if !strings.Contains(out.String(), "run exportctl migrate") {
		t.Errorf("the log does not say what to run:\n%s", out.String())
	}
	migrated()
	if status, code := health(t, url); status != http.StatusOK {
		t.Errorf("/healthz once migrated = %d %q, want 200", status, code)
	}
}

// health polls url (a service's /healthz) until its server answers, and
// returns the status and, for an error envelope, its code.
func health(t testing.TB, url string) (status int, code string) {
	t.Helper()
	var resp *http.Response
	var err error
	for range 100 {
		if resp, err = http.Get(url); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("testenv: %s never answered: %v", url, err)
	}
	defer resp.Body.Close()
	var body envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("testenv: %s: %v", url, err)
	}
	if body.Error != nil {
		code = body.Error.Code
	}
	return resp.StatusCode, code
}
