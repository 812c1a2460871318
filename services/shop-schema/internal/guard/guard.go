// Package guard decides which shop addresses the service may call. The shop
// schema route is the only one that connects to an address a stranger chose,
// so every address is checked twice: once when the request is validated (so
// the caller gets base_url_not_allowed), and again in the dialer's Control
// hook on the address actually connected, so DNS rebinding and redirects
// cannot get around the first check.
package guard

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"code.dny.dev/ssrf"
	"golang.org/x/net/idna"
)

// Sentinel errors. Every refusal of the policy, and every failed lookup in
// CheckResolved, wraps one of them. What is not the guard's verdict passes
// through as it is: the context's error from CheckResolved (shopschema
// answers a caller that hung up as such, not as a slow shop), a lookup
// this process could not make for a shortage of descriptors, memory or
// local ports (Shortage finds it: lookupError), and the resolver's and the
// dialer's own errors from Dialer.DialContext.
var (
	// ErrInvalid means base_url is not a usable https URL (invalid_base_url).
	ErrInvalid = errors.New("invalid base_url")
	// ErrNotHTTPS means the scheme is not https (base_url_must_be_https).
	ErrNotHTTPS = errors.New("base_url must be https")
	// ErrNotAllowed means the host, an address it resolves to, or the port
	// is refused (base_url_not_allowed).
	ErrNotAllowed = errors.New("base_url not allowed")
	// ErrNoSuchHost means DNS says the host name does not exist: the
	// caller's address is wrong (invalid_base_url), not the shop down.
	ErrNoSuchHost = errors.New("host name does not exist")
	// ErrUnresolvable means the host name's lookup failed otherwise (a DNS
	// server failing or refusing): the shop may be reached later.
	ErrUnresolvable = errors.New("host does not resolve")
)

// extraDenied are refused on top of the IANA special-purpose registries that
// code.dny.dev/ssrf already refuses: cloud metadata endpoints that sit on
// public addresses.
var extraDenied = []netip.Prefix{
	netip.MustParsePrefix("168.63.129.16/32"), // Azure wire server / metadata
}

// DefaultPorts are the ports a shop may listen on when the configuration
// does not say otherwise.
var DefaultPorts = []uint16{443, 8443}

// Guard holds the address policy. It is safe for concurrent use.
type Guard struct {
	ports         []uint16
	allowPrefixes []netip.Prefix
	allowHosts    map[string]bool
	ssrf          *ssrf.Guardian
}

// New returns a Guard that refuses every special-purpose address and every
// port outside ports. allow lists hosts, IP addresses and CIDR prefixes that
// are let through despite that (for tests against a fake shop on loopback);
// it is empty in production.
func New(ports []uint16, allow []string) (*Guard, error) {
	g := &Guard{
		ports:      slices.Clone(ports),
		allowHosts: map[string]bool{},
		ssrf:       ssrf.New(ssrf.WithAnyPort(), ssrf.WithDeniedV4Prefixes(extraDenied...)),
	}
	for _, entry := range allow {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		if p, err := netip.ParsePrefix(entry); err == nil {
			g.allowPrefixes = append(g.allowPrefixes, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(strings.Trim(entry, "[]")); err == nil {
			g.allowPrefixes = append(g.allowPrefixes, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		host, err := idna.Lookup.ToASCII(strings.TrimSuffix(entry, "."))
		if err != nil || !validHostname(host) {
			return nil, fmt.Errorf("guard: allow-list entry %q is not a host, IP or CIDR", entry)
		}
		g.allowHosts[host] = true
	}
	return g, nil
}

// CheckAddr reports whether the service may connect to ip on port: nil, or
// an error wrapping ErrNotAllowed that says why. It is a pure function of the
// policy.
func (g *Guard) CheckAddr(ip netip.Addr, port uint16) error {
	if g.allowedByList(ip) {
		return nil
	}
	if !slices.Contains(g.ports, port) {
		return g.portError(port)
	}
	if ip.Zone() != "" {
		return fmt.Errorf("%w: scoped address", ErrNotAllowed)
	}
	if err := g.ssrf.SafeAddr(ip); err != nil {
		return fmt.Errorf("%w: %s is a special-purpose address", ErrNotAllowed, ip)
	}
	// ssrf treats every IPv4-mapped address as IPv6 (outside 2000::/3, so
	// refused); checking the unmapped form too keeps that true if the
	// library ever changes.
	if ip.Is4In6() {
		if err := g.ssrf.SafeAddr(ip.Unmap()); err != nil {
			return fmt.Errorf("%w: %s is a special-purpose address", ErrNotAllowed, ip)
		}
	}
	return nil
}

// allowedByList reports whether ip itself is on the allow-list. An
// IPv4-mapped spelling of a listed IPv4 address is not (nor the other way
// round): like 127.1 for 127.0.0.1, it is a disguise the list does not
// cover, and the guard judges it as any other address (refused).
func (g *Guard) allowedByList(ip netip.Addr) bool {
	for _, p := range g.allowPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// portAllowed reports whether port may be used with host without an
// allow-list entry.
func (g *Guard) portAllowed(port uint16) bool { return slices.Contains(g.ports, port) }

// portError refuses port and names the ports a shop may use: they are no
// secret (the README lists the default), and they say what to fix.
func (g *Guard) portError(port uint16) error {
	allowed := make([]string, len(g.ports))
	for i, p := range g.ports {
		allowed[i] = strconv.Itoa(int(p))
	}
	return fmt.Errorf("%w: port %d (shops may use %s)", ErrNotAllowed, port, strings.Join(allowed, ", "))
}
