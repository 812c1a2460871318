package shoplimit

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
)

// An IPv4 address is its own shop, however written; an IPv6 address is
// its /64, as the gateway buckets clients: a server holds a whole /64 and
// would otherwise get a fresh count for every address in it.
func TestShop(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"203.0.113.7", "203.0.113.7/32"},
		{"::ffff:203.0.113.7", "203.0.113.7/32"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2::ffff", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
	}
	for _, tt := range tests {
		if got := Shop(netip.MustParseAddr(tt.addr)).String(); got != tt.want {
			t.Errorf("Shop(%s) = %s, want %s", tt.addr, got, tt.want)
		}
	}
}

// A read counts once per shop however many of its connections reach it;
// past the cap a read of that shop is refused, and what a read held
// (every shop it reached, the one that refused it not among them) is freed
// by its Release.
func TestClaim(t *testing.T) {
	l := New(1)
	a, b := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::1")
	first := l.Claim()
	for _, addr := range []netip.Addr{a, a, b, netip.MustParseAddr("2001:db8::2")} {
		if err := first.Take(addr); err != nil {
			t.Fatalf("first.Take(%s) = %v, want nil: a read counts once per shop", addr, err)
		}
	}
	if got := l.Total(); got != 2 {
		t.Errorf("Total() with one read of two shops = %d, want 2", got)
	}
	second := l.Claim()
	if err := Take(With(context.Background(), second), b); !errors.Is(err, ErrBusy) {
		t.Errorf("second read of a shop at its cap = %v, want ErrBusy", err)
	}
	if shop, ok := second.Refused(); !ok || shop != Shop(b) {
		t.Errorf("second.Refused() = %v, %v, want %v, true", shop, ok, Shop(b))
	}
	second.Release()
	if got := l.InFlight(Shop(b)); got != 1 {
		t.Errorf("InFlight after the refused read's Release = %d, want 1 (the first read's)", got)
	}
	first.Release()
	if got := l.Total(); got != 0 {
		t.Errorf("Total() after every Release = %d, want 0", got)
	}
	if err := l.Claim().Take(b); err != nil {
		t.Errorf("a read once the shop is free = %v, want nil", err)
	}
}

// A Take once the read has ended counts nothing and is refused: net/http
// dials on in the background with the ended request's context values, and
// a count taken then was never released (the shop held its cap for good).
func TestTakeAfterReleaseCountsNothing(t *testing.T) {
	l := New(1)
	addr := netip.MustParseAddr("203.0.113.7")
	ended := l.Claim()
	ended.Release()
	if err := Take(With(context.Background(), ended), addr); !errors.Is(err, ErrEnded) {
		t.Errorf("Take of an ended read = %v, want ErrEnded", err)
	}
	if got := l.Total(); got != 0 {
		t.Errorf("Total() after a Take of an ended read = %d, want 0", got)
	}
	if err := l.Claim().Take(addr); err != nil {
		t.Errorf("a read of the shop after it = %v, want nil", err)
	}
}

// A connect that fails gives its count back, unless the read is connected
// to that shop (or dialling it) otherwise; one that succeeds keeps it until
// the read ends. A failed connect kept the count for the whole read: a name
// whose first address was a merchant's shop, on a port it does not serve,
// pinned the merchant's count while the read waited at the caller's server.
func TestAFailedConnectGivesItsCountBack(t *testing.T) {
	l := New(1)
	merchant, other := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("203.0.113.8")
	read := l.Claim()
	done, err := read.Dial(merchant)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Claim().Take(merchant); !errors.Is(err, ErrBusy) {
		t.Errorf("another read while the connect is in progress = %v, want ErrBusy", err)
	}
	done(false)
	if got := l.InFlight(Shop(merchant)); got != 0 {
		t.Errorf("InFlight after a failed connect = %d, want 0", got)
	}
	connected, err := read.Dial(other)
	if err != nil {
		t.Fatal(err)
	}
	connected(true)
	failed, err := read.Dial(other)
	if err != nil {
		t.Fatal(err)
	}
	failed(false)
	if got := l.InFlight(Shop(other)); got != 1 {
		t.Errorf("InFlight of a shop connected to, after another connect to it failed = %d, want 1", got)
	}
	read.Release()
	if got := l.Total(); got != 0 {
		t.Errorf("Total() after Release = %d, want 0", got)
	}
}

// Without a cap (0) nothing is counted or refused, and a context without a
// claim takes nothing.
func TestNoCap(t *testing.T) {
	l := New(0)
	c := l.Claim()
	if err := c.Take(netip.MustParseAddr("203.0.113.7")); err != nil {
		t.Errorf("Take without a cap = %v, want nil", err)
	}
	c.Release()
	if got := l.Total(); got != 0 {
		t.Errorf("Total() without a cap = %d, want 0", got)
	}
	if err := Take(context.Background(), netip.MustParseAddr("203.0.113.7")); err != nil {
		t.Errorf("Take of a context without a claim = %v, want nil", err)
	}
}

// BenchmarkClaim is a read's whole cost of the cap: its claim, the dial's
// Take, one Take per request on a connection it already counted (a read
// of a sample shop sends four), and the Release, reads of many shops at
// once.
func BenchmarkClaim(b *testing.B) {
	l := New(4)
	var next atomic.Uint32
	b.RunParallel(func(pb *testing.PB) {
		addr := netip.AddrFrom4([4]byte{203, 0, byte(next.Add(1)), 7})
		for pb.Next() {
			c := l.Claim()
			for range 5 {
				if err := c.Take(addr); err != nil {
					b.Fatal(err)
				}
			}
			c.Release()
		}
	})
}
