package testenv

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
)

// FreeAddr returns a loopback address with a port free at the time of the
// call, for a server the test starts itself (a binary's run, a process).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

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

// Health polls url (a service's /healthz) until its server answers, and
// returns the status and, for an error envelope, its code.
func Health(t testing.TB, url string) (status int, code string) {
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
