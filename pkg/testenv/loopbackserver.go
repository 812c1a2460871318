package testenv

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// LoopbackServer returns an httptest server of h, not started, listening
// on a loopback port from FreeAddr (below the ephemeral range, which
// another test binary's ":0" listens take from); the test starts it
// (Start, StartTLS), and it is closed when the test ends.
//
// The listener httptest.NewUnstartedServer opened is closed before its
// own takes its place: dropped, it listened on until a garbage collection
// closed it, in whichever test was running then, and an out-of-descriptors
// test's dial was given its number (gateway/upstream's
// TestOutOfDescriptorsNoInstanceIsBlamed, c49aafb).
func LoopbackServer(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	t.Cleanup(srv.Close)
	return srv
}
