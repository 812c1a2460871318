// Package shoplimit bounds the reads in flight per shop
// (SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP), so that one slow shop cannot hold
// the process's slots (SHOP_SCHEMA_MAX_CONCURRENT) whatever number of
// client addresses call it.
//
// "One shop" is the address it is reached at, as the dial knows it: an
// IPv4 address, or the /64 of an IPv6 address (the gateway buckets its
// clients so). A host name alone would be bypassed by wildcard DNS: every
// name under a domain the caller holds resolves to one slow server. A read
// counts against each shop it reaches (guard.Dialer before each address
// dialed, prestashop's client on each connection a request gets, reused
// ones included), once per shop, until the read ends (Claim.Release).
package shoplimit

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
)

// ErrBusy refuses a read of a shop that already holds the per-shop cap.
var ErrBusy = errors.New("shoplimit: too many reads of this shop in progress")

// ErrEnded refuses a count for a read that has ended (Claim.Release ran).
// net/http dials in the background: a dial goes on after the request that
// asked for it is gone, with that request's context values (its claim
// among them) but not its cancellation, to keep the connection for a later
// request. A count such a dial took (the next address of a name, or the
// first once a slow lookup answered) would outlive the read's Release and
// hold its shop's cap for the life of the process.
var ErrEnded = errors.New("shoplimit: the read has ended")

// Limiter counts the reads in flight per shop. It is safe for concurrent
// use.
type Limiter struct {
	mu   sync.Mutex
	max  int
	held map[netip.Prefix]int
}

// New returns a Limiter of max reads per shop; nil (no cap) when max is 0.
func New(max int) *Limiter {
	if max <= 0 {
		return nil
	}
	return &Limiter{max: max, held: map[netip.Prefix]int{}}
}

// Max returns the cap per shop.
func (l *Limiter) Max() int { return l.max }

// Shop returns the shop addr belongs to: the IPv4 address (an IPv4-mapped
// one unmapped), or the IPv6 address's /64.
func Shop(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return netip.PrefixFrom(addr, 32)
	}
	p, _ := addr.Prefix(64)
	return p
}

// InFlight returns the reads counted against shop now.
func (l *Limiter) InFlight(shop netip.Prefix) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[shop]
}

// Total returns the counts of every shop together: 0 once every read has
// released its claim, and for a nil Limiter (no cap), which /metrics reads
// all the same.
func (l *Limiter) Total() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.held {
		n += c
	}
	return n
}

func (l *Limiter) take(shop netip.Prefix) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[shop] >= l.max {
		return false
	}
	l.held[shop]++
	return true
}

func (l *Limiter) release(shops []netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, shop := range shops {
		if l.held[shop]--; l.held[shop] <= 0 {
			delete(l.held, shop) // a map of every shop ever read would only grow
		}
	}
}

// Claim is one read's counts: the shops it reached. Its fetches run
// concurrently, so it has a lock of its own.
type Claim struct {
	limiter *Limiter
	mu      sync.Mutex
	shops   []*reach     // few: a shop's addresses, a redirect's
	refused netip.Prefix // the shop that refused it, if one did
	ended   bool         // Release ran: nothing more is counted (ErrEnded)
}

// reach is a shop a read counts against: one it is connected to, which
// keeps the count until the read ends, or one it is only dialling, which
// gives it back once every such connect has failed (Dial).
type reach struct {
	shop      netip.Prefix
	connected bool
	dialling  int
}

// Claim starts a read's claim; nil when l is (no cap).
func (l *Limiter) Claim() *Claim {
	if l == nil {
		return nil
	}
	return &Claim{limiter: l}
}

// Take counts the read against the shop of addr, once, for the rest of
// the read (a connection to it: net/http's GotConn), and returns ErrBusy
// when that shop already holds the cap, ErrEnded once the read has ended.
// A nil Claim takes nothing.
func (c *Claim) Take(addr netip.Addr) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, err := c.reachLocked(Shop(addr))
	if err != nil {
		return err
	}
	r.connected = true
	return nil
}

// Dial counts the read against the shop of addr for a connect to it, as
// Take refuses, and returns done, which the dialer calls with the
// connect's outcome: connected, the count stays the read's; failed, it is
// given back unless the read is connected to that shop or dialling it
// otherwise. A read waiting on a connect holds its shop's count, but a
// connect refused at once does not pin it: a name whose first address is
// a merchant's shop, on a port the shop does not serve, and whose next is
// the caller's slow server would otherwise hold the merchant's count for
// the whole read.
func (c *Claim) Dial(addr netip.Addr) (done func(connected bool), err error) {
	if c == nil {
		return func(bool) {}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, err := c.reachLocked(Shop(addr))
	if err != nil {
		return nil, err
	}
	r.dialling++
	return func(connected bool) { c.dialled(r, connected) }, nil
}

// dialled ends one connect of r (Dial's done).
func (c *Claim) dialled(r *reach, connected bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.dialling--
	r.connected = r.connected || connected
	if c.ended || r.connected || r.dialling > 0 {
		return // Release gave it back already, or the read still holds it
	}
	c.limiter.release([]netip.Prefix{r.shop})
	c.shops = slices.DeleteFunc(c.shops, func(held *reach) bool { return held == r })
}

// reachLocked returns the read's reach of shop, counting the read against
// it first if it is not yet.
func (c *Claim) reachLocked(shop netip.Prefix) (*reach, error) {
	if c.ended {
		return nil, ErrEnded
	}
	for _, held := range c.shops {
		if held.shop == shop {
			return held, nil
		}
	}
	if !c.limiter.take(shop) {
		c.refused = shop
		return nil, ErrBusy
	}
	r := &reach{shop: shop}
	c.shops = append(c.shops, r)
	return r, nil
}

// Refused returns the shop that refused the read, if one did.
func (c *Claim) Refused() (netip.Prefix, bool) {
	if c == nil {
		return netip.Prefix{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused, c.refused.IsValid()
}

// Release frees every count of the read, and refuses any later Take
// (ErrEnded). Called when the read ends.
func (c *Claim) Release() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	shops := make([]netip.Prefix, len(c.shops))
	for i, r := range c.shops {
		shops[i] = r.shop
	}
	c.limiter.release(shops)
	c.shops, c.ended = nil, true
}

type claimKey struct{}

// With returns ctx carrying c, for the dialer and the client to take.
func With(ctx context.Context, c *Claim) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, claimKey{}, c)
}

// Claimed reports whether ctx carries a read's claim: false without a cap,
// where the client then traces nothing to count.
func Claimed(ctx context.Context) bool {
	_, ok := ctx.Value(claimKey{}).(*Claim)
	return ok
}

// Take counts the read of ctx against addr's shop (Claim.Take); nil when
// ctx carries no claim.
func Take(ctx context.Context, addr netip.Addr) error {
	c, _ := ctx.Value(claimKey{}).(*Claim)
	return c.Take(addr)
}

// Dial counts the read of ctx against addr's shop for a connect
// (Claim.Dial); a done that does nothing when ctx carries no claim.
func Dial(ctx context.Context, addr netip.Addr) (done func(connected bool), err error) {
	c, _ := ctx.Value(claimKey{}).(*Claim)
	return c.Dial(addr)
}
