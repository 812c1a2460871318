package edge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/valyala/fasthttp"
)

// The settings FuzzRelay's gateway runs with: short, so that an answer cut
// short, stalled or never read ends its call within a second or two, and
// one connection per instance, so that a call that leaked its upstream
// connection fails every call after it.
var fuzzRelayEnv = map[string]string{
	"UPSTREAM_READ_TIMEOUT": "300ms", "UPSTREAM_WRITE_TIMEOUT": "300ms", "UPSTREAM_CONNECT_TIMEOUT": "300ms",
	"UPSTREAM_MAX_CONNS": "1", "GATEWAY_WRITE_TIMEOUT": "1s", "GATEWAY_READ_TIMEOUT": "2s",
	"RATE_LIMIT_ENABLED": "false", "RATE_LIMIT_OWNER_IN_FLIGHT": "4", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "2",
	"LOG_LEVEL": "error", // the panic's line alone, not an access line per exec
}

// fuzzRelayHeldLimit is the held-answers budget FuzzRelay's gateway holds:
// small, so that answers past it (and at it, ± 1) cost little to make.
const fuzzRelayHeldLimit = 1 << 20

// fuzzRelayClientBound is how long a client of FuzzRelay waits for its
// answer: past every timeout the gateway runs with (fuzzRelayEnv), so a
// client still waiting then was left hanging.
const fuzzRelayClientBound = 5 * time.Second

// relayKeys grants every well-formed key both scopes, as owner o1 of
// platform market-a: one key for the export routes and the sales.
type relayKeys struct{}

func (relayKeys) Lookup(context.Context, string, func() bool) (keystore.Key, error) {
	return keystore.Key{ID: "k1", OwnerID: "o1", PlatformID: "market-a",
		Scopes: []string{identity.ScopeExportRead, identity.ScopeSalesWrite}}, nil
}

func (relayKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

// scriptedUpstream is an instance whose answer to the next request is
// whatever the test last set: raw bytes, then the connection closed,
// stalled until the gateway drops it, or kept for the next request. Its
// probes (/healthz) are answered 200.
type scriptedUpstream struct {
	mu     sync.Mutex
	answer []byte
	after  connAfter
	// answered counts the scripted answers written.
	answered atomic.Int64
}

// connAfter is what scriptedUpstream does with a connection once it has
// written its answer.
type connAfter uint8

const (
	afterKeep  connAfter = iota // reads the next request on it
	afterClose                  // closes it
	afterStall                  // writes nothing more until the gateway closes it (or 3 s)
	connAfters
)

func (u *scriptedUpstream) set(answer []byte, after connAfter) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.answer, u.after = answer, after
}

func (u *scriptedUpstream) serve(conn net.Conn) {
	r := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if req.URL.Path == "/healthz" {
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			continue
		}
		u.mu.Lock()
		answer, after := u.answer, u.after
		u.mu.Unlock()
		_, err = conn.Write(answer)
		u.answered.Add(1)
		if err != nil {
			return
		}
		switch after {
		case afterClose:
			return
		case afterStall:
			_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, _ = io.Copy(io.Discard, conn)
			return
		}
	}
}

// relayRoutes are the routes FuzzRelay calls: the two whose answers are
// asked for as streams and read whole up to a bound, a sale, read whole,
// and the shop schema.
var relayRoutes = []struct {
	method, target, upstream string
	streamed                 bool // every answer with a length relayed as it comes
}{
	{"GET", "/v1/export/items?cursor=c1", upstreamExportReader, false},
	{"GET", "/v1/export/items/coin-1", upstreamExportReader, false},
	{"POST", "/v1/export/items/coin-1/sales/confirm", upstreamSalesWriter, false},
	// The address's slot held until the answer has left.
	{"POST", "/v1/sync/prestashop/schema", upstreamShopSchema, true},
}

// clientWay is how FuzzRelay's client takes its answer.
type clientWay uint8

const (
	readWhole11 clientWay = iota // reads it whole, in HTTP/1.1
	readWhole10                  // reads it whole, in HTTP/1.0
	closeAtOnce                  // closes its connection once the request is sent
	neverRead                    // reads nothing until the call has ended
	clientWays
)

// answerOf is an upstream's raw answer: the status line, header lines,
// and body.
func answerOf(status string, headers []string, body string) []byte {
	var b strings.Builder
	b.WriteString(status + "\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n" + body)
	return []byte(b.String())
}

// FuzzRelay puts the gateway in front of an instance whose raw answer
// comes from the fuzzer (any status line, Content-Length or none or
// several, Transfer-Encoding, chunk sizes, a body cut short or longer than
// announced, the connection closed or stalled after it) on the list, item,
// sale and shop schema routes, for a client that reads the answer whole (in
// HTTP/1.1 or 1.0), closes at once or never reads. Once the call has ended,
// whatever the answer: the client got the relayed answer (its status within
// 200-599) or an envelope, never waited past the
// gateway's timeouts, the gateway did not panic, and the owner's slots (and the address's, on the shop schema route),
// the held-answers budget and the upstream connection (one per instance)
// are all free again. An answer with a Content-Length near the largest
// int, while another was held, once panicked the relay and held the
// owner's slots and the connection for good (TestAnAnswerOfAnyLengthLeavesTheBudgetBounded).
func FuzzRelay(f *testing.F) {
	for _, seed := range relaySeeds() {
		for route := range uint8(len(relayRoutes)) {
			f.Add(seed, route, uint8(afterClose), uint8(readWhole11), uint32(0))
			f.Add(seed, route, uint8(afterClose), uint8(readWhole11), uint32(64<<10)) // another page held
		}
	}
	big := answerOf("HTTP/1.1 200 OK", []string{fmt.Sprintf("Content-Length: %d", fuzzRelayHeldLimit-1)}, "{")
	f.Add(big, uint8(0), uint8(afterStall), uint8(neverRead), uint32(0))
	f.Add(big, uint8(1), uint8(afterKeep), uint8(closeAtOnce), uint32(0))
	f.Add(big, uint8(0), uint8(afterClose), uint8(readWhole10), uint32(0))
	chunked := answerOf("HTTP/1.1 200 OK", []string{"Transfer-Encoding: chunked"}, "2\r\n{}\r\n0\r\n\r\n")
	f.Add(chunked, uint8(1), uint8(afterKeep), uint8(readWhole10), uint32(0))
	f.Add(chunked, uint8(2), uint8(afterStall), uint8(neverRead), uint32(0))

	old := heldAnswersLimit
	heldAnswersLimit = fuzzRelayHeldLimit
	f.Cleanup(func() { heldAnswersLimit = old })
	up := &scriptedUpstream{}
	addr := "http://" + testenv.ServeConns(f, up.serve)
	env := map[string]string{"EXPORT_READER_URLS": addr, "SALES_WRITER_URLS": addr, "SHOP_SCHEMA_URLS": addr}
	for k, v := range fuzzRelayEnv {
		env[k] = v
	}
	g, logs := startWithHook(f, env, func(g *Gateway) { g.keys = relayKeys{} })
	key := wellFormedKey(f)
	f.Fuzz(func(t *testing.T, answer []byte, route, after, way uint8, othersHeld uint32) {
		rt := relayRoutes[int(route)%len(relayRoutes)]
		up.set(answer, connAfter(after%uint8(connAfters)))
		panicsBefore := strings.Count(logs.String(), "panic while serving")
		answeredBefore := up.answered.Load()
		answered := func() bool { return up.answered.Load() > answeredBefore }
		// Other answers held whole meanwhile, counted as theirs are.
		others := int(othersHeld) % (fuzzRelayHeldLimit + 1)
		g.heldAnswers.add(others)
		defer g.heldAnswers.give(others)
		ended := func() bool { return slotsHeld(g) == 0 && heldBytes(g) == others }
		got, err := callRelayed(g.Addr(), key, rt.method, rt.target, clientWay(way%uint8(clientWays)), answered, ended)
		if err != nil {
			t.Fatalf("%s %s, upstream answering %q: %v", rt.method, rt.target, answer, err)
		}
		if got != nil {
			checkRelayed(t, answer, got, rt.streamed)
		}
		if !within(fuzzRelayClientBound, ended) {
			t.Fatalf("%s %s, upstream answering %q: %d slots, %d bytes held %s after the call",
				rt.method, rt.target, answer, slotsHeld(g), heldBytes(g), fuzzRelayClientBound)
		}
		if n := strings.Count(logs.String(), "panic while serving"); n != panicsBefore {
			t.Fatalf("%s %s, upstream answering %q: the gateway panicked", rt.method, rt.target, answer)
		}
		// One connection per instance: held still, the next call finds
		// none free. It may find one the fuzzed answer left bytes on (a
		// body longer than announced), which fails that call alone.
		up.set(answerOf("HTTP/1.1 200 OK", []string{"Content-Length: 12"}, `{"data":{}}`+"\n"), afterKeep)
		var last *relayedAnswer
		for range 3 {
			if last, err = callRelayed(g.Addr(), key, rt.method, rt.target, readWhole11, nil, nil); err == nil && last.status == 200 {
				break
			}
		}
		if err != nil || last.status != 200 {
			t.Fatalf("%s %s, upstream answering %q: the next calls, to an instance answering 200, got %+v (%v): its connection was not given back",
				rt.method, rt.target, answer, last, err)
		}
		if !within(fuzzRelayClientBound, ended) {
			t.Fatalf("after an answer of 200: %d slots, %d bytes held", slotsHeld(g), heldBytes(g))
		}
	})
}

// relaySeeds are FuzzRelay's answers: lengths at every bound that picks a
// way of relaying (0, smallAnswerBytes, the held budget, each ± 1), huge
// and negative ones, several, none, chunked, cut short or longer than
// announced, HTTP/1.0.
func relaySeeds() [][]byte {
	ok := "HTTP/1.1 200 OK"
	var seeds [][]byte
	for _, n := range []int{0, 1, smallAnswerBytes - 1, smallAnswerBytes, smallAnswerBytes + 1,
		fuzzRelayHeldLimit - 1, fuzzRelayHeldLimit, fuzzRelayHeldLimit + 1} {
		seeds = append(seeds, answerOf(ok, []string{fmt.Sprintf("Content-Length: %d", n)}, strings.Repeat("x", n)))
	}
	for _, length := range []string{"9223372036854775807", "9223372036854775808", "9223372036853727232",
		"4611686018427387905", "-1", "-9223372036854775808", "1e3", "0x10", " 5", "5, 5"} {
		seeds = append(seeds, answerOf(ok, []string{"Content-Length: " + length}, "{}"))
	}
	for _, tt := range []struct {
		status  string
		headers []string
		body    string
	}{
		{ok, []string{"Content-Length: 2", "Content-Length: 3"}, "{}x"},
		{ok, []string{"Content-Length: 100"}, "{}"},                             // cut short
		{ok, []string{"Content-Length: 2"}, "{}HTTP/1.1 404 Not Found\r\n\r\n"}, // longer than announced
		{ok, nil, "{}"},
		{ok, []string{"Transfer-Encoding: chunked"}, "2\r\n{}\r\n0\r\n\r\n"},
		{ok, []string{"Transfer-Encoding: chunked"}, "ffffffffffffffff\r\n{}"},
		{ok, []string{"Transfer-Encoding: chunked"}, "4000\r\n{}"},
		{ok, []string{"Transfer-Encoding: chunked", "Content-Length: 2"}, "2\r\n{}\r\n0\r\n\r\n"},
		{ok, []string{"Transfer-Encoding: gzip"}, "{}"},
		{"HTTP/1.0 200 OK", nil, "{}"},
		{"HTTP/1.0 200 OK", []string{"Content-Length: 2"}, "{}"},
		{"HTTP/1.1 204 No Content", []string{"Content-Length: 5"}, ""},
		{"HTTP/1.1 304 Not Modified", nil, ""},
		{"HTTP/1.1 401 Unauthorized", []string{"Content-Length: 2"}, "{}"},
		{"HTTP/1.1 503 Service Unavailable", []string{"Content-Length: 2", "Retry-After: 1"}, "{}"},
		{"HTTP/1.1 100 Continue", nil, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"},
		{"HTTP/1.1 999 X", []string{"Content-Length: 2"}, "{}"},
		{"HTTP/1.1 101 Switching Protocols", []string{"Upgrade: h2c", "Connection: Upgrade"}, ""}, // no Connection: close
		{"HTTP/1.1 200 OK", []string{"Connection: close"}, "{}"},
	} {
		seeds = append(seeds, answerOf(tt.status, tt.headers, tt.body))
	}
	return seeds
}

// relayedAnswer is what FuzzRelay's client got: nil if it read nothing.
type relayedAnswer struct {
	status int // 0: the connection closed without a byte
	body   []byte
	// cut is the failure to read the body whole, if it failed: an answer
	// relayed as it comes that its instance broke off.
	cut error
}

// callRelayed sends method target with key to the gateway at addr, on a
// connection of its own, and takes the answer as way says (a client that
// closes at once returns once the instance has answered; one that never
// reads waits until then, then until the call has ended); err is an answer not had within fuzzRelayClientBound, or
// none that HTTP reads.
func callRelayed(addr, key, method, target string, way clientWay, answered, ended func() bool) (*relayedAnswer, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(fuzzRelayClientBound))
	proto, body := "HTTP/1.1", ""
	if way == readWhole10 {
		proto = "HTTP/1.0"
	}
	if method == "POST" {
		body = `{"external_order_id":"o"}`
	}
	_, err = fmt.Fprintf(conn, "%s %s %s\r\nHost: gateway\r\nX-API-Key: %s\r\nIdempotency-Key: k1\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", method, target, proto, key, len(body), body)
	if err != nil {
		return nil, err
	}
	switch way {
	case closeAtOnce:
		// Closed; the call goes on, and is only under way once the
		// instance has answered: checked ended before then, it had not
		// begun, and its slot was taken after the check.
		conn.Close()
		if !within(fuzzRelayClientBound, answered) {
			return nil, fmt.Errorf("the instance was not asked within %s", fuzzRelayClientBound)
		}
		return nil, nil
	case neverRead: // held open unread until the call has ended, then closed
		if !within(fuzzRelayClientBound, answered) || !within(fuzzRelayClientBound, ended) {
			return nil, fmt.Errorf("the call had not ended %s after its answer came", fuzzRelayClientBound)
		}
		return nil, nil
	}
	r := bufio.NewReader(conn)
	if _, err := r.Peek(1); err == io.EOF {
		return &relayedAnswer{}, nil // closed without a byte
	}
	resp, err := http.ReadResponse(r, &http.Request{Method: method})
	if err != nil {
		return nil, fmt.Errorf("reading the answer's head: %w", err)
	}
	defer resp.Body.Close()
	got := &relayedAnswer{status: resp.StatusCode}
	got.body, got.cut = io.ReadAll(resp.Body)
	var ne net.Error
	if errors.As(got.cut, &ne) && ne.Timeout() {
		return nil, fmt.Errorf("the answer %d was still coming after %s", resp.StatusCode, fuzzRelayClientBound)
	}
	return got, nil
}

// checkRelayed fails t unless got is the gateway's envelope or the
// instance's answer, as fasthttp reads its status, or for an answer
// relayed as it comes (streamed, or one cut short that may have been)
// nothing at all.
func checkRelayed(t *testing.T, answer []byte, got *relayedAnswer, streamed bool) {
	t.Helper()
	var env struct {
		Error *struct{ Code, Message string } `json:"error"`
		Meta  struct {
			RequestID string `json:"request_id"`
		} `json:"meta"`
	}
	if got.cut == nil && json.Unmarshal(got.body, &env) == nil && env.Error != nil && env.Error.Code != "" && env.Meta.RequestID != "" {
		if got.status == 500 {
			t.Fatalf("upstream answering %q: the gateway answered 500 %+v", answer, *env.Error)
		}
		return
	}
	head, cutShort, err := answerHead(answer)
	if got.status == 0 && (cutShort || streamed) {
		// Relayed as it comes, broken off before fasthttp had flushed
		// the head it wrote: the client sees the connection closed, as
		// it would have after any part of the body.
		return
	}
	if err != nil || head.StatusCode() != got.status {
		t.Fatalf("upstream answering %q: the client got %d %q (%v), neither an envelope nor the answer (read: %v, status %d)",
			answer, got.status, got.body, got.cut, err, head.StatusCode())
	}
	// The instance's answer as it came, but not with a status outside
	// 200-599: that one is a 502 (callFailure). Compared with the answer
	// alone, a 101 or a 999 relayed passed, and only a status its client
	// could not read (001) failed.
	if got.status < 200 || got.status > 599 {
		t.Fatalf("upstream answering %q: the client got its status %d relayed, want a 502 envelope", answer, got.status)
	}
}

// answerHead is the head of answer as fasthttp's client reads it (past
// interim 1xx answers), and whether answer has fewer bytes after it than
// its Content-Length says.
func answerHead(answer []byte) (head *fasthttp.ResponseHeader, cutShort bool, err error) {
	head = &fasthttp.ResponseHeader{}
	rest := bytes.NewReader(answer)
	r := bufio.NewReader(rest)
	for {
		if err := head.Read(r); err != nil {
			return head, false, err
		}
		if code := head.StatusCode(); code < 100 || code >= 200 || code == 101 {
			break
		}
		head.Reset()
	}
	return head, head.ContentLength() > r.Buffered()+rest.Len(), nil
}

// within reports whether ok holds before d has passed, asking every
// millisecond.
func within(d time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(d); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// slotsHeld is the slots held by o1, relayKeys' owner, on every service,
// and by every address on the shop schema route.
func slotsHeld(g *Gateway) int {
	n := 0
	for _, share := range g.ownerSlots {
		share.slots.mu.Lock()
		n += share.slots.held["o1"]
		share.slots.mu.Unlock()
	}
	g.shopSlots.mu.Lock()
	defer g.shopSlots.mu.Unlock()
	for _, held := range g.shopSlots.held {
		n += held
	}
	return n
}
