package edge

import (
	"net/netip"
	"testing"
)

// The client IP is the peer's unless a trusted proxy says otherwise, and
// nothing a client writes into the header itself is believed.
func TestClientAddress(t *testing.T) {
	trusted, ok := parseTrustedProxies([]string{"10.0.0.0/8", "192.0.2.7"})
	if !ok {
		t.Fatal("parseTrustedProxies refused an IP and a CIDR")
	}
	xff := clientAddress{header: "X-Forwarded-For", trusted: trusted}
	proxy, stranger := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("203.0.113.9")
	tests := []struct {
		name   string
		a      clientAddress
		peer   netip.Addr
		values []string
		want   string
	}{
		{"no proxy header configured", clientAddress{}, stranger, []string{"1.1.1.1"}, "203.0.113.9"},
		{"header from an untrusted peer", xff, stranger, []string{"1.1.1.1"}, "203.0.113.9"},
		{"trusted proxy, one address", xff, proxy, []string{"198.51.100.4"}, "198.51.100.4"},
		{"client prepends a forged address", xff, proxy, []string{"1.1.1.1, 198.51.100.4"}, "198.51.100.4"},
		{"two trusted proxies in a row", xff, proxy, []string{"198.51.100.4, 192.0.2.7, 10.9.9.9"}, "198.51.100.4"},
		{"several header lines", xff, proxy, []string{"1.1.1.1", "198.51.100.4, 10.0.0.1"}, "198.51.100.4"},
		{"only trusted addresses", xff, proxy, []string{"10.0.0.2, 10.0.0.1"}, "10.0.0.2"},
		{"malformed entry stops the walk", xff, proxy, []string{"1.1.1.1, not-an-ip, 10.0.0.1"}, "10.0.0.1"},
		{"address with a port", xff, proxy, []string{"198.51.100.4:5000"}, "198.51.100.4"},
		{"IPv6 with a port", xff, proxy, []string{"[2001:db8::1]:443"}, "2001:db8::1"},
		{"IPv4-mapped peer", xff, netip.MustParseAddr("::ffff:10.1.2.3"), []string{"198.51.100.4"}, "198.51.100.4"},
		{"empty header", xff, proxy, nil, "10.1.2.3"},
	}
	for _, tt := range tests {
		var values [][]byte
		for _, v := range tt.values {
			values = append(values, []byte(v))
		}
		if got := tt.a.of(tt.peer.Unmap(), values); got.String() != tt.want {
			t.Errorf("%s: client = %s, want %s", tt.name, got, tt.want)
		}
	}
	if _, ok := parseTrustedProxies([]string{"10.0.0.0/8", "proxy.local"}); ok {
		t.Error("parseTrustedProxies(a host name) = ok, want it refused")
	}
}

// Per-address limits count an IPv6 client by its /64, which one subscriber
// holds whole, and an IPv4 client by its address.
func TestAddressBucket(t *testing.T) {
	for ip, want := range map[string]string{
		"203.0.113.9":                      "203.0.113.9",
		"2001:db8:1:2:aaaa:bbbb:cccc:dddd": "2001:db8:1:2::/64",
		"2001:db8:1:2::1":                  "2001:db8:1:2::/64", // the same subscriber
		"2001:db8:1:3::1":                  "2001:db8:1:3::/64", // another one
		"fe80::1%eth0":                     "fe80::/64",
		"::ffff:192.0.2.1":                 "::ffff:192.0.2.1",
		"not an address":                   "not an address",
	} {
		if got := addressBucket(ip); got != want {
			t.Errorf("addressBucket(%q) = %q, want %q", ip, got, want)
		}
	}
}
