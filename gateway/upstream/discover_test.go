package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

var (
	v4 = netip.MustParseAddr("127.0.0.1")
	v6 = netip.MustParseAddr("::1")
)

// replicasOnOnePort starts two replicas of a service on the same port, one
// on 127.0.0.1 and one on ::1, as two pods behind one headless Service name
// would be (loopback only). Each answers its address in X-Replica.
func replicasOnOnePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l4, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l4.Addr().(*net.TCPAddr).Port
		l6, err := net.Listen("tcp", fmt.Sprintf("[::1]:%d", port))
		if err != nil { // the port is taken on ::1: try another
			l4.Close()
			continue
		}
		for _, l := range []net.Listener{l4, l6} {
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Replica", l.Addr().(*net.TCPAddr).IP.String())
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
		}
		return port
	}
	t.Fatal("no port free on both 127.0.0.1 and ::1")
	return 0
}

// fakeDNS answers what it is set to, and counts the lookups.
type fakeDNS struct {
	mu      sync.Mutex
	addrs   []netip.Addr
	err     error
	lookups int
}

func (d *fakeDNS) set(err error, addrs ...netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addrs, d.err = addrs, err
}

func (d *fakeDNS) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lookups++
	if host != "reader.svc.test" {
		return nil, fmt.Errorf("unexpected lookup of %q", host)
	}
	return slices.Clone(d.addrs), d.err
}

// servedBy sends n requests without affinity and returns the replicas that
// answered.
func servedBy(t *testing.T, u *Upstream, n int) []string {
	t.Helper()
	var replicas []string
	for range n {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.Header.SetMethod("GET")
		if _, err := u.Do(req, resp, "/v1/x", Repeat{IfClosed: true}, ""); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("Do = %d, %v; want 200", resp.StatusCode(), err)
		}
		replicas = append(replicas, string(resp.Header.Peek("X-Replica")))
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	slices.Sort(replicas)
	return slices.Compact(replicas)
}

// One name that resolves to several addresses becomes one instance per
// address, follows the name as replicas come and go, and keeps an instance
// (its connections, its health) while its address stays.
func TestDiscoveryFollowsTheReplicasOfAName(t *testing.T) {
	port := replicasOnOnePort(t)
	u, err := New("svc", []string{fmt.Sprintf("http://reader.svc.test:%d", port)}, opts())
	if err != nil {
		t.Fatal(err)
	}
	dns := &fakeDNS{}
	ctx := context.Background()

	dns.set(nil, v4)
	ev := u.discoverOnce(ctx, time.Second, dns.resolve)
	if want := []string{fmt.Sprintf("http://127.0.0.1:%d", port)}; !slices.Equal(ev.Instances, want) || ev.Added != 1 || ev.Removed != 1 {
		t.Fatalf("first round = %+v; want instances %v, 1 added, the name's own instance removed", ev, want)
	}
	if got := servedBy(t, u, 4); !slices.Equal(got, []string{"127.0.0.1"}) {
		t.Errorf("one replica resolved: served by %v, want 127.0.0.1 alone", got)
	}
	kept := u.current()[0]

	dns.set(nil, v6, v4) // a second replica appears
	ev = u.discoverOnce(ctx, time.Second, dns.resolve)
	if len(ev.Instances) != 2 || ev.Added != 1 || ev.Removed != 0 {
		t.Fatalf("second round = %+v; want 2 instances, 1 added", ev)
	}
	if !slices.Contains(u.current(), kept) {
		t.Error("the instance of the address that stayed was replaced; want it kept with its connections and health")
	}
	if got := servedBy(t, u, 4); !slices.Equal(got, []string{"127.0.0.1", "::1"}) {
		t.Errorf("two replicas resolved: round-robin served by %v, want both", got)
	}

	dns.set(nil, v6) // the first replica goes away
	ev = u.discoverOnce(ctx, time.Second, dns.resolve)
	if want := []string{fmt.Sprintf("http://[::1]:%d", port)}; !slices.Equal(ev.Instances, want) || ev.Removed != 1 {
		t.Fatalf("third round = %+v; want instances %v, 1 removed", ev, want)
	}
	if got := servedBy(t, u, 4); !slices.Equal(got, []string{"::1"}) {
		t.Errorf("one replica left: served by %v, want ::1 alone", got)
	}
}

// A name that fails to resolve, or resolves to no usable address, keeps
// the instances it had: a DNS outage must not empty an upstream.
func TestFailedResolutionKeepsTheInstances(t *testing.T) {
	u, err := New("svc", []string{"http://reader.svc.test:8081"}, opts())
	if err != nil {
		t.Fatal(err)
	}
	dns := &fakeDNS{}
	ctx := context.Background()
	dns.set(nil, v4, v6)
	before := u.discoverOnce(ctx, time.Second, dns.resolve).Instances

	for _, tt := range []struct {
		name  string
		err   error
		addrs []netip.Addr
	}{
		{"lookup error", errors.New("server misbehaving"), nil},
		{"no address", nil, nil},
		{"only a zoned link-local address", nil, []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}},
	} {
		dns.set(tt.err, tt.addrs...)
		ev := u.discoverOnce(ctx, time.Second, dns.resolve)
		if !slices.Equal(ev.Instances, before) || ev.Added+ev.Removed != 0 {
			t.Errorf("%s: instances %v (+%d −%d), want %v unchanged", tt.name, ev.Instances, ev.Added, ev.Removed, before)
		}
		if !slices.Equal(ev.Failed, []string{"reader.svc.test"}) || ev.Err == nil {
			t.Errorf("%s: event %+v, want the name reported as failed with its error", tt.name, ev)
		}
	}
}

// An address stays one instance, and so does an https URL (its certificate
// names the host); neither is looked up.
func TestAddressesAndHTTPSAreNotResolved(t *testing.T) {
	urls := []string{"http://127.0.0.1:8081", "http://[::1]:8081", "https://reader.svc.test"}
	u, err := New("svc", urls, opts())
	if err != nil {
		t.Fatal(err)
	}
	dns := &fakeDNS{}
	ev := u.discoverOnce(context.Background(), time.Second, dns.resolve)
	want := []string{"http://127.0.0.1:8081", "http://[::1]:8081", "https://reader.svc.test:443"} // its port written (Base)
	if !slices.Equal(ev.Instances, want) || ev.Added+ev.Removed != 0 || dns.lookups != 0 {
		t.Errorf("round = %+v after %d lookups; want %v unchanged and no lookup", ev, dns.lookups, want)
	}
}

// Discover reports the rounds that change something, and only those.
func TestDiscoverReportsChanges(t *testing.T) {
	u, err := New("svc", []string{"http://reader.svc.test:8081"}, opts())
	if err != nil {
		t.Fatal(err)
	}
	dns := &fakeDNS{}
	dns.set(nil, v4)
	events := make(chan DiscoveryEvent, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		u.Discover(ctx, 5*time.Millisecond, dns.resolve, func(ev DiscoveryEvent) { events <- ev })
	}()
	defer func() { cancel(); <-done }()

	first := <-events
	if first.Added != 1 || first.Removed != 1 {
		t.Fatalf("first report = %+v, want the address added and the name's instance removed", first)
	}
	dns.set(nil, v4, v6)
	select {
	case ev := <-events:
		if ev.Added != 1 || len(ev.Instances) != 2 {
			t.Errorf("report after a replica appeared = %+v, want 1 added, 2 instances", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no report after a replica appeared")
	}
	// Unchanged rounds report nothing.
	time.Sleep(50 * time.Millisecond)
	if len(events) != 0 {
		t.Errorf("%d reports of unchanged rounds, want none", len(events))
	}
}
