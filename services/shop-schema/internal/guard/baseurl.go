package guard

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// MaxURLLength bounds base_url; no shop address is longer.
const MaxURLLength = 2048

// Target is a validated shop address.
type Target struct {
	// URL is the normalised base: https, ASCII host without a trailing dot,
	// explicit port only when it is not 443, path without a trailing slash,
	// no user info, query or fragment.
	URL *url.URL
	// Host is the ASCII host name, or the canonical text of the IP address.
	Host string
	// Addr is set when the host is an IP literal.
	Addr netip.Addr
	// Port is the TCP port.
	Port uint16
}

// IsIP reports whether the host is an IP literal.
func (t Target) IsIP() bool { return t.Addr.IsValid() }

// ParseBaseURL validates raw as a shop address and applies the parts of the
// policy that need no DNS: scheme, syntax, literal addresses, port, and host
// names that can only be internal. Errors wrap ErrInvalid, ErrNotHTTPS or
// ErrNotAllowed, and never repeat raw (it may hold a secret in user info);
// they may name the IP address (in canonical form) or the port raw holds.
func (g *Guard) ParseBaseURL(raw string) (Target, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return Target{}, fmt.Errorf("%w: base_url is required", ErrInvalid)
	}
	if len(raw) > MaxURLLength {
		return Target{}, fmt.Errorf("%w: base_url is longer than %d bytes", ErrInvalid, MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Target{}, fmt.Errorf("%w: base_url is not a URL", ErrInvalid)
	}
	if u.Scheme != "" && u.Scheme != "https" {
		return Target{}, ErrNotHTTPS // the sentinel's text says it all
	}
	if u.Scheme == "" || u.Opaque != "" || u.Host == "" {
		return Target{}, fmt.Errorf("%w: base_url must be an absolute URL such as https://shop.example", ErrInvalid)
	}
	switch {
	case u.User != nil || strings.Contains(u.Host, "@"):
		return Target{}, fmt.Errorf("%w: base_url must not contain user info; send the key as ws_key", ErrInvalid)
	case u.RawQuery != "" || u.ForceQuery:
		return Target{}, fmt.Errorf("%w: base_url must not contain a query", ErrInvalid)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return Target{}, fmt.Errorf("%w: base_url must not contain a fragment", ErrInvalid)
	}
	t, err := g.checkHostPort(u.Host)
	if err != nil {
		return Target{}, err
	}
	t.URL = &url.URL{Scheme: "https", Host: hostPort(t), Path: strings.TrimRight(u.Path, "/")}
	if u.RawPath != "" {
		t.URL.RawPath = strings.TrimRight(u.RawPath, "/")
	}
	return t, nil
}

// CheckRedirectURL applies the same rules to the target of a redirect the
// shop answered with.
func (g *Guard) CheckRedirectURL(u *url.URL) error {
	if u.Scheme != "https" {
		return fmt.Errorf("%w: redirect to a non-https address", ErrNotHTTPS)
	}
	if u.User != nil {
		return fmt.Errorf("%w: redirect to an address with user info", ErrInvalid)
	}
	_, err := g.checkHostPort(u.Host)
	return err
}

// checkHostPort validates the authority part (host[:port]) of a URL.
func (g *Guard) checkHostPort(authority string) (Target, error) {
	host, portText := authority, ""
	if i := strings.LastIndexByte(authority, ':'); i >= 0 && !strings.Contains(authority[i:], "]") {
		host, portText = authority[:i], authority[i+1:]
		if portText == "" {
			return Target{}, fmt.Errorf("%w: empty port", ErrInvalid)
		}
	}
	port := uint16(443)
	if portText != "" {
		n, err := strconv.ParseUint(portText, 10, 16)
		if err != nil || n == 0 {
			return Target{}, fmt.Errorf("%w: invalid port", ErrInvalid)
		}
		port = uint16(n)
	}
	if strings.HasPrefix(host, "[") {
		return g.checkIPv6Literal(host, port)
	}
	// url.Parse has already decoded percent-escapes in the host. Bytes
	// that are not UTF-8 (%80) idna would take for U+FFFD, which it refuses
	// written as such: shop.%80.example would become shop.xn--zn7c.example,
	// a host no one wrote, and that the guard itself refuses.
	if host == "" || !utf8.ValidString(host) {
		return Target{}, fmt.Errorf("%w: invalid host", ErrInvalid)
	}
	ascii, err := idna.Lookup.ToASCII(host)
	if err != nil {
		return Target{}, fmt.Errorf("%w: invalid host", ErrInvalid)
	}
	ascii = strings.TrimSuffix(ascii, ".")
	if endsInNumber(ascii) {
		return g.checkIPv4Host(ascii, port)
	}
	return g.checkHostname(ascii, port)
}

func (g *Guard) checkIPv6Literal(host string, port uint16) (Target, error) {
	if !strings.HasSuffix(host, "]") {
		return Target{}, fmt.Errorf("%w: invalid host", ErrInvalid)
	}
	ip, err := netip.ParseAddr(host[1 : len(host)-1])
	if err != nil || !ip.Is6() {
		return Target{}, fmt.Errorf("%w: invalid IPv6 address", ErrInvalid)
	}
	if ip.Zone() != "" {
		return Target{}, fmt.Errorf("%w: scoped IPv6 address", ErrNotAllowed)
	}
	return g.checkLiteral(ip, port)
}

// checkIPv4Host handles a host whose last label is a number: browsers (the
// WHATWG URL standard) and getaddrinfo read it as an IPv4 address in any of
// its decimal, octal, hex and shortened forms, so it is decoded the same way
// and the address it denotes is checked. Non-canonical spellings of an
// address that would be allowed are refused as invalid: no certificate can
// name them, and they only serve to disguise an address.
func (g *Guard) checkIPv4Host(host string, port uint16) (Target, error) {
	ip, ok := parseWHATWGIPv4(host)
	if !ok {
		return Target{}, fmt.Errorf("%w: invalid host", ErrInvalid)
	}
	if host != ip.String() {
		if err := g.CheckAddr(ip, port); err != nil {
			return Target{}, err
		}
		return Target{}, fmt.Errorf("%w: write the IPv4 address in dotted decimal form", ErrInvalid)
	}
	return g.checkLiteral(ip, port)
}

func (g *Guard) checkLiteral(ip netip.Addr, port uint16) (Target, error) {
	if err := g.CheckAddr(ip, port); err != nil {
		return Target{}, err
	}
	return Target{Host: ip.String(), Addr: ip, Port: port}, nil
}

// internalSuffixes are name spaces that never hold a public shop. .svc is
// Kubernetes': name.namespace.svc is a Service's name once a pod's search
// domain (cluster.local, refused as .local) completes it, which the
// guard's lookups, of absolute names, no longer let happen (lookup); it
// is refused by name all the same, as a name no public shop has.
var internalSuffixes = []string{".localhost", ".local", ".internal", ".home.arpa", ".lan", ".intranet", ".corp", ".svc"}

// unresolvableSuffixes are top-level names that DNS never answers for:
// .invalid (RFC 6761), .onion (Tor's, RFC 7686) and .alt (RFC 9476). A
// base_url under one is refused by name, as invalid: a lookup would only
// send the name to the resolver, to come back "no such host". (.test and
// .example are reserved too, but the tests use them for public shops with
// a resolver of their own, and the system resolver refuses them all the
// same.)
var unresolvableSuffixes = []string{".invalid", ".onion", ".alt"}

func (g *Guard) checkHostname(host string, port uint16) (Target, error) {
	if !validHostname(host) {
		return Target{}, fmt.Errorf("%w: invalid host", ErrInvalid)
	}
	t := Target{Host: host, Port: port}
	if g.allowHosts[host] {
		return t, nil
	}
	for _, s := range unresolvableSuffixes {
		if strings.HasSuffix(host, s) {
			return Target{}, fmt.Errorf("%w: %s names are never in DNS", ErrInvalid, s)
		}
	}
	if !g.portAllowed(port) {
		return Target{}, g.portError(port)
	}
	if !strings.Contains(host, ".") || host == "localhost" {
		return Target{}, fmt.Errorf("%w: single-label host names are internal", ErrNotAllowed)
	}
	for _, s := range internalSuffixes {
		if strings.HasSuffix(host, s) {
			return Target{}, fmt.Errorf("%w: %s is an internal name space", ErrNotAllowed, s)
		}
	}
	return t, nil
}

// validHostname checks RFC 1123 syntax on an ASCII name.
func validHostname(host string) bool {
	if host == "" || len(host) > 253 {
		return false
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func hostPort(t Target) string {
	host := t.Host
	if t.IsIP() && t.Addr.Is6() {
		host = "[" + host + "]"
	}
	if t.Port == 443 {
		return host
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(int(t.Port)))
}
