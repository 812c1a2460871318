package edge

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// of is read's client IP alone, what most of these tests hold.
func (a clientAddress) of(peer netip.Addr, values [][]byte) netip.Addr {
	client, _ := a.read(peer, values)
	return client
}

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
		// Empty list elements are skipped, as the lines joined into one read.
		{"empty element", xff, proxy, []string{"198.51.100.4,, 10.0.0.1"}, "198.51.100.4"},
		{"empty element ending a line", xff, proxy, []string{"198.51.100.4,", "10.0.0.1"}, "198.51.100.4"},
		{"empty element starting a line", xff, proxy, []string{"198.51.100.4", ",10.0.0.1"}, "198.51.100.4"},
		{"blank line", xff, proxy, []string{"198.51.100.4", " "}, "198.51.100.4"},
		// A zone names the writer's interface, and holds any text.
		{"IPv6 with a zone", xff, proxy, []string{"fe80::1%eth0 <b>\"x\"</b>"}, "fe80::1"},
		{"IPv6 with a zone and a port", xff, proxy, []string{"[fe80::1%25eth0]:443"}, "fe80::1"},
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
	// An IPv4-mapped CIDR trusts the IPv4 addresses it spans, as a mapped
	// address does: kept as an IPv6 prefix, it trusted none.
	mapped, ok := parseTrustedProxies([]string{"::ffff:10.0.0.0/104", "::ffff:192.0.2.7/128"})
	if !ok {
		t.Fatal("parseTrustedProxies refused IPv4-mapped CIDRs")
	}
	behind := clientAddress{header: "X-Forwarded-For", trusted: mapped}
	for _, peer := range []netip.Addr{proxy, netip.MustParseAddr("192.0.2.7")} {
		if got := behind.of(peer, [][]byte{[]byte("198.51.100.4")}); got.String() != "198.51.100.4" {
			t.Errorf("behind %s, trusted as %v: client = %s, want 198.51.100.4", peer, mapped, got)
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

// The client IP is the one the reference reads: the peer's unless a
// trusted proxy sent the header, then the right-most entry that is not a
// trusted proxy, none left of a malformed one, empty list elements
// ignored (RFC 9110 5.6.1). The header's lines read as the one line they
// join into (RFC 9110 5.3), and the per-address limits count the client
// by its whole IPv4 address or its IPv6 /64. The seeds are
// TestClientAddress's.
func FuzzClientAddress(f *testing.F) {
	const trusted = "10.0.0.0/8,192.0.2.7"
	for _, tt := range []struct{ peer, header string }{
		{"203.0.113.9", "1.1.1.1"}, {"10.1.2.3", "198.51.100.4"}, {"10.1.2.3", "1.1.1.1, 198.51.100.4"},
		{"10.1.2.3", "198.51.100.4, 192.0.2.7, 10.9.9.9"}, {"10.1.2.3", "1.1.1.1\n198.51.100.4, 10.0.0.1"},
		{"10.1.2.3", "10.0.0.2, 10.0.0.1"}, {"10.1.2.3", "1.1.1.1, not-an-ip, 10.0.0.1"}, {"10.1.2.3", "198.51.100.4:5000"},
		{"10.1.2.3", "[2001:db8::1]:443"}, {"::ffff:10.1.2.3", "198.51.100.4"}, {"10.1.2.3", ""},
		{"10.1.2.3", "6.6.6.6\n,10.0.0.1"}, {"10.1.2.3", "6.6.6.6,,10.0.0.1"}, {"10.1.2.3", "1.1.1.1,\n10.0.0.1"},
		{"10.1.2.3", "2001:db8:1:2::1, fe80::1%eth0"}, {"10.1.2.3", "\n\n"},
	} {
		f.Add(tt.peer, trusted, tt.header, true)
	}
	f.Add("2001:db8::1", "2001:db8::/32", "2001:db8:1:2:aaaa:bbbb:cccc:dddd", true)
	f.Add("203.0.113.9", "", "1.1.1.1", false)
	f.Fuzz(func(t *testing.T, peerText, trustedText, header string, configured bool) {
		peer, err := netip.ParseAddr(peerText)
		if err != nil || peer.Zone() != "" {
			t.Skip() // a connection's peer is an address, without a zone
		}
		peer = peer.Unmap()
		var entries []string
		if trustedText != "" {
			entries = strings.Split(trustedText, ",")
		}
		prefixes, ok := parseTrustedProxies(entries)
		if !ok {
			t.Skip()
		}
		a := clientAddress{trusted: prefixes}
		if configured {
			a.header = "X-Forwarded-For"
		}
		lines := strings.Split(header, "\n")
		var values [][]byte
		for _, line := range lines {
			values = append(values, []byte(line))
		}
		got := a.of(peer, values)
		if want := referenceClient(a, peer, lines); got != want {
			t.Fatalf("client of peer %s, trusted %q, header lines %q = %s, want %s", peer, trustedText, lines, got, want)
		}
		if joined := a.of(peer, [][]byte{[]byte(strings.Join(lines, ", "))}); joined != got {
			t.Fatalf("client of peer %s, trusted %q, header lines %q = %s, but %s once they are joined", peer, trustedText, lines, got, joined)
		}
		bucket := addressBucket(got.String())
		if got.Is6() {
			p, err := netip.ParsePrefix(bucket)
			if err != nil || p.Bits() != 64 || !p.Contains(got.WithZone("")) {
				t.Fatalf("addressBucket(%s) = %q, want its /64", got, bucket)
			}
		} else if bucket != got.String() {
			t.Fatalf("addressBucket(%s) = %q, want the address", got, bucket)
		}
	})
}

// referenceClient is clientAddress.of written plainly, for the fuzz target.
func referenceClient(a clientAddress, peer netip.Addr, lines []string) netip.Addr {
	if a.header == "" || !a.isTrusted(peer) {
		return peer
	}
	var entries []string
	for _, e := range strings.Split(strings.Join(lines, ","), ",") {
		if strings.TrimSpace(e) != "" {
			entries = append(entries, e)
		}
	}
	client := peer
	for _, e := range slices.Backward(entries) {
		addr, err := netip.ParseAddr(strings.TrimSpace(e))
		if err != nil {
			ap, err := netip.ParseAddrPort(strings.TrimSpace(e))
			if err != nil {
				return client
			}
			addr = ap.Addr()
		}
		client = addr.Unmap().WithZone("")
		if !a.isTrusted(client) {
			return client
		}
	}
	return client
}

// entryShape says what an entry is made of without quoting it.
func TestEntryShape(t *testing.T) {
	for entry, want := range map[string]string{
		" https ":              "5 bytes: letters",
		"shop.example.com:443": "20 bytes: letters, digits, '.', ':'",
		"Bearer a.b.c":         "12 bytes: letters, spaces, '.'",
		"é":                    "2 bytes: other bytes",
	} {
		if got := entryShape([]byte(entry)); got != want {
			t.Errorf("entryShape(%q) = %q, want %q", entry, got, want)
		}
	}
}
