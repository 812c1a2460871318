//go:build race

package rawio_test

import (
	"testing"
)

// A byte written to a socket happens before its read on the other end,
// for the race detector as for net's own sockets, either way between a
// wrapped socket and a stock one (a test's client and a server's
// connection): a handler and the test that called it may share state
// ordered by the request and its answer alone. Run with -race, where
// this test is built; the detector fails it if either order is lost.
func TestAWriteHappensBeforeItsReadForTheRaceDetector(t *testing.T) {
	w, peer := tcpPair(t)
	var sentToWrapped, sentToPeer int
	seen := make(chan int)
	go func() {
		if _, err := w.Read(make([]byte, 1)); err != nil {
			t.Error(err)
		}
		seen <- sentToWrapped
	}()
	sentToWrapped = 1
	if _, err := peer.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got != 1 {
		t.Fatalf("the wrapped side saw %d after its read, want 1", got)
	}

	go func() {
		sentToPeer = 2
		if _, err := w.Write([]byte("b")); err != nil {
			t.Error(err)
		}
	}()
	if _, err := peer.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if sentToPeer != 2 {
		t.Fatalf("the peer saw %d after its read, want 2", sentToPeer)
	}
}
