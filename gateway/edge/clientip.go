package edge

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// clientAddress finds a request's client IP, for the per-IP limits, logs,
// spans and the X-Forwarded-For the services get.
//
// Without a proxy header (GATEWAY_PROXY_HEADER) it is the connection's
// peer. With one, the header is read only from a peer in
// GATEWAY_TRUSTED_PROXIES: from anyone else it is the client's own claim,
// and would let it pick its rate-limit bucket. The header may list
// addresses, each proxy appending the one it saw (X-Forwarded-For), and a
// client may send it already filled: the client is the right-most address
// that is not a trusted proxy, as nginx's real_ip_recursive reads it; what
// lies left of it was written by the client or by proxies not trusted.
// Empty list elements are skipped wherever they are (RFC 9110 5.6.1), so
// the header's lines read as the one line they join into (RFC 9110 5.3).
type clientAddress struct {
	header  string
	trusted []netip.Prefix
}

// read returns the client IP of a request from peer whose proxy header
// has the lines values (fasthttp's PeekAll, in order), with the entry of
// the header it stopped at because it is no address (nil when none): a
// header a trusted proxy wrote that holds something else (a custom header
// naming the scheme or the host) makes every client the proxy, and says
// so no other way.
func (a clientAddress) read(peer netip.Addr, values [][]byte) (client netip.Addr, notAnAddress []byte) {
	if a.header == "" || !a.isTrusted(peer) {
		return peer, nil
	}
	client = peer
	for line := len(values) - 1; line >= 0; line-- {
		rest := values[line]
		for len(rest) > 0 {
			field := rest
			if i := bytes.LastIndexByte(rest, ','); i >= 0 {
				field, rest = rest[i+1:], rest[:i]
			} else {
				rest = nil
			}
			if len(bytes.TrimSpace(field)) == 0 {
				continue
			}
			addr, ok := parseForwardedAddr(field)
			if !ok {
				return client, field // what lies left of a malformed entry is not trusted
			}
			client = addr
			if !a.isTrusted(addr) {
				return addr, nil
			}
		}
	}
	return client, nil
}

// entryShape describes a header entry without quoting it, for a log: a
// header named by mistake may carry a secret (a token, a cookie). It
// gives the entry's length and the kinds of characters it holds, each
// punctuation mark by itself ("5 bytes: letters"; "16 bytes: letters,
// digits, '.'").
func entryShape(field []byte) string {
	field = bytes.TrimSpace(field)
	var letters, digits, spaces, other bool
	var marks []string
	for _, b := range field {
		switch {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z':
			letters = true
		case '0' <= b && b <= '9':
			digits = true
		case b == ' ' || b == '\t':
			spaces = true
		case b > ' ' && b < 0x7f:
			if mark := "'" + string(rune(b)) + "'"; !slices.Contains(marks, mark) {
				marks = append(marks, mark)
			}
		default:
			other = true
		}
	}
	var kinds []string
	if letters {
		kinds = append(kinds, "letters")
	}
	if digits {
		kinds = append(kinds, "digits")
	}
	if spaces {
		kinds = append(kinds, "spaces")
	}
	kinds = append(kinds, marks...)
	if other {
		kinds = append(kinds, "other bytes")
	}
	return fmt.Sprintf("%d bytes: %s", len(field), strings.Join(kinds, ", "))
}

// isProxy reports whether ip, a client IP as of gives it, is a trusted
// proxy itself: a request the proxy made on its own behalf (a health
// check), naming no client. With no proxy header, no address is one.
func (a clientAddress) isProxy(ip string) bool {
	if a.header == "" {
		return false
	}
	addr, err := netip.ParseAddr(ip)
	return err == nil && a.isTrusted(addr)
}

func (a clientAddress) isTrusted(addr netip.Addr) bool {
	for _, p := range a.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// parseForwardedAddr reads one entry of a forwarding header: an IP, or an
// IP with a port as some proxies write it. An IPv6 zone is dropped: it
// names an interface of the host that wrote it, not the client, and would
// carry any text it holds into logs and the services' X-Forwarded-For.
func parseForwardedAddr(field []byte) (netip.Addr, bool) {
	s := strings.TrimSpace(string(field))
	if addr, err := netip.ParseAddr(s); err == nil {
		return addr.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

// parseTrustedProxies reads GATEWAY_TRUSTED_PROXIES' entries: IPs or CIDRs;
// false if one is neither.
func parseTrustedProxies(entries []string) ([]netip.Prefix, bool) {
	prefixes := make([]netip.Prefix, 0, len(entries))
	for _, e := range entries {
		if p, err := netip.ParsePrefix(e); err == nil {
			prefixes = append(prefixes, unmapPrefix(p).Masked())
			continue
		}
		addr, err := netip.ParseAddr(e)
		if err != nil {
			return nil, false
		}
		addr = addr.Unmap()
		prefixes = append(prefixes, netip.PrefixFrom(addr, addr.BitLen()))
	}
	return prefixes, true
}

// unmapPrefix gives an IPv4-mapped IPv6 CIDR (::ffff:10.0.0.0/104) as the
// IPv4 one it spans (10.0.0.0/8): the addresses it is matched against are
// unmapped, as a mapped single address is, and an IPv6 prefix contains no
// IPv4 address, so kept as written it trusted no proxy at all, and every
// client behind one had the proxy's address and its one per-IP budget.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if !p.Addr().Is4In6() || p.Bits() < 96 {
		return p
	}
	return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
}

// addressBucket is what the per-address limits (anonymous routes, failed
// logins) count a client address as: an IPv4 address whole, an IPv6
// address by its /64. A subscriber or a host of a provider holds a whole
// /64 and could take a fresh address for every request, each with a fresh
// budget (RFC 6177; the masks nginx and Cloudflare limit by too). Logs,
// spans and X-Forwarded-For keep the whole address.
func addressBucket(ip string) string {
	addr, err := netip.ParseAddr(ip)
	if err != nil || !addr.Is6() || addr.Is4In6() {
		return ip
	}
	return netip.PrefixFrom(addr.WithZone(""), 64).Masked().String()
}
