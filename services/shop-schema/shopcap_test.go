package main

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"

	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
)

// shopCertificate is the one certificate of every shop of these tests:
// their addresses and the names that resolve to them, so that one CA file
// trusts them all.
var shopCertificate = sync.OnceValue(func() tls.Certificate {
	return fakeshop.SelfSigned([]string{"127.0.0.1", "127.0.0.2", "a.shop.test", "b.shop.test", "both.shop.test"},
		time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
})

// shopCert returns a sample shop that presents shopCertificate.
func shopCert() *fakeshop.Shop {
	shop := fakeshop.Sample("8", false)
	cert := shopCertificate()
	shop.Certificate = &cert
	return shop
}

// perShopEnv allows the loopback shops of these tests, and caps the reads
// at slots in all, perShop of one shop.
func perShopEnv(slots, perShop string) map[string]string {
	return map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": "127.0.0.0/8", "SHOP_SCHEMA_MAX_CONCURRENT": slots,
		"SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP": perShop}
}

// heldReads starts n reads of base_url, each signed with its own request
// id, and returns once the shop holds the first requests of all of them
// (each read asks four resources at once): their answers come on the
// channel once the shop is let go.
func heldReads(t *testing.T, svc *service, shop *fakeshop.Shop, baseURL string, n int) <-chan int {
	t.Helper()
	answers := make(chan int, n)
	for i := range n {
		go func() { answers <- svc.sendAs("held-"+string(rune('a'+i)), body(baseURL, fakeshop.Key)) }()
	}
	waitFor(t, "the shop to hold every read", func() bool {
		select {
		case status := <-answers:
			t.Fatalf("a read meant to be held at the shop was answered %d", status)
		default:
		}
		return len(shop.Requests()) >= 4*n
	})
	return answers
}

// waitFor polls done until it holds, for at most 10 s.
func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !done(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// series returns the value of each metric of svc that has one series
// (gauges and counters without labels).
func series(t *testing.T, svc *service) map[string]float64 {
	t.Helper()
	families, err := svc.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range families {
		if len(f.Metric) != 1 {
			continue
		}
		switch m := f.Metric[0]; {
		case m.Gauge != nil:
			values[f.GetName()] = m.Gauge.GetValue()
		case m.Counter != nil:
			values[f.GetName()] = m.Counter.GetValue()
		}
	}
	return values
}

// held returns the slots held now and the reads counted against shops.
func held(t *testing.T, svc *service) (slots, shopCounts float64) {
	v := series(t, svc)
	return v["shop_schema_slots_held"], v["shop_schema_shop_counts_held"]
}

// waitNothingHeld waits until every slot and every per-shop count is free
// again: the handler frees them after it has written its answer.
func waitNothingHeld(t *testing.T, svc *service, after string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		slots, counts := held(t, svc)
		if slots == 0 && counts == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v slots and %v per-shop counts still held 10 s on, want 0 and 0", after, slots, counts)
		}
	}
}

// checkShopBusy checks a refusal by the per-shop cap: 429 rate_limited,
// Retry-After, a message about this shop's reads, nothing of the key.
func checkShopBusy(t *testing.T, svc *service, what, baseURL string) {
	t.Helper()
	status, header, env := svc.postForHeaders(t, body(baseURL, fakeshop.Key))
	if status != http.StatusTooManyRequests || errCode(env) != "rate_limited" ||
		!strings.Contains(env.Error.Message, "too many reads of this shop") {
		t.Errorf("%s = %d %s %q, want 429 rate_limited, too many reads of this shop", what, status, errCode(env), env.Error.Message)
	}
	if header.Get("Retry-After") == "" {
		t.Errorf("%s: 429 without Retry-After", what)
	}
}

// One slow shop, read by many callers at once (from as many client
// addresses: the gateway's cap per address does not bound them), holds at
// most SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP slots: the reads past it are
// refused 429 at once, and another shop's read is answered meanwhile.
// Without the cap, the slow shop's reads took every slot and the other
// shop's read was refused.
func TestOneSlowShopHoldsAtMostItsCap(t *testing.T) {
	slow := shopCert()
	slow.Hold = make(chan struct{})
	slow.Start(t.Cleanup)
	other := shopCert()
	other.StartOn("127.0.0.2:0", t.Cleanup)
	svc := startService(t, slow, perShopEnv("4", "2"))
	first := heldReads(t, svc, slow, slow.URL(), 2)
	// Two more at once, as from two more client addresses: refused at
	// once, where without the cap they took the last two slots.
	more := make(chan int, 2)
	for range 2 {
		go func() { more <- svc.sendAs("more", body(slow.URL(), fakeshop.Key)) }()
	}
	waitFor(t, "the two more reads to be answered or held", func() bool {
		return len(more) == 2 || len(slow.Requests()) >= 4*4
	})
	if status, env := svc.post(t, body(other.URL(), fakeshop.Key)); status != http.StatusOK {
		t.Errorf("another shop's read, the slow one holding its cap = %d %s, want 200", status, errCode(env))
	}
	for range 2 {
		if got := <-more; got != http.StatusTooManyRequests {
			t.Errorf("a read of the slow shop past its cap = %d, want 429", got)
		}
	}
	checkShopBusy(t, svc, "a fifth read of the slow shop", slow.URL())
	line := logLine(t, svc.logs, "shop schema read refused: too many reads of this shop in progress")
	want := map[string]any{"level": "WARN", "shop": "127.0.0.1/32", "shop_host": "127.0.0.1", "per_shop_max": 2.0, "shop_reads": 2.0}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("the WARN's %s = %v, want %v", k, line[k], v)
		}
	}
	if n := strings.Count(svc.logs.String(), "too many reads of this shop in progress"); n != 1 {
		t.Errorf("%d WARNs of 3 refusals at once, want 1 (one per 10 s)", n)
	}
	if got := series(t, svc)["shop_schema_shop_busy_total"]; got != 3 {
		t.Errorf("shop_schema_shop_busy_total = %v, want 3", got)
	}
	if strings.Contains(svc.logs.String(), fakeshop.Key) {
		t.Errorf("the logs hold the shop's key:\n%s", svc.logs)
	}
	close(slow.Hold)
	for range 2 {
		if got := <-first; got != http.StatusOK {
			t.Errorf("a held read of the slow shop = %d, want 200", got)
		}
	}
	waitNothingHeld(t, svc, "the reads ended")
}

// Two host names that resolve to one address are one shop (wildcard DNS
// gives a caller as many names as it likes for one slow server), and so is
// the address written as base_url: with a cap of 1, a read by the second
// name, or by the address, is refused while the first name's is held.
// Without the cap both were let through to the held shop.
func TestHostNamesOfOneAddressAreOneShop(t *testing.T) {
	shop := shopCert()
	shop.Hold = make(chan struct{})
	shop.Start(t.Cleanup)
	_, port, _ := net.SplitHostPort(shop.Addr())
	env := perShopEnv("8", "1")
	env["SHOP_SCHEMA_PORTS"] = port // a name's port is checked as a shop's
	svc := startServiceWith(t, shop, env,
		fakeshop.Resolver{"a.shop.test": {"127.0.0.1"}, "b.shop.test": {"127.0.0.1"}})
	first := heldReads(t, svc, shop, "https://a.shop.test:"+port, 1)
	checkShopBusy(t, svc, "a read by another name of the held shop's address", "https://b.shop.test:"+port)
	checkShopBusy(t, svc, "a read by the held shop's address", shop.URL())
	close(shop.Hold)
	if got := <-first; got != http.StatusOK {
		t.Errorf("the held read = %d, want 200", got)
	}
	waitNothingHeld(t, svc, "the read ended")
	if status, env := svc.post(t, body("https://b.shop.test:"+port, fakeshop.Key)); status != http.StatusOK {
		t.Errorf("a read by the other name once the first ended = %d %s, want 200", status, errCode(env))
	}
}

// Reads of one shop over HTTP/2 share one connection, which only the
// first dials: each request counts against the shop of the connection it
// gets (reused ones too), so the second read is refused all the same.
func TestReadsSharingAConnectionCountAgainstItsShop(t *testing.T) {
	shop := shopCert()
	shop.HTTP2 = true
	shop.Hold = make(chan struct{})
	shop.Start(t.Cleanup)
	svc := startService(t, shop, perShopEnv("8", "1"))
	first := heldReads(t, svc, shop, shop.URL(), 1)
	checkShopBusy(t, svc, "a second read over the held read's HTTP/2 connection", shop.URL())
	close(shop.Hold)
	if got := <-first; got != http.StatusOK {
		t.Errorf("the held read = %d, want 200", got)
	}
	waitNothingHeld(t, svc, "the read ended")
}

// Slots and per-shop counts return to 0 however a read ends: answered,
// failed by the shop, out of time, its caller gone, refused by the cap, or
// after dialing several addresses of a name (the first refusing the
// connection). With a cap of 1, a read of the same shop after each is
// answered: a count left behind would refuse it.
func TestShopCountsReturnToZero(t *testing.T) {
	shop := shopCert()
	shop.Start(t.Cleanup)
	slow := shopCert()
	slow.Hold = make(chan struct{})
	slow.StartOn("127.0.0.2:0", t.Cleanup)
	t.Cleanup(func() { close(slow.Hold) })
	_, port, _ := net.SplitHostPort(shop.Addr())
	env := perShopEnv("8", "1")
	env["SHOP_SCHEMA_TIMEOUT"], env["SHOP_SCHEMA_CONNECT_TIMEOUT"] = "1s", "1s"
	env["SHOP_SCHEMA_PORTS"] = port
	svc := startServiceWith(t, shop, env, fakeshop.Resolver{"both.shop.test": {"127.0.0.3", "127.0.0.1"}})
	readAgain := func(after string) {
		t.Helper()
		waitNothingHeld(t, svc, after)
		if status, env := svc.post(t, body(shop.URL(), fakeshop.Key)); status != http.StatusOK {
			t.Errorf("after %s, a read of the same shop = %d %s, want 200", after, status, errCode(env))
		}
	}
	readAgain("nothing")

	if status, env := svc.post(t, body(shop.URL(), "WRONGKEYWRONGKEYWRONGKEYWRONGKEY")); status != http.StatusBadRequest {
		t.Errorf("a read with a wrong key = %d %s, want 400", status, errCode(env))
	}
	readAgain("a read the shop refused (shop_401)")

	if status, env := svc.post(t, body("https://both.shop.test:"+port, fakeshop.Key)); status != http.StatusOK {
		t.Errorf("a read of a name whose first address refuses connections = %d %s, want 200", status, errCode(env))
	}
	readAgain("a read that dialed two addresses")

	if status, env := svc.post(t, body(slow.URL(), fakeshop.Key)); status != http.StatusGatewayTimeout {
		t.Errorf("a read of a shop that does not answer = %d %s, want 504", status, errCode(env))
	}
	waitNothingHeld(t, svc, "a read out of time")

	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, svc.url+"/v1/sync/prestashop/schema",
			strings.NewReader(body(slow.URL(), fakeshop.Key)))
		for _, h := range svc.signer.Sign(identity.Identity{RequestID: "leaves"}, identity.RequestOf(req), time.Now()) {
			req.Header.Set(h.Name, h.Value)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the read to be counted against its shop", func() bool { _, counts := held(t, svc); return counts == 1 })
	checkShopBusy(t, svc, "a read while another holds the shop", slow.URL())
	cancel()
	<-gone
	waitNothingHeld(t, svc, "a caller that went away and a read refused by the cap")
}

// A read counts against its shop from the connect on, before the TLS
// handshake: a server that accepts and never answers it holds the read for
// SHOP_SCHEMA_CONNECT_TIMEOUT per connection without any request sent, and
// with a cap of 1 a second read of it is refused meanwhile.
func TestAShopStallingItsHandshakeCountsFromTheConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- conn // held open, never a byte written
		}
	}()
	t.Cleanup(func() {
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	})
	env := perShopEnv("8", "1")
	env["SHOP_SCHEMA_TIMEOUT"], env["SHOP_SCHEMA_CONNECT_TIMEOUT"] = "2s", "2s"
	svc := startService(t, nil, env)
	baseURL := "https://" + ln.Addr().String()
	first := make(chan int, 1)
	go func() { first <- svc.sendAs("stalled", body(baseURL, fakeshop.Key)) }()
	waitFor(t, "the stalling server to accept the first read's connection", func() bool { return len(accepted) > 0 })
	checkShopBusy(t, svc, "a second read of a server stalling the first's handshake", baseURL)
	if got := <-first; got == http.StatusOK || got == http.StatusTooManyRequests {
		t.Errorf("the read of a server that never answers its handshake = %d, want a failure of the shop", got)
	}
	waitNothingHeld(t, svc, "a read whose handshake timed out")
}

// lateResolver answers the first lookup of each name at once (the
// service's check of base_url, before the read) and holds every later one
// (its dials') until answer is called.
type lateResolver struct {
	names    fakeshop.Resolver
	late     chan struct{}
	answer   func()
	mu       sync.Mutex
	asked    map[string]int
	held     atomic.Int64 // dials' lookups waiting, or answered
	answered atomic.Int64
}

func newLateResolver(names fakeshop.Resolver) *lateResolver {
	r := &lateResolver{names: names, late: make(chan struct{}), asked: map[string]int{}}
	r.answer = sync.OnceFunc(func() { close(r.late) })
	return r
}

// LookupNetIP is the guard's resolver method. It ignores ctx, as a lookup
// does that the context of a dial in the background never cancels.
func (r *lateResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.asked[host]++
	first := r.asked[host] == 1
	r.mu.Unlock()
	if !first {
		r.held.Add(1)
		<-r.late
		defer r.answered.Add(1)
	}
	return r.names.LookupNetIP(ctx, network, host)
}

// A read that ends while its dials wait on a slow lookup (its time out, its
// caller gone) leaves no count behind: net/http dials on in the background
// once the request is gone, with its context's values (the read's claim),
// and the count each such dial took once the lookup answered was never
// released. With a cap of 1, every later read of the shop was refused 429
// for the life of the process; a caller whose name answers slowly, then
// with a merchant's address, did so at will.
func TestADialOutlivingItsReadLeavesNoCount(t *testing.T) {
	shop := shopCert()
	shop.Start(t.Cleanup)
	_, port, _ := net.SplitHostPort(shop.Addr())
	env := perShopEnv("8", "1")
	env["SHOP_SCHEMA_TIMEOUT"], env["SHOP_SCHEMA_CONNECT_TIMEOUT"] = "1s", "1s"
	env["SHOP_SCHEMA_PORTS"] = port
	dns := newLateResolver(fakeshop.Resolver{"late.shop.test": {"127.0.0.1"}})
	t.Cleanup(dns.answer)
	svc := startServiceWith(t, shop, env, dns)
	if status, env := svc.post(t, body("https://late.shop.test:"+port, fakeshop.Key)); status != http.StatusGatewayTimeout {
		t.Errorf("a read whose dials' lookups outlast it = %d %s, want 504", status, errCode(env))
	}
	waitNothingHeld(t, svc, "a read out of time in its dials' lookups")
	held := dns.held.Load()
	if held == 0 {
		t.Fatal("no dial of the read was held in its lookup: the test proved nothing")
	}
	dns.answer()
	waitFor(t, "the held lookups to be answered", func() bool { return dns.answered.Load() == held })
	if status, env := svc.post(t, body(shop.URL(), fakeshop.Key)); status != http.StatusOK {
		t.Errorf("a read of the shop once the ended read's dials went on = %d %s, want 200", status, errCode(env))
	}
	waitNothingHeld(t, svc, "the dials of an ended read went on")
}

// A read does not pin the count of a shop whose connect failed: a name
// whose first address is a merchant's shop, on a port it does not serve
// (the connect refused at once), and whose next is the caller's own slow
// server counted against the merchant for the whole read, and with a cap
// of 1 the merchant's own read was refused 429 while the caller's waited.
func TestARefusedConnectDoesNotPinItsShop(t *testing.T) {
	merchant := shopCert()
	merchant.Start(t.Cleanup)
	slow := shopCert()
	slow.Hold = make(chan struct{})
	slow.StartOn("127.0.0.2:0", t.Cleanup)
	t.Cleanup(func() { close(slow.Hold) })
	_, merchantPort, _ := net.SplitHostPort(merchant.Addr())
	_, slowPort, _ := net.SplitHostPort(slow.Addr())
	env := perShopEnv("8", "1")
	env["SHOP_SCHEMA_PORTS"] = merchantPort + "," + slowPort
	// both.shop.test's first address is the merchant's, where nothing
	// listens on the slow server's port.
	svc := startServiceWith(t, merchant, env, fakeshop.Resolver{"both.shop.test": {"127.0.0.1", "127.0.0.2"}})
	heldReads(t, svc, slow, "https://both.shop.test:"+slowPort, 1)
	if _, counts := held(t, svc); counts != 1 {
		t.Errorf("per-shop counts of a read held at its second address = %v, want 1 (that address's)", counts)
	}
	if status, env := svc.post(t, body(merchant.URL(), fakeshop.Key)); status != http.StatusOK {
		t.Errorf("the merchant's read while another read is held past its address = %d %s, want 200", status, errCode(env))
	}
}

// Without SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP (the default: off) nothing
// is counted per shop: one slow shop may hold every slot, as the cap is
// meant to allow only when turned on, no read is refused as its shop's
// (the refusal is of every slot taken), and the per-shop series stay 0.
func TestWithoutTheCapOneShopMayHoldEverySlot(t *testing.T) {
	slow := shopCert()
	slow.Hold = make(chan struct{})
	slow.Start(t.Cleanup)
	other := shopCert()
	other.StartOn("127.0.0.2:0", t.Cleanup)
	svc := startService(t, slow, map[string]string{"SHOP_SCHEMA_ALLOW_HOSTS": "127.0.0.0/8", "SHOP_SCHEMA_MAX_CONCURRENT": "5"})
	held := heldReads(t, svc, slow, slow.URL(), 5)
	status, env := svc.post(t, body(other.URL(), fakeshop.Key))
	if status != http.StatusTooManyRequests || !strings.Contains(env.Error.Message, "too many shop schema reads in progress") {
		t.Errorf("another shop's read, every slot held by one shop = %d %s %q, want 429, every slot taken",
			status, errCode(env), env.Error.Message)
	}
	got := series(t, svc)
	if got["shop_schema_slots_held"] != 5 || got["shop_schema_shop_counts_held"] != 0 || got["shop_schema_shop_busy_total"] != 0 {
		t.Errorf("slots held %v, per-shop counts %v, refused by the per-shop cap %v; want 5, 0, 0 (no cap, no claim)",
			got["shop_schema_slots_held"], got["shop_schema_shop_counts_held"], got["shop_schema_shop_busy_total"])
	}
	close(slow.Hold)
	for range 5 {
		if status := <-held; status != http.StatusOK {
			t.Errorf("a held read of the slow shop = %d, want 200", status)
		}
	}
}
