package guard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The fuzz targets hold the guard to what its callers rely on: an accepted
// base_url is https, has a valid host name or an allowed address, no user
// info, query or fragment, and reads back as itself; an address the guard
// lets through is one that net/netip (and the registries it does not know)
// call public; and an error never repeats the URL it refuses.

// baseURLSeeds are the rows of TestParseBaseURL and TestAllowList.
var baseURLSeeds = []string{
	"https://shop.example.com", "https://shop.example.com/", "  https://Shop.Example.COM/prestashop/  ",
	"https://shop.example.com:443/a/b", "https://shop.example.com:8443", "https://shop.example.com./",
	"https://магазин.рф/", "https://8.8.8.8/", "https://[2606:4700::1111]/", "https://[2606:4700::1111]:8443/",
	"", "shop.example.com", "//shop.example.com", "https://", "https:shop.example.com",
	"https://user:pass@shop.example.com", "https://@shop.example.com", "https://shop.example.com@127.0.0.1",
	"https://shop.example.com\\@127.0.0.1", "https://shop.example.com/?ws_key=x", "https://shop.example.com/?",
	"https://shop.example.com/#top", "https://shop.example.com#", "https://shop.example.com:0",
	"https://shop.example.com:65536", "https://shop.example.com:", "https://shop.example.com:443:443",
	"https://shop.example.com:-1", "https://shop_example.com", "https://-shop.example.com", "https://shop..example.com",
	"https://" + strings.Repeat("a", 64) + ".com", "https://1.2.3.4.5", "https://256.1.1.1", "https://0x1g.1",
	"https://134744072/", "https://[fe80::1%25eth0]/", "https://[::1", "http://shop.example.com", "HTTP://shop.example.com",
	"ftp://shop.example.com", "file:///etc/passwd", "gopher://127.0.0.1:6379/_INFO", "javascript:alert(1)",
	"https://127.0.0.1/", "https://127.0.0.1:8443/", "https://127.1/", "https://2130706433/", "https://017700000001/",
	"https://0177.0.0.1/", "https://0x7f.0.0.1/", "https://0X7F.1/", "https://127.0.0.1./", "https://%31%32%37.0.0.1/",
	"https://１２７.０.０.１/", "https://127。0。0。1/", "https://[::1]/", "https://[::ffff:127.0.0.1]/",
	"https://[::127.0.0.1]/", "https://localhost/", "https://LOCALHOST./", "https://shop.localhost/", "https://0/",
	"https://[::]/", "https://10.0.0.1/", "https://100.64.0.1/", "https://169.254.169.254/", "https://168.63.129.16/",
	"https://192.0.0.192/", "https://[fd00:ec2::254]/", "https://metadata.google.internal/", "https://printer.local/",
	"https://[64:ff9b::7f00:1]/", "https://[2002:7f00:1::]/", "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
	"https://[2001:db8::1]/", "https://224.0.0.1/", "https://255.255.255.255/", "https://shop.example.com:22/",
	"https://8.8.8.8:6379/", "https://shop.example.com:00443/", "https://shop.example/a%2Fb/", "https://shop.example/%zz",
	"https://shop.example/a%3Fb", "https://xn--80aairftm.xn--p1ai/", "https://shop.example&ws_key=KEY",
}

func FuzzParseBaseURL(f *testing.F) {
	for _, s := range baseURLSeeds {
		f.Add(s)
	}
	g, err := New(DefaultPorts, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := g.ParseBaseURL(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotHTTPS) && !errors.Is(err, ErrNotAllowed) {
				t.Fatalf("ParseBaseURL(%q) = %v, want an error wrapping a sentinel", raw, err)
			}
			if word := foreignWord(err.Error()); word != "" {
				t.Fatalf("ParseBaseURL(%q) = %q, whose %q is not the package's wording, a number or an IP address", raw, err, word)
			}
			return
		}
		if why := unsafeTarget(g, got); why != "" {
			t.Fatalf("ParseBaseURL(%q) = %s (host %q, addr %v, port %d), but %s", raw, got.URL, got.Host, got.Addr, got.Port, why)
		}
		again, err := g.ParseBaseURL(got.URL.String())
		if err != nil || again.URL.String() != got.URL.String() || again.Host != got.Host || again.Addr != got.Addr || again.Port != got.Port {
			t.Fatalf("ParseBaseURL(%q) = %s, which reads back as %+v, %v", raw, got.URL, again, err)
		}
	})
}

// unsafeTarget says what is wrong with an accepted target, or "".
func unsafeTarget(g *Guard, t Target) string {
	u := t.URL
	switch {
	case u.Scheme != "https":
		return "the scheme is not https"
	case u.User != nil || u.Opaque != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawFragment != "":
		return "the URL has user info, an opaque part, a query or a fragment"
	case strings.HasSuffix(u.Path, "/"):
		return "the path ends in a slash"
	case u.Hostname() != t.Host:
		return "the URL's host is not Host"
	case u.Port() != "" && u.Port() != strconv.Itoa(int(t.Port)), u.Port() == "" && t.Port != 443, u.Port() == "443":
		return "the URL's port is not Port, or 443 is written"
	case !slices.Contains(DefaultPorts, t.Port):
		return "the port is not one a shop may use"
	case t.IsIP() && (t.Addr.String() != t.Host || t.Addr.Zone() != ""):
		return "the host is not the address in canonical form"
	case t.IsIP() && !publicAddr(t.Addr):
		return "the address is not public"
	case t.IsIP() && g.CheckAddr(t.Addr, t.Port) != nil:
		return "the address classifier refuses it"
	case !t.IsIP() && !referenceHostname(t.Host):
		return "the host is not a valid host name"
	case !t.IsIP() && readsAsIPv4(t.Host):
		return "a resolver would read the host as an IPv4 address"
	case !t.IsIP() && !strings.Contains(t.Host, "."):
		return "the host is a single label"
	}
	for _, s := range []string{".localhost", ".local", ".internal", ".home.arpa", ".svc"} {
		if !t.IsIP() && (t.Host == "localhost" || strings.HasSuffix(t.Host, s)) {
			return "the host is in an internal name space"
		}
	}
	for _, s := range []string{".invalid", ".onion", ".alt"} {
		if !t.IsIP() && strings.HasSuffix(t.Host, s) {
			return "the host is under a name DNS never answers for"
		}
	}
	return ""
}

// hostnamePattern is RFC 1123 syntax, lower case: labels of 1 to 63
// letters, digits and inner hyphens.
var hostnamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

func referenceHostname(s string) bool { return len(s) <= 253 && hostnamePattern.MatchString(s) }

// readsAsIPv4 reports whether inet_aton or a browser (WHATWG URL) would take
// host for an IPv4 address: its last label is a decimal, octal or hex
// number.
func readsAsIPv4(host string) bool {
	last := host[strings.LastIndexByte(host, '.')+1:]
	digits := strings.TrimPrefix(strings.TrimPrefix(last, "0x"), "0X")
	if len(digits) < len(last) {
		return strings.Trim(digits, "0123456789abcdefABCDEF") == ""
	}
	return last != "" && strings.Trim(last, "0123456789") == ""
}

// messageWords are the words of the package's error texts.
var messageWords = func() map[string]bool {
	words := map[string]bool{}
	for _, text := range []string{
		ErrInvalid.Error(), ErrNotHTTPS.Error(), ErrNotAllowed.Error(),
		"base_url is required", "base_url is longer than bytes", "base_url is not a URL",
		"base_url must be an absolute URL such as https://shop.example",
		"base_url must not contain user info; send the key as ws_key", "base_url must not contain a query",
		"base_url must not contain a fragment", "empty port", "invalid port", "invalid host", "invalid IPv6 address",
		"scoped IPv6 address", "write the IPv4 address in dotted decimal form", "single-label host names are internal",
		"is an internal name space", "names are never in DNS", "port (shops may use )", "scoped address", "is a special-purpose address",
	} {
		for _, w := range strings.Fields(text) {
			words[strings.Trim(w, ",;:()")] = true
		}
	}
	for _, s := range append(internalSuffixes, unresolvableSuffixes...) {
		words[s] = true
	}
	return words
}()

// foreignWord returns a word of an error text that is not the package's
// wording, a number or an IP address in canonical form: a piece of the URL
// the error refused.
func foreignWord(text string) string {
	for _, w := range strings.Fields(text) {
		w = strings.Trim(w, ",;()")
		if a, err := netip.ParseAddr(w); err == nil && a.String() == w {
			continue
		}
		w = strings.TrimSuffix(w, ":")
		if w == "" || messageWords[w] || strings.Trim(w, "0123456789") == "" {
			continue
		}
		return w
	}
	return ""
}

// publicAddr is a reading of "public" built on net/netip's predicates, the
// IANA special-purpose blocks that netip does not know, and the IPv4
// addresses that IPv6 transition prefixes carry inside them.
func publicAddr(a netip.Addr) bool {
	if a.Zone() != "" {
		return false
	}
	if a.Is4In6() && !publicAddr(a.Unmap()) {
		return false
	}
	if !a.IsGlobalUnicast() || a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range notPublic {
		if p.Contains(a) {
			return false
		}
	}
	if !a.Is6() || a.Is4In6() {
		return true
	}
	b := a.As16()
	v4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte(b[i : i+4])) }
	switch {
	case netip.MustParsePrefix("64:ff9b::/96").Contains(a), netip.MustParsePrefix("::/96").Contains(a):
		return publicAddr(v4(12))
	case netip.MustParsePrefix("2002::/16").Contains(a): // 6to4
		return publicAddr(v4(2))
	case netip.MustParsePrefix("2001::/32").Contains(a): // Teredo: server, and client inverted
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return publicAddr(v4(4)) && publicAddr(netip.AddrFrom4(client))
	}
	return true
}

// notPublic are special-purpose blocks that net/netip's predicates pass.
var notPublic = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "240.0.0.0/4", "168.63.129.16/32", "100.100.100.200/32",
		"64:ff9b:1::/48", "100::/64", "2001:db8::/32", "3fff::/20", "fec0::/10", "2001:10::/28", "2001:20::/28",
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

func FuzzCheckAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::1", "10.1.2.3", "10.2.0.1", "8.8.8.8", "93.184.216.34", "169.254.169.254",
		"::ffff:10.0.0.1", "::ffff:127.0.0.1", "2606:4700::1111", "fd12:3456::1", "fe80::1", "ff02::1", "64:ff9b::a00:1",
		"64:ff9b::808:808", "2002:7f00:1::", "2002:808:808::", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:db8::1",
		"fec0::1", "100::1", "::8.8.8.8", "224.0.0.1", "255.255.255.255", "0.0.0.0", "::", "100.64.0.1", "168.63.129.16"} {
		a := netip.MustParseAddr(s)
		f.Add(a.AsSlice(), "", uint16(443))
	}
	f.Add(netip.MustParseAddr("fe80::1").AsSlice(), "eth0", uint16(443))
	f.Add(netip.MustParseAddr("2606:4700::1111").AsSlice(), "eth0", uint16(443))
	f.Add(netip.MustParseAddr("8.8.8.8").AsSlice(), "", uint16(6379))
	f.Add(netip.MustParseAddr("127.0.0.1").AsSlice(), "", uint16(34567))
	plain, err := New(DefaultPorts, nil)
	if err != nil {
		f.Fatal(err)
	}
	allow := []string{"127.0.0.1", "::1", "10.1.0.0/16"}
	listed, err := New(DefaultPorts, allow)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ip []byte, zone string, port uint16) {
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			return
		}
		if a.Is6() {
			a = a.WithZone(zone)
		}
		err := plain.CheckAddr(a, port)
		if err == nil && (!publicAddr(a) || !slices.Contains(DefaultPorts, port)) {
			t.Fatalf("CheckAddr(%v, %d) = nil, want refused: not a public address, or not a shop's port", a, port)
		}
		if err != nil && !errors.Is(err, ErrNotAllowed) {
			t.Fatalf("CheckAddr(%v, %d) = %v, want an error wrapping ErrNotAllowed", a, port, err)
		}
		onList := false
		for _, entry := range allow {
			p, err := netip.ParsePrefix(entry)
			if err != nil {
				p = netip.PrefixFrom(netip.MustParseAddr(entry), netip.MustParseAddr(entry).BitLen())
			}
			onList = onList || a.Zone() == "" && p.Contains(a)
		}
		if err := listed.CheckAddr(a, port); err == nil && !onList && (!publicAddr(a) || !slices.Contains(DefaultPorts, port)) {
			t.Fatalf("CheckAddr(%v, %d) with allow-list %q = nil, want refused", a, port, allow)
		}
		// The dialer's hook decides as CheckAddr does on what it dials.
		network := map[bool]string{true: "tcp4", false: "tcp6"}[a.Is4()]
		address := netip.AddrPortFrom(a, port).String()
		if got := plain.Control(network, address, nil); (got == nil) != (err == nil) {
			t.Fatalf("Control(%q, %q) = %v, but CheckAddr = %v", network, address, got, err)
		}
	})
}

// FuzzIPv4Spellings writes an IPv4 address in the forms inet_aton and
// browsers read (one to four parts, each decimal, octal or hex): the guard
// must decode each to the address, accept only the dotted decimal form,
// and refuse a non-public address however it is written.
func FuzzIPv4Spellings(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "8.8.8.8", "169.254.169.254", "10.0.0.1", "0.0.0.0", "255.255.255.255", "100.64.0.1"} {
		for _, style := range []uint16{0, 1, 2, 3, 0x5, 0xa, 0x3f, 0x1ff} {
			f.Add(binary.BigEndian.Uint32(netip.MustParseAddr(s).AsSlice()), style)
		}
	}
	g, err := New(DefaultPorts, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, v uint32, style uint16) {
		b := [4]byte(binary.BigEndian.AppendUint32(nil, v))
		a := netip.AddrFrom4(b)
		host := spellIPv4(b, style)
		if got, ok := parseWHATWGIPv4(strings.TrimSuffix(host, ".")); !ok || got != a {
			t.Fatalf("parseWHATWGIPv4(%q) = %v, %v, want %v", host, got, ok, a)
		}
		canonical := strings.TrimSuffix(host, ".") == a.String()
		_, err := g.ParseBaseURL("https://" + host + "/")
		switch {
		case err == nil && !canonical:
			t.Fatalf("ParseBaseURL(https://%s/) accepted %v written in another form than dotted decimal", host, a)
		case err == nil && !publicAddr(a):
			t.Fatalf("ParseBaseURL(https://%s/) accepted %v, not a public address", host, a)
		case err != nil && !publicAddr(a) && !errors.Is(err, ErrNotAllowed):
			t.Fatalf("ParseBaseURL(https://%s/) = %v, want base_url not allowed", host, err)
		case err != nil && canonical && publicAddr(a) && g.CheckAddr(a, 443) == nil:
			t.Fatalf("ParseBaseURL(https://%s/) = %v, want accepted", host, err)
		}
	})
}

// spellIPv4 writes b in the form style picks: bits 0-1 the number of parts
// less one, then two bits per part for decimal, octal, hex or upper-case
// hex, bit 10 a trailing dot, bit 11 an extra leading zero on octal parts.
func spellIPv4(b [4]byte, style uint16) string {
	parts := int(style&3) + 1
	v := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	nums := make([]uint64, parts)
	for i := range parts - 1 {
		nums[i] = uint64(b[i])
	}
	nums[parts-1] = v & (1<<(8*(5-parts)) - 1)
	text := make([]string, parts)
	for i, n := range nums {
		switch style >> (2 + 2*i) & 3 {
		case 0:
			text[i] = strconv.FormatUint(n, 10)
		case 1:
			text[i] = "0" + strconv.FormatUint(n, 8)
			if style&(1<<11) != 0 {
				text[i] = "0" + text[i]
			}
		case 2:
			text[i] = fmt.Sprintf("0x%x", n)
		default:
			text[i] = fmt.Sprintf("0X%X", n)
		}
	}
	host := strings.Join(text, ".")
	if style&(1<<10) != 0 {
		host += "."
	}
	return host
}

func FuzzValidHostname(f *testing.F) {
	for _, s := range []string{"shop.example.com", "xn--80aairftm.xn--p1ai", "a", "-a", "a-", "a--b", "a..b", ".a", "a.",
		"shop_example.com", "SHOP.example", strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a.", 126) + "a",
		strings.Repeat("a.", 127) + "a", "1.2.3.4", "a\x00b", "é.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validHostname(s), referenceHostname(s); got != want {
			t.Fatalf("validHostname(%q) = %v, want %v", s, got, want)
		}
	})
}
