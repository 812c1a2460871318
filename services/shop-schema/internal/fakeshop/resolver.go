package fakeshop

import (
	"context"
	"net"
	"net/netip"
	"strings"
)

// Resolver answers host lookups from a map of host to addresses, so a test
// of the SSRF guard sends no DNS query out of the process. A host it does
// not hold does not resolve. Its names are written without the trailing
// dot, which the guard's lookups add (an absolute name: no search domain).
type Resolver map[string][]string

// LookupNetIP is the guard's resolver method.
func (r Resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range r[strings.TrimSuffix(host, ".")] {
		out = append(out, netip.MustParseAddr(a))
	}
	if len(out) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true} // as net.Resolver says it
	}
	return out, nil
}

// FailingResolver fails every lookup as a DNS server that does not answer
// well (SERVFAIL): the name may resolve later.
type FailingResolver struct{}

// LookupNetIP is the guard's resolver method.
func (FailingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
}
