package upstream

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Resolver looks a host name up, as net.Resolver.LookupNetIP does with
// network "ip".
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// DiscoveryEvent reports one round of discovery that changed the set of
// instances or failed to resolve a name, for the gateway's log.
type DiscoveryEvent struct {
	Upstream  string
	Instances []string // every instance now, scheme://address:port
	Added     int
	Removed   int
	// Failed names the hosts that did not resolve (or resolved to no
	// address) this round; their instances from the round before stay.
	Failed []string
	Err    error // the first resolution error, if any
}

// Discover resolves the host name of every configured http:// URL each
// interval, until ctx ends, and makes each address it resolves to an
// instance of its own: with a Kubernetes headless Service or a Compose
// service scaled to several replicas, one URL then stands for every
// replica, so round-robin reaches new replicas as they appear, affinity
// keeps a key on one replica, and health is per replica. (One URL as one
// instance leaves balancing to the connection: kept-alive connections stay
// where they were opened, and a replica added by an autoscaler gets none.)
//
// A URL whose host is an IP address stays one instance, and so does an
// https:// URL: its certificate names the host, not the addresses. A name
// that fails to resolve, or resolves to no usable address, keeps the
// instances it had, so a DNS outage never empties an upstream. Instances
// that stay keep their connections and their health; removed ones have
// their idle connections closed (those that requests in flight give back
// later are closed by fasthttp after 30 s idle). report, if not nil, is
// called for each round that changed something or failed.
func (u *Upstream) Discover(ctx context.Context, interval time.Duration, resolve Resolver, report func(DiscoveryEvent)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	timeout := min(interval, maxResolveTime)
	for {
		ev := u.discoverOnce(ctx, timeout, resolve)
		if report != nil && ctx.Err() == nil && (ev.Added+ev.Removed > 0 || len(ev.Failed) > 0) {
			report(ev) // not on the way out: a lookup cut short by ctx is no DNS failure
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// discoverOnce resolves every source once and installs the resulting set.
// Rounds are serialized (discoverMu), so u.resolved and the set they
// replace are never written by two at once.
func (u *Upstream) discoverOnce(ctx context.Context, timeout time.Duration, resolve Resolver) DiscoveryEvent {
	u.discoverMu.Lock()
	defer u.discoverMu.Unlock()
	ev := DiscoveryEvent{Upstream: u.Name}
	var bases []string
	for i, src := range u.sources {
		resolved, err := resolveSource(ctx, timeout, src, resolve)
		if err != nil {
			ev.Failed = append(ev.Failed, src.Hostname())
			if ev.Err == nil {
				ev.Err = err
			}
			resolved = u.resolved[i] // keep what it stood for
		}
		u.resolved[i] = resolved
		bases = append(bases, resolved...)
	}
	slices.Sort(bases)
	bases = slices.Compact(bases)

	old := u.current()
	next, added := u.reuse(old, bases)
	u.instances.Store(&next)
	ev.Added = added
	for _, inst := range old {
		if !slices.Contains(next, inst) {
			ev.Removed++
			inst.client.CloseIdleConnections()
		}
	}
	for _, inst := range next {
		ev.Instances = append(ev.Instances, inst.base)
	}
	return ev
}

// maxResolveTime bounds one lookup.
const maxResolveTime = 5 * time.Second

// resolveSource returns the bases src stands for now: itself if its host
// is an address or it is https, else one per address its name resolves to.
func resolveSource(ctx context.Context, timeout time.Duration, src *url.URL, resolve Resolver) ([]string, error) {
	host := src.Hostname()
	if _, err := netip.ParseAddr(host); err == nil || src.Scheme != "http" {
		return []string{Base(src)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addrs, err := resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	port := portOf(src)
	bases := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if a.Zone() != "" {
			continue // a link-local address with a zone: no URL for it, and no other host could use it
		}
		bases = append(bases, "http://"+netip.AddrPortFrom(a.Unmap(), port).String())
	}
	if len(bases) == 0 {
		return nil, &net.DNSError{Err: "no usable address", Name: host, IsNotFound: true}
	}
	return bases, nil
}

// Base is scheme://host:port of a configured instance URL: its instance's
// base, which requests are sent to and logs, spans and metrics name it by.
// The host is in lower case (an IP address in its canonical form) and the
// port is written, the scheme's when the URL has none, as for the
// instances discovery finds: http://Reader, http://reader and
// http://reader:80 are one instance, named one way (each was named as
// written, so one instance had two names in the logs after a change of
// its setting, and Discover took the other spelling for a new instance).
func Base(src *url.URL) string {
	host := strings.ToLower(src.Hostname())
	if ip, err := netip.ParseAddr(src.Hostname()); err == nil {
		host = ip.String() // a zone (fe80::1%eth0) kept as written
	}
	return src.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(portOf(src))))
}

// portOf is src's port, or the scheme's default.
func portOf(src *url.URL) uint16 {
	if p, err := strconv.ParseUint(src.Port(), 10, 16); err == nil {
		return uint16(p)
	}
	if src.Scheme == "https" {
		return 443
	}
	return 80
}

// reuse returns the instances for bases, taking those already in old (with
// their connections and health) and making the rest; added counts the new.
func (u *Upstream) reuse(old []*Instance, bases []string) (next []*Instance, added int) {
	next = make([]*Instance, 0, len(bases))
	for _, base := range bases {
		if i := slices.IndexFunc(old, func(inst *Instance) bool { return inst.base == base }); i >= 0 {
			next = append(next, old[i])
			continue
		}
		p, err := ParseInstanceURL(base)
		if err != nil {
			continue // cannot happen: bases are built from parsed URLs
		}
		next = append(next, newInstance(p, u.opts))
		added++
	}
	return next, added
}
