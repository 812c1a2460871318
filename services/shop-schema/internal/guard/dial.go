package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coinexport/export/pkg/acceptretry"

	"github.com/coinexport/export/services/shop-schema/internal/shoplimit"
)

// Resolver looks up the addresses of a host name. *net.Resolver satisfies
// it; tests pass a map so that no DNS query leaves the machine.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// CheckResolved resolves a named target and refuses it when any of its
// addresses is refused: a name that points at an internal address is
// reported as base_url_not_allowed before anything is sent. The dialer checks
// again at connect time, since the next answer may differ.
func (g *Guard) CheckResolved(ctx context.Context, r Resolver, t Target) error {
	if t.IsIP() || g.allowHosts[t.Host] {
		return nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", absolute(t.Host))
	if err != nil || len(addrs) == 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := lookupError(err); Shortage(err) {
			return err // this process's shortage: no verdict on the name
		}
		if noSuchHost(err) {
			return fmt.Errorf("%w: %s", ErrNoSuchHost, t.Host)
		}
		return fmt.Errorf("%w: %s", ErrUnresolvable, t.Host)
	}
	for _, a := range addrs {
		if err := g.CheckAddr(a, t.Port); err != nil {
			return err
		}
	}
	return nil
}

// Shortage reports whether err is this process's own shortage on the way
// to a shop, none of it the shop's fault and all of it passing as
// connections close: of descriptors or memory (acceptretry.Shortage), or of
// local ports (EADDRNOTAVAIL: every ephemeral port to the address in use or
// in TIME_WAIT), where 502 shop_unreachable would send the merchant to
// check DNS and firewalls.
//
// A dial of a name's several addresses is ours only when each failed so:
// one the shop refused or left unanswered is the shop's failure, whatever
// the others met. A host without IPv6 fails every IPv6 address with
// EADDRNOTAVAIL too: a dual-stack shop down at its IPv4 address is its own
// 502 shop_unreachable, not our 503 "out of local ports".
func Shortage(err error) bool {
	var each dialErrors
	if errors.As(err, &each) {
		return !slices.ContainsFunc(each, func(err error) bool { return !Shortage(err) })
	}
	return acceptretry.Shortage(err) || errors.Is(err, syscall.EADDRNOTAVAIL)
}

// dialErrors is a dial's failure at each address of a shop, in the order
// dialled; it reads as errors.Join's.
type dialErrors []error

func (e dialErrors) Error() string   { return errors.Join(e...).Error() }
func (e dialErrors) Unwrap() []error { return e }

// lookupError is err, a failed lookup's, in which errors.Is finds the
// shortage (as Shortage names one) that failed it, if one did: a
// net.DNSError keeps its socket's error as text alone, and a lookup this
// process had no socket for would otherwise read as the shop's DNS failing
// (502 shop_unreachable, "check DNS and firewalls"), where a shop given by
// its address is answered 503 for the same shortage.
func lookupError(err error) error {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		if errno, ok := shortageIn(dnsErr.Err); ok {
			return &shortageError{err, errno}
		}
	}
	return err
}

// shortageIn is acceptretry.ShortageIn with local ports too (Shortage).
func shortageIn(text string) (syscall.Errno, bool) {
	if strings.HasSuffix(text, syscall.EADDRNOTAVAIL.Error()) {
		return syscall.EADDRNOTAVAIL, true
	}
	return acceptretry.ShortageIn(text)
}

// shortageError is a lookup's error and the shortage that failed it.
type shortageError struct {
	error
	errno syscall.Errno
}

func (e *shortageError) Unwrap() []error { return []error{e.error, e.errno} }

// absolute is host as the absolute name it is (a trailing dot added), the
// name the guard's lookups ask for, so that the name resolved is the one
// the guard judged: unrooted, the resolver tries it with each of
// resolv.conf's search domains too, and "kubernetes.default", allowed by
// name, became a pod's API server (kubernetes.default.svc.cluster.local),
// "wiki.hr" a company's intranet host (wiki.hr.corp.example), which only
// their addresses then refused.
func absolute(host string) string {
	if strings.HasSuffix(host, ".") {
		return host
	}
	return host + "."
}

// noSuchHost reports whether a lookup's error says the name does not exist
// (NXDOMAIN, or a name with no address records); no error with no address
// reads the same.
func noSuchHost(err error) bool {
	var dnsErr *net.DNSError
	return err == nil || errors.As(err, &dnsErr) && dnsErr.IsNotFound
}

// Control is the net.Dialer Control hook: it runs after DNS resolution, once
// for every address actually dialed (each redirect hop, each fallback
// address), and refuses the connection before any packet is sent.
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	if network != "tcp4" && network != "tcp6" {
		return fmt.Errorf("%w: network %s", ErrNotAllowed, network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unparsable address", ErrNotAllowed)
	}
	return g.CheckAddr(ap.Addr(), ap.Port())
}

// Dialer connects to shops. It resolves names itself (through Resolver) so
// that an allow-listed name can be told apart from the address it resolves
// to, and dials each address through a net.Dialer whose Control hook is the
// guard.
type Dialer struct {
	guard    *Guard
	resolver Resolver
	guarded  *net.Dialer
	listed   *net.Dialer
}

// NewDialer returns a Dialer with the given connect timeout.
func NewDialer(g *Guard, r Resolver, connectTimeout time.Duration) *Dialer {
	return &Dialer{
		guard:    g,
		resolver: r,
		guarded:  &net.Dialer{Timeout: connectTimeout, Control: g.Control},
		listed: &net.Dialer{Timeout: connectTimeout, Control: func(network, _ string, _ syscall.RawConn) error {
			if network != "tcp4" && network != "tcp6" {
				return fmt.Errorf("%w: network %s", ErrNotAllowed, network)
			}
			return nil
		}},
	}
}

// DialContext is the http.Transport DialContext hook.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotAllowed, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%w: invalid port", ErrNotAllowed)
	}
	dialer := d.guarded
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		lookupName := absolute(host)
		if d.guard.allowHosts[host] {
			// The operator's name (a test's), resolved as the machine
			// resolves it: /etc/hosts keeps a single-label name unrooted.
			dialer, lookupName = d.listed, host
		}
		addrs, err = d.resolver.LookupNetIP(ctx, "ip", lookupName)
		if err != nil {
			return nil, lookupError(err)
		}
	}
	// IPv4 first: a server without IPv6 routes would otherwise spend the
	// connect timeout on each AAAA answer before trying A.
	family := func(a netip.Addr) int {
		if a.Unmap().Is4() {
			return 0
		}
		return 1
	}
	addrs = slices.Clone(addrs)
	slices.SortStableFunc(addrs, func(a, b netip.Addr) int { return cmp.Compare(family(a), family(b)) })
	var errs []error
	for _, a := range addrs {
		// Counted from before the connect (shoplimit): a server that
		// accepts and stalls the handshake holds a read as long as a slow
		// answer does. A failed connect gives its count back: a refused one
		// would otherwise pin that address's count for the whole read.
		done, err := shoplimit.Dial(ctx, a)
		if err != nil {
			return nil, err
		}
		conn, err := dialer.DialContext(ctx, network, netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		done(err == nil)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrUnresolvable, host)
	}
	return nil, dialErrors(errs)
}

// MaxRedirects bounds the redirects followed in one shop request.
const MaxRedirects = 3

// CheckRedirect is the http.Client CheckRedirect hook: at most MaxRedirects
// hops, each to an https address that passes the same checks as base_url.
// The connect-time check then applies to the address dialed.
func (g *Guard) CheckRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > MaxRedirects {
		return ErrTooManyRedirects
	}
	return g.CheckRedirectURL(req.URL)
}

// ErrTooManyRedirects is returned after MaxRedirects hops.
var ErrTooManyRedirects = errors.New("too many redirects")
