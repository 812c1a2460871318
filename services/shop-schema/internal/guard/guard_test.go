package guard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
	"github.com/coinexport/export/services/shop-schema/internal/shoplimit"
)

func newGuard(t *testing.T, allow ...string) *Guard {
	t.Helper()
	g, err := New(DefaultPorts, allow)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// outcome names the sentinel an error wraps, so table rows stay short.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNotHTTPS):
		return "https"
	case errors.Is(err, ErrNotAllowed):
		return "refused"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrNoSuchHost):
		return "no such host"
	case errors.Is(err, ErrUnresolvable):
		return "unresolvable"
	}
	return "other: " + err.Error()
}

func TestParseBaseURL(t *testing.T) {
	g := newGuard(t)
	tests := []struct {
		in, want string
		wantURL  string // normalised URL when want is "ok"
	}{
		// accepted
		{"https://shop.example.com", "ok", "https://shop.example.com"},
		{"https://shop.example.com/", "ok", "https://shop.example.com"},
		{"  https://Shop.Example.COM/prestashop/  ", "ok", "https://shop.example.com/prestashop"},
		{"https://shop.example.com:443/a/b", "ok", "https://shop.example.com/a/b"},
		{"https://shop.example.com:8443", "ok", "https://shop.example.com:8443"},
		{"https://shop.example.com./", "ok", "https://shop.example.com"},
		{"https://магазин.рф/", "ok", "https://xn--80aairftm.xn--p1ai"},
		{"https://8.8.8.8/", "ok", "https://8.8.8.8"},
		{"https://[2606:4700::1111]/", "ok", "https://[2606:4700::1111]"},
		{"https://[2606:4700::1111]:8443/", "ok", "https://[2606:4700::1111]:8443"},
		// syntax
		{"", "invalid", ""},
		{"shop.example.com", "invalid", ""},
		{"//shop.example.com", "invalid", ""},
		{"https://", "invalid", ""},
		{"https:shop.example.com", "invalid", ""},
		{"https://user:pass@shop.example.com", "invalid", ""},
		{"https://0123456789abcdef0123456789abcdef@shop.example.com", "invalid", ""},
		{"https://@shop.example.com", "invalid", ""},
		{"https://shop.example.com@127.0.0.1", "invalid", ""},
		{"https://shop.example.com\\@127.0.0.1", "invalid", ""},
		{"https://shop.example.com/?ws_key=x", "invalid", ""},
		{"https://shop.example.com/?", "invalid", ""},
		{"https://shop.example.com/#top", "invalid", ""},
		{"https://shop.example.com#", "invalid", ""},
		{"https://shop.example.com:0", "invalid", ""},
		{"https://shop.example.com:65536", "invalid", ""},
		{"https://shop.example.com:", "invalid", ""},
		{"https://shop.example.com:443:443", "invalid", ""},
		{"https://shop.example.com:-1", "invalid", ""},
		{"https://shop_example.com", "invalid", ""},
		{"https://-shop.example.com", "invalid", ""},
		{"https://shop..example.com", "invalid", ""},
		{"https://" + strings.Repeat("a", 64) + ".com", "invalid", ""},
		{"https://" + strings.Repeat("a.", 1100) + "com", "invalid", ""},
		{"https://1.2.3.4.5", "invalid", ""},
		{"https://256.1.1.1", "invalid", ""},
		{"https://0x1g.1", "invalid", ""},
		// An IPv4 number too large is an invalid address, not a name.
		{"https://0x100000000", "invalid", ""},
		{"https://shop.0x1ffffffff/", "invalid", ""},
		{"https://1.2.3.0400/", "invalid", ""},
		{"https://shop.0x/", "invalid", ""},              // "0x" is the number 0, and "shop" no number
		{"https://shop.%80.example.com/", "invalid", ""}, // not UTF-8: idna made it U+FFFD, xn--zn7c
		{"https://0.\x80", "invalid", ""},
		{"https://134744072/", "invalid", ""}, // 8.8.8.8 in decimal: a disguise
		{"https://[fe80::1%25eth0]/", "refused", ""},
		{"https://[::1", "invalid", ""},
		// scheme
		{"http://shop.example.com", "https", ""},
		{"HTTP://shop.example.com", "https", ""},
		{"ftp://shop.example.com", "https", ""},
		{"file:///etc/passwd", "https", ""},
		{"gopher://127.0.0.1:6379/_INFO", "https", ""},
		{"javascript:alert(1)", "https", ""},
		// loopback in every spelling
		{"https://127.0.0.1/", "refused", ""},
		{"https://127.0.0.1:8443/", "refused", ""},
		{"https://127.1/", "refused", ""},
		{"https://127.0.1/", "refused", ""},
		{"https://2130706433/", "refused", ""},
		{"https://017700000001/", "refused", ""},
		{"https://0177.0.0.1/", "refused", ""},
		{"https://0x7f.0.0.1/", "refused", ""},
		{"https://0x7f000001/", "refused", ""},
		{"https://0X7F.1/", "refused", ""},
		{"https://127.0.0.1./", "refused", ""},
		{"https://%31%32%37.0.0.1/", "invalid", ""},
		{"https://１２７.０.０.１/", "refused", ""},
		{"https://127。0。0。1/", "refused", ""},
		{"https://[::1]/", "refused", ""},
		{"https://[0:0:0:0:0:0:0:1]/", "refused", ""},
		{"https://[::ffff:127.0.0.1]/", "refused", ""},
		{"https://[::ffff:7f00:1]/", "refused", ""},
		{"https://[::127.0.0.1]/", "refused", ""},
		{"https://localhost/", "refused", ""},
		{"https://LOCALHOST./", "refused", ""},
		{"https://shop.localhost/", "refused", ""},
		// unspecified
		{"https://0.0.0.0/", "refused", ""},
		{"https://0/", "refused", ""},
		{"https://[::]/", "refused", ""},
		// private, CGNAT, link-local and metadata
		{"https://10.0.0.1/", "refused", ""},
		{"https://10.255.255.255/", "refused", ""},
		{"https://172.16.0.1/", "refused", ""},
		{"https://172.31.255.254/", "refused", ""},
		{"https://192.168.1.1/", "refused", ""},
		{"https://0xc0.0xa8.1.1/", "refused", ""},
		{"https://100.64.0.1/", "refused", ""},
		{"https://100.100.100.200/", "refused", ""}, // Alibaba metadata
		{"https://169.254.169.254/", "refused", ""}, // AWS, GCP, Azure metadata
		{"https://2852039166/", "refused", ""},      // 169.254.169.254 in decimal
		{"https://168.63.129.16/", "refused", ""},   // Azure wire server
		{"https://192.0.0.192/", "refused", ""},     // Oracle metadata (IETF block)
		{"https://[fd00:ec2::254]/", "refused", ""}, // AWS IPv6 metadata
		{"https://[::ffff:169.254.169.254]/", "refused", ""},
		{"https://metadata/", "refused", ""},
		{"https://metadata.google.internal/", "refused", ""},
		{"https://printer.local/", "refused", ""},
		{"https://kubernetes.default.svc/", "refused", ""}, // a cluster's API server, by its search-domain name
		{"https://export-reader.prod.svc/", "refused", ""},
		{"https://shop.svc.example.com/", "ok", "https://shop.svc.example.com"}, // .svc inside a public name: a shop like any
		// names that are never in DNS (RFC 6761, 7686, 9476): refused without a lookup
		{"https://shop.invalid/", "invalid", ""},
		{"https://SHOP.INVALID./", "invalid", ""},
		{"https://duckduckgogg42xjoc72x3sjasowoarfbgcmvfimaftt6twagswzczad.onion/", "invalid", ""},
		{"https://shop.alt/", "invalid", ""},
		{"https://invalid.example.com/", "ok", "https://invalid.example.com"}, // only as the last label
		// IPv6 special ranges and embeddings
		{"https://[fc00::1]/", "refused", ""},
		{"https://[fdff:ffff::1]/", "refused", ""},
		{"https://[fe80::1]/", "refused", ""},
		{"https://[ff02::1]/", "refused", ""},
		{"https://[64:ff9b::7f00:1]/", "refused", ""},                      // NAT64 of 127.0.0.1
		{"https://[64:ff9b::a00:1]/", "refused", ""},                       // NAT64 of 10.0.0.1
		{"https://[64:ff9b:1::a9fe:a9fe]/", "refused", ""},                 // local-use NAT64
		{"https://[2002:7f00:1::]/", "refused", ""},                        // 6to4 of 127.0.0.1
		{"https://[2002:a9fe:a9fe::]/", "refused", ""},                     // 6to4 of metadata
		{"https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "refused", ""}, // Teredo
		{"https://[2001:db8::1]/", "refused", ""},
		// multicast, reserved, broadcast
		{"https://224.0.0.1/", "refused", ""},
		{"https://239.255.255.250/", "refused", ""},
		{"https://240.0.0.1/", "refused", ""},
		{"https://255.255.255.255/", "refused", ""},
		// odd ports
		{"https://shop.example.com:22/", "refused", ""},
		{"https://shop.example.com:80/", "refused", ""},
		{"https://8.8.8.8:6379/", "refused", ""},
		{"https://shop.example.com:00443/", "ok", "https://shop.example.com"},
	}
	for _, tt := range tests {
		got, err := g.ParseBaseURL(tt.in)
		if o := outcome(err); o != tt.want {
			t.Errorf("ParseBaseURL(%q) = %s (%v), want %s", tt.in, o, err, tt.want)
			continue
		}
		if err == nil && got.URL.String() != tt.wantURL {
			t.Errorf("ParseBaseURL(%q).URL = %q, want %q", tt.in, got.URL, tt.wantURL)
		}
		if err != nil && len(tt.in) > len("https://") && strings.Contains(err.Error(), tt.in) {
			t.Errorf("ParseBaseURL(%q) error %q repeats the input", tt.in, err)
		}
	}
}

func TestAllowList(t *testing.T) {
	g := newGuard(t, "127.0.0.1", "::1", "10.1.0.0/16", "shop.test")
	tests := []struct{ in, want string }{
		{"https://127.0.0.1:34567/", "ok"},
		{"https://[::1]:34567/shop", "ok"},
		{"https://10.1.2.3:1234/", "ok"},
		{"https://shop.test:1234/", "ok"},
		{"https://127.0.0.2/", "refused"},
		{"https://10.2.0.1/", "refused"},
		{"https://127.1:34567/", "invalid"},              // allowed address, disguised spelling
		{"https://[::ffff:127.0.0.1]:34567/", "refused"}, // the same, IPv4-mapped
		{"https://[::ffff:7f00:1]:34567/", "refused"},
		{"http://127.0.0.1:34567/", "https"},
	}
	for _, tt := range tests {
		if _, err := g.ParseBaseURL(tt.in); outcome(err) != tt.want {
			t.Errorf("ParseBaseURL(%q) = %s (%v), want %s", tt.in, outcome(err), err, tt.want)
		}
	}
	if _, err := New(DefaultPorts, []string{"not a host!"}); err == nil {
		t.Errorf("New(allow=%q) = nil error, want an error", "not a host!")
	}
}

func TestCheckResolved(t *testing.T) {
	g := newGuard(t)
	r := fakeshop.Resolver{
		"shop.example.com":    {"93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"},
		"rebind.example.com":  {"93.184.216.34", "127.0.0.1"},
		"private.example.com": {"10.0.0.5"},
		"meta.example.com":    {"169.254.169.254"},
		"mapped.example.com":  {"::ffff:10.0.0.1"},
		"ula.example.com":     {"fd12:3456::1"},
	}
	tests := []struct{ in, want string }{
		{"https://shop.example.com/", "ok"},
		{"https://rebind.example.com/", "refused"},
		{"https://private.example.com/", "refused"},
		{"https://meta.example.com/", "refused"},
		{"https://mapped.example.com/", "refused"},
		{"https://ula.example.com/", "refused"},
		{"https://nxdomain.example.com/", "no such host"},
	}
	for _, tt := range tests {
		target, err := g.ParseBaseURL(tt.in)
		if err != nil {
			t.Fatalf("ParseBaseURL(%q) = %v", tt.in, err)
		}
		if err := g.CheckResolved(context.Background(), r, target); outcome(err) != tt.want {
			t.Errorf("CheckResolved(%q) = %s (%v), want %s", tt.in, outcome(err), err, tt.want)
		}
	}
	// A lookup that failed otherwise says nothing of the name: the shop
	// may be reached later.
	target, _ := g.ParseBaseURL("https://shop.example.com/")
	for _, r := range []Resolver{fakeshop.FailingResolver{}, noAddresses{}} {
		want := "unresolvable"
		if _, empty := r.(noAddresses); empty {
			want = "no such host"
		}
		if err := g.CheckResolved(context.Background(), r, target); outcome(err) != want {
			t.Errorf("CheckResolved with %T = %s (%v), want %s", r, outcome(err), err, want)
		}
	}
}

// noAddresses answers every lookup with no address and no error.
type noAddresses struct{}

func (noAddresses) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, nil
}

func TestControl(t *testing.T) {
	g := newGuard(t, "127.0.0.1")
	tests := []struct{ network, address, want string }{
		{"tcp4", "127.0.0.1:34567", "ok"},
		{"tcp4", "93.184.216.34:443", "ok"},
		{"tcp6", "[2606:4700::1111]:443", "ok"},
		{"tcp4", "127.0.0.2:443", "refused"},
		{"tcp4", "10.0.0.1:443", "refused"},
		{"tcp4", "169.254.169.254:443", "refused"},
		{"tcp6", "[::1]:443", "refused"},
		{"tcp6", "[::ffff:10.0.0.1]:443", "refused"},
		{"tcp4", "93.184.216.34:25", "refused"},
		{"udp4", "93.184.216.34:443", "refused"},
		{"tcp4", "garbage", "refused"},
	}
	for _, tt := range tests {
		if err := g.Control(tt.network, tt.address, nil); outcome(err) != tt.want {
			t.Errorf("Control(%q, %q) = %s (%v), want %s", tt.network, tt.address, outcome(err), err, tt.want)
		}
	}
}

func TestParseWHATWGIPv4(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" when not an address
	}{
		{"127.0.0.1", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"0177.0.0.01", "127.0.0.1"},
		{"0x", "0.0.0.0"},
		{"0", "0.0.0.0"},
		{"4294967295", "255.255.255.255"},
		{"4294967296", ""},
		{"1.2.3.256", ""},
		{"1.2.65536", ""},
		{"1.2.3.4.5", ""},
		{"08.1.1.1", ""},
		{"1..1", ""},
	}
	for _, tt := range tests {
		ip, ok := parseWHATWGIPv4(tt.in)
		got := ""
		if ok {
			got = ip.String()
		}
		if got != tt.want {
			t.Errorf("parseWHATWGIPv4(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// searchingResolver answers as a stub resolver with a search list does
// (resolv.conf's search, Kubernetes' namespace.svc.cluster.local): a name
// without a trailing dot that does not resolve as it is gets each suffix
// appended in turn; a rooted name ("shop.example.") is looked up as it is
// only. Its map holds rooted names.
type searchingResolver struct {
	search []string
	names  map[string]string
}

func (r searchingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	candidates := []string{host}
	if !strings.HasSuffix(host, ".") {
		candidates = []string{host + "."}
		for _, s := range r.search {
			candidates = append(candidates, host+"."+s+".")
		}
	}
	for _, name := range candidates {
		if a, ok := r.names[name]; ok {
			return []netip.Addr{netip.MustParseAddr(a)}, nil
		}
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestLookupsIgnoreTheSearchList: the name the guard judged is the name
// resolved, never one the machine's search list made of it. Unrooted,
// "kubernetes.default" (two labels, no internal suffix: allowed by name)
// resolved in a pod as kubernetes.default.svc.cluster.local, the API
// server, and "wiki.hr" on a host searching corp.example as an intranet
// server; only their addresses were left to refuse them, and an internal
// address that is public passed.
func TestLookupsIgnoreTheSearchList(t *testing.T) {
	r := searchingResolver{
		search: []string{"svc.cluster.local", "corp.example"},
		names: map[string]string{
			"shop.example.com.":                     "93.184.216.34",
			"kubernetes.default.svc.cluster.local.": "93.184.216.35", // a cluster whose Service addresses are public
			"wiki.hr.corp.example.":                 "93.184.216.36",
			"loopback.test.corp.example.":           "127.0.0.1",
		},
	}
	g := newGuard(t)
	for _, tt := range []struct{ in, want string }{
		{"https://shop.example.com/", "ok"},
		{"https://shop.example.com./", "ok"},
		{"https://kubernetes.default/", "no such host"},
		{"https://wiki.hr/", "no such host"},
	} {
		target, err := g.ParseBaseURL(tt.in)
		if err != nil {
			t.Fatalf("ParseBaseURL(%q) = %v", tt.in, err)
		}
		if err := g.CheckResolved(context.Background(), r, target); outcome(err) != tt.want {
			t.Errorf("CheckResolved(%q) = %s (%v), want %s", tt.in, outcome(err), err, tt.want)
		}
	}

	// The dial's own lookup: "loopback.test" found through the search
	// list would reach the listener (127.0.0.1 is on this guard's list, so
	// only the name decides); looked up as written, it does not resolve.
	ln, err := net.Listen("tcp", testenv.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	d := NewDialer(newGuard(t, "127.0.0.1"), r, time.Second)
	conn, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort("loopback.test", port))
	if err == nil {
		conn.Close()
		t.Fatal("DialContext(loopback.test) connected through a name of the search list, want no such host")
	}
	if !noSuchHost(err) {
		t.Errorf("DialContext(loopback.test) = %v, want no such host", err)
	}
}

// A dual-stack shop down at its IPv4 address (its connect refused), dialled
// from a host without IPv6, whose every IPv6 connect fails EADDRNOTAVAIL,
// is the shop's failure, not our local ports running out: Shortage saw the
// IPv6 address's errno in the joined error and the read was answered 503
// unavailable where 502 shop_unreachable was right. Both addresses failing
// so is still ours. The IPv6 connect's failure is the Control hook's, so
// that no packet is sent.
func TestAShopsFailureAtOneAddressIsNotOurShortage(t *testing.T) {
	closed := testenv.FreeAddr(t) // nothing listens there: connection refused
	_, port, _ := net.SplitHostPort(closed)
	noLocalAddress := func(network, _ string, _ syscall.RawConn) error {
		if network == "tcp6" {
			return os.NewSyscallError("connect", syscall.EADDRNOTAVAIL)
		}
		return nil
	}
	noLocalPort := func(string, string, syscall.RawConn) error {
		return os.NewSyscallError("connect", syscall.EADDRNOTAVAIL)
	}
	for _, tt := range []struct {
		name    string
		control func(string, string, syscall.RawConn) error
		want    bool
	}{
		{"IPv4 refused by the shop, IPv6 EADDRNOTAVAIL", noLocalAddress, false},
		{"both EADDRNOTAVAIL", noLocalPort, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDialer(newGuard(t, "shop.test"), fakeshop.Resolver{"shop.test": {"127.0.0.1", "::1"}}, time.Second)
			d.listed.Control = tt.control
			conn, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort("shop.test", port))
			if err == nil {
				conn.Close()
				t.Fatal("DialContext connected, want it to fail at each address")
			}
			if got := Shortage(&url.Error{Op: "Get", URL: "https://shop.test:" + port + "/api", Err: err}); got != tt.want {
				t.Errorf("Shortage(%v) = %v, want %v", err, got, tt.want)
			}
		})
	}
}

// A dial for a read that has ended connects nowhere and counts nothing
// against the shop: net/http dials on in the background after the request
// is gone, with its context's values (the read's claim) but not its
// cancellation, and a count taken then (the next address of a name, or the
// first once a slow lookup answered) outlived the read's release: with a
// cap of 1 the shop was refused for the life of the process.
func TestADialOutlivingItsReadCountsNothing(t *testing.T) {
	addr := testenv.ServeConns(t, func(net.Conn) {}) // accepts, then closes
	_, port, _ := net.SplitHostPort(addr)
	d := NewDialer(newGuard(t, "127.0.0.1"), fakeshop.Resolver{"late.shop.test": {"127.0.0.1"}}, time.Second)
	shops := shoplimit.New(1)
	read := shops.Claim()
	read.Release() // the read ended while its dial waited on the lookup
	conn, err := d.DialContext(shoplimit.With(context.Background(), read), "tcp", net.JoinHostPort("late.shop.test", port))
	if err == nil {
		conn.Close()
	}
	if !errors.Is(err, shoplimit.ErrEnded) {
		t.Errorf("the dial of an ended read = %v, want shoplimit.ErrEnded, no connection", err)
	}
	if got := shops.Total(); got != 0 {
		t.Errorf("counts held after the dial of an ended read = %d, want 0", got)
	}
}
