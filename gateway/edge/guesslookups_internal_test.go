package edge

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/ratelimit"
)

// An address's keys in lookup at once are bounded by what its guess
// budget has left, where the requests of one key share its lookup and its
// place (a platform's workers on a key not yet cached), and a lookup that
// ended while the budget was read counts still: its failure may have
// reached the budget after the read.
func TestGuessLookupsShareAKeysPlaceAndCountThoseEndedDuringARead(t *testing.T) {
	var l guessLookups
	left := func(n int64) ratelimit.Decision { return ratelimit.Decision{Allowed: n > 0, Remaining: n} }
	acquire := func(address, secret string, d ratelimit.Decision) bool {
		return l.acquire(address, secret, l.peeking(address), d)
	}
	for i := range 3 {
		if !acquire("a", "k1", left(2)) {
			t.Fatalf("request %d of one key on a budget of 2 refused; want them to share its lookup", i+1)
		}
	}
	if !acquire("a", "k2", left(2)) {
		t.Fatal("a second key on a budget of 2 refused")
	}
	if acquire("a", "k3", left(2)) {
		t.Fatal("a third key on a budget of 2 taken; want it refused")
	}
	if !acquire("b", "k3", left(2)) {
		t.Fatal("another address's key refused: want each address counted apart")
	}
	if acquire("a", "k1", left(0)) {
		t.Fatal("a key in lookup joined on a spent budget; want it refused")
	}
	// k2's lookup ends while a read of the budget is under way (the read
	// sent before its failure was taken): the read's 2 left still counts it.
	since := l.peeking("a")
	l.release("a", "k2")
	if l.acquire("a", "k4", since, left(2)) {
		t.Fatal("a key taken on a read sent before a lookup's end, counting it as ended; want it refused")
	}
	if !acquire("a", "k4", left(2)) {
		t.Fatal("a key refused on a read sent after the lookup's end")
	}
	for range 3 {
		l.release("a", "k1")
	}
	l.release("a", "k4")
	l.release("b", "k3")
	if len(l.address) != 0 {
		t.Errorf("addresses kept with nothing under way: %v", l.address)
	}
}

// heldKeys holds each lookup of key that its budget allows until told to
// go on (one per value sent on proceed), then refuses it as unknown; any
// other key is refused at once.
type heldKeys struct {
	key     string
	arrived chan struct{}
	proceed chan struct{}
}

func (h heldKeys) Lookup(_ context.Context, secret string, mayFetch func() bool) (keystore.Key, error) {
	if secret != h.key {
		return keystore.Key{}, keystore.ErrUnknownKey
	}
	if !mayFetch() {
		return keystore.Key{}, keystore.ErrThrottled
	}
	h.arrived <- struct{}{}
	<-h.proceed
	return keystore.Key{}, keystore.ErrUnknownKey
}

func (heldKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

// A key's place among its address's lookups outlives the request that took
// it when another request of the key still waits on the lookup: what names
// the place must not be that request's header. With Immutable off
// (app.go), c.Get's string is the request's buffer, which fasthttp fills
// with the connection's next request once the handler returns; kept as the
// map's key, the place could no longer be found, the last request's
// release counted a new one down to -1 instead, and the address kept both
// for good (each such pair one place fewer, for as long as the gateway
// ran; with what the buffer held next, other keys included, in memory).
func TestGuessLookupsOutliveTheHeaderThatNamedThem(t *testing.T) {
	keys := heldKeys{key: wellFormedKey(t), arrived: make(chan struct{}), proceed: make(chan struct{})}
	g, _, _ := startInternal(t, map[string]string{"RATE_LIMIT_AUTH_FAILURES": "60-M"}, keys)
	url := "http://" + g.Addr() + "/v1/export/items"
	// Two connections, each kept alive: one per request of the key.
	clients := [2]*http.Client{{Transport: &http.Transport{}}, {Transport: &http.Transport{}}}
	send := func(c *http.Client, key string) int {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := c.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // the status is what counts
		resp.Body.Close()
		return resp.StatusCode
	}
	done := [2]chan int{make(chan int, 1), make(chan int, 1)}
	for i := range clients {
		go func() { done[i] <- send(clients[i], keys.key) }()
		<-keys.arrived
	}
	keys.proceed <- struct{}{}
	var first int
	select {
	case <-done[0]:
	case <-done[1]:
		first = 1
	}
	// The first one's connection carries another key, of the same length,
	// while the other request of the key still waits on its lookup.
	if status := send(clients[first], wellFormedKey(t)); status != http.StatusUnauthorized {
		t.Errorf("another key = %d, want 401", status)
	}
	keys.proceed <- struct{}{}
	<-done[1-first]
	g.guessLookups.mu.Lock()
	defer g.guessLookups.mu.Unlock()
	if a := g.guessLookups.address["127.0.0.1"]; a != nil {
		t.Errorf("the address keeps %d keys in lookup with none under way", len(a.keys))
	}
}

// panicAfterBudgetKeys takes its budget's place, then panics.
type panicAfterBudgetKeys struct{}

func (panicAfterBudgetKeys) Lookup(_ context.Context, _ string, mayFetch func() bool) (keystore.Key, error) {
	mayFetch()
	panic("boom after the budget was asked")
}

func (panicAfterBudgetKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

// A lookup that panics once its budget gave it a place among its address's
// keys in lookup gives the place back: kept, each such panic would leave
// the address one place fewer for as long as the gateway ran.
func TestALookupThatPanicsGivesItsPlaceBack(t *testing.T) {
	g, _, _ := startInternal(t, nil, panicAfterBudgetKeys{})
	resp, env := get(t, "http://"+g.Addr()+"/v1/export/items", map[string]string{"X-API-Key": wellFormedKey(t)})
	if resp.StatusCode != 500 || env.Error == nil || env.Error.Code != "internal_error" {
		t.Fatalf("GET with a lookup panicking = %d %+v, want 500 internal_error", resp.StatusCode, env.Error)
	}
	g.guessLookups.mu.Lock()
	defer g.guessLookups.mu.Unlock()
	if a := g.guessLookups.address["127.0.0.1"]; a != nil {
		t.Errorf("the address keeps %d keys in lookup after the lookup panicked", len(a.keys))
	}
}
