package edge

import (
	"sync"

	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/pkg/apikey"
)

// guessLookups counts, per client address (addressBucket), the uncached
// keys being looked up in the database for it, each with the requests
// that wait on its lookup: the requests of one key share its lookup (the
// key store's singleflight) and its place, so a platform's workers on a
// key not yet cached (after a restart) take one between them.
type guessLookups struct {
	mu      sync.Mutex
	address map[string]*addressLookups // only while it has lookups or peeks under way
}

type addressLookups struct {
	// keys counts the requests waiting on each key's lookup, by the key's
	// hash: the secret c.Get returns is the request's header buffer
	// (Immutable off), which fasthttp fills with the connection's next
	// request once the handler returns, while another request of the key
	// may still hold the place. Kept as the map's key, the place was then
	// lost, and its address kept it for good (one place fewer each time)
	// with whatever the buffer held next. A hash is a copy, and no secret.
	keys map[apikey.Hash]int
	// peeks counts the budget's reads under way (peeking to acquire).
	peeks int
	// ended counts the lookups ended: a budget read before one ended
	// may not show the failure authFailed took for it.
	ended uint64
}

// peeking notes a read of address's budget about to be sent, and returns
// what acquire compares with to count the lookups that end meanwhile.
func (l *guessLookups) peeking(address string) (since uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.address[address]
	if a == nil {
		if l.address == nil {
			l.address = make(map[string]*addressLookups)
		}
		a = &addressLookups{keys: make(map[apikey.Hash]int)}
		l.address[address] = a
	}
	a.peeks++
	return a.ended
}

// acquire ends the read peeking noted and counts a request waiting on
// secret's lookup, if the budget d allows it and has more left than the
// keys in lookup for address, counting those that ended since the read
// was sent (their failures may have reached the budget after it); it
// reports whether it counted one.
func (l *guessLookups) acquire(address, secret string, since uint64, d ratelimit.Decision) bool {
	key := apikey.HashOf(secret)
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.address[address]
	a.peeks--
	ok := d.Allowed && (a.keys[key] > 0 || int64(len(a.keys))+int64(a.ended-since) < d.Remaining)
	if ok {
		a.keys[key]++
	}
	l.dropIdle(address, a)
	return ok
}

// release gives back what acquire counted.
func (l *guessLookups) release(address, secret string) {
	key := apikey.HashOf(secret)
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.address[address]
	if a.keys[key]--; a.keys[key] == 0 {
		delete(a.keys, key)
	}
	a.ended++
	l.dropIdle(address, a)
}

// dropIdle forgets address once nothing is under way for it.
func (l *guessLookups) dropIdle(address string, a *addressLookups) {
	if len(a.keys) == 0 && a.peeks == 0 {
		delete(l.address, address)
	}
}
