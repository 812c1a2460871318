package edge

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/lingerclose"
	"github.com/coinexport/export/pkg/envelope"
	dto "github.com/prometheus/client_model/go"
)

// openServed opens a connection to g and has one request answered on it,
// kept alive: once it returns, the connection holds its place.
func openServed(t *testing.T, g *Gateway) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	br := bufio.NewReader(c)
	if resp := ask(t, c, br, "GET /v1/nope HTTP/1.1\r\nHost: gw\r\n\r\n"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a connection under the cap was answered %d, want 404", resp.StatusCode)
	}
	return c, br
}

// ask writes request on c and reads its answer whole.
func ask(t *testing.T, c net.Conn, br *bufio.Reader, request string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%q: %v", request, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp
}

// waitOpen waits until g counts n connections open. It looks again soon
// at first (FuzzClientRequest waits so for every input: a close comes
// within microseconds), then every 5 ms.
func waitOpen(t *testing.T, g *Gateway, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for pause := 50 * time.Microsecond; g.connections.Open() != n; pause = min(2*pause, 5*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("connections open = %d, want %d", g.connections.Open(), n)
		}
		time.Sleep(pause)
	}
}

var requestIDForm = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkRefusal checks that resp, body and then c are the refusal of a
// connection past the cap: the envelope, 503 unavailable, Retry-After,
// Connection: close, and the connection closed (an end of stream, not a
// reset).
func checkRefusal(t *testing.T, resp *http.Response, c net.Conn) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	var env struct {
		Error struct{ Code, Message string } `json:"error"`
		Meta  struct {
			RequestID string `json:"request_id"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("refusal body %q is no envelope: %v", body, err)
	}
	// net/http reads Connection: close into Close, and drops the header.
	if !resp.Close {
		t.Error("the refusal does not say Connection: close")
	}
	want := map[string]string{"Retry-After": "1", "X-Error-Code": "unavailable",
		"Content-Type": envelope.ContentType, "Cache-Control": envelope.ErrorCacheControl}
	for h, v := range want {
		if got := resp.Header.Get(h); got != v {
			t.Errorf("refusal's %s = %q, want %q", h, got, v)
		}
	}
	if resp.StatusCode != http.StatusServiceUnavailable || env.Error.Code != "unavailable" || env.Error.Message != errTooManyConnections.Message {
		t.Errorf("refusal = %d %s, want 503 unavailable", resp.StatusCode, body)
	}
	if !requestIDForm.MatchString(env.Meta.RequestID) || resp.Header.Get("X-Request-Id") != env.Meta.RequestID {
		t.Errorf("refusal's request id: meta %q, header %q, want the same 32 hex digits", env.Meta.RequestID, resp.Header.Get("X-Request-Id"))
	}
	if c == nil {
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("after the refusal the connection read %d bytes, %v; want the end of stream", n, err)
	}
}

func TestAConnectionPastTheCapIsAnsweredTheEnvelopeAndClosed(t *testing.T) {
	g, _, logs := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "2", "LOG_LEVEL": "warn"}, fakeKeys{})
	first, firstReader := openServed(t, g)
	second, secondReader := openServed(t, g)

	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkRefusal(t, ask(t, c, bufio.NewReader(c), "GET /v1/nope HTTP/1.1\r\nHost: gw\r\n\r\n"), c)

	// Go's client reads the 503 as any answer (TestARefusalWaitsForTheRequest).
	client := &http.Client{Transport: &http.Transport{}}
	for range 3 {
		resp, err := client.Get("http://" + g.Addr() + "/v1/nope")
		if err != nil {
			t.Fatalf("Go's client past the cap: %v, want the 503", err)
		}
		checkRefusal(t, resp, nil)
		resp.Body.Close()
	}
	var refused dto.Metric
	if err := g.metrics.connectionsRefused.Write(&refused); err != nil {
		t.Fatal(err)
	}
	if got := refused.GetCounter().GetValue(); got != 4 {
		t.Errorf("gateway_connections_refused_total = %v, want 4", got)
	}
	if got := g.connections.Open(); got != 2 {
		t.Errorf("connections open = %d, want the 2 served", got)
	}
	// A flood is a line every refusedLogInterval, not a line each.
	if n := strings.Count(logs.String(), "connection refused: GATEWAY_MAX_CONNECTIONS"); n != 1 {
		t.Errorf("%d WARN lines for 4 refusals within %s, want 1: %s", n, refusedLogInterval, logs.String())
	}
	if !strings.Contains(logs.String(), `"peer_ip":"127.0.0.1"`) {
		t.Errorf("the WARN of a refusal does not name its peer's address: %s", logs.String())
	}
	// The connections open were not disturbed.
	for _, open := range []struct {
		c  net.Conn
		br *bufio.Reader
	}{{first, firstReader}, {second, secondReader}} {
		if resp := ask(t, open.c, open.br, "GET /v1/nope HTTP/1.1\r\nHost: gw\r\n\r\n"); resp.StatusCode != http.StatusNotFound {
			t.Errorf("a connection open before the refusals was answered %d, want 404", resp.StatusCode)
		}
	}
}

// GATEWAY_MAX_CONNECTIONS=0 is no cap: connections are served and
// counted, and there is no bound series for the alert to read.
func TestNoCapAtZero(t *testing.T) {
	g, _, _ := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "0"}, fakeKeys{})
	for range 3 {
		openServed(t, g) // fails if refused
	}
	waitOpen(t, g, 3)
	families, err := g.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, family := range families {
		if family.GetName() == "gateway_connections_max" {
			t.Errorf("gateway_connections_max is exported with GATEWAY_MAX_CONNECTIONS=0: %v", family.GetMetric())
		}
	}
}

// A refused connection is answered once its client has sent something,
// or once refusalWait has passed: an answer before the request can reach a
// client as one it never asked for (Go's Transport reads a new connection
// before it has written on it, and closes it then, "Unsolicited response",
// failing the request: refusalWait).
func TestARefusalWaitsForTheRequest(t *testing.T) {
	g, _, _ := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "1"}, fakeKeys{})
	openServed(t, g)
	for _, sends := range []bool{true, false} {
		c := dialStillWaiting(t, g)
		br := bufio.NewReader(c)
		if !sends { // answered once refusalWait is over
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("a refused connection that sent nothing: %v, want the 503", err)
			}
			checkRefusal(t, resp, c)
			continue
		}
		checkRefusal(t, ask(t, c, br, "GET /v1/nope HTTP/1.1\r\nHost: gw\r\n\r\n"), c)
	}
}

// A refusal that waited gives its waiting place back: past
// maxRefusalsWaiting refusals, one after the other, the next still waits
// for its request instead of being answered at once.
func TestRefusalsWaitAgainOnceEarlierOnesEnded(t *testing.T) {
	g, _, _ := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "1", "LOG_LEVEL": "error"}, fakeKeys{})
	openServed(t, g)
	for range maxRefusalsWaiting + 10 {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		checkRefusal(t, ask(t, c, bufio.NewReader(c), "GET /v1/nope HTTP/1.1\r\nHost: gw\r\n\r\n"), c)
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for g.refusals.waiting() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	dialStillWaiting(t, g)
}

// dialStillWaiting opens a connection to g, which refuses it, and checks
// that the refusal waits for the request: nothing comes for refusalWait/4.
func dialStillWaiting(t *testing.T, g *Gateway) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(refusalWait / 4))
	if n, err := c.Read(make([]byte, 1)); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a refused connection read %d bytes, %v before it sent anything; want nothing yet", n, err)
	}
	return c
}

// Refusals waiting for their request are bounded: with
// maxRefusalsWaiting waiting, the next refused connection is answered at
// once, without a goroutine of its own.
func TestPastTheWaitingBoundARefusalIsAnsweredAtOnce(t *testing.T) {
	g, _, _ := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "1", "LOG_LEVEL": "error"}, fakeKeys{})
	openServed(t, g)
	for range maxRefusalsWaiting { // silent: each waits refusalWait
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(refusalWait / 2))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("with %d refusals waiting, the next one: %v; want the 503 at once", maxRefusalsWaiting, err)
	}
	checkRefusal(t, resp, nil)
}

// However the gateway or its client ends a connection, its place is free
// again for the next one.
func TestAClosedConnectionFreesItsPlace(t *testing.T) {
	endings := []struct {
		name string
		env  map[string]string
		end  func(t *testing.T, g *Gateway, c net.Conn, br *bufio.Reader)
	}{
		{"the client closes it", nil, func(t *testing.T, _ *Gateway, c net.Conn, _ *bufio.Reader) { c.Close() }},
		{"GATEWAY_IDLE_TIMEOUT", map[string]string{"GATEWAY_IDLE_TIMEOUT": "200ms"}, func(t *testing.T, _ *Gateway, c net.Conn, _ *bufio.Reader) {
			readEnd(t, c)
		}},
		{"a 408", map[string]string{"GATEWAY_READ_TIMEOUT": "200ms"}, func(t *testing.T, _ *Gateway, c net.Conn, br *bufio.Reader) {
			if resp := ask(t, c, br, "GET /v1/nope HTTP/1.1\r\n"); resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("a request left unfinished = %d, want 408", resp.StatusCode)
			}
			readEnd(t, c)
		}},
		{"an answer with Connection: close", nil, func(t *testing.T, _ *Gateway, c net.Conn, br *bufio.Reader) {
			ask(t, c, br, "GET /v1/nope HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
			readEnd(t, c)
		}},
		{"the drain's answer", nil, func(t *testing.T, g *Gateway, c net.Conn, br *bufio.Reader) {
			g.Drain()
			ask(t, c, br, "GET /v1/nope HTTP/1.1\r\nHost: gw\r\n\r\n")
			readEnd(t, c)
		}},
	}
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			env := map[string]string{"GATEWAY_MAX_CONNECTIONS": "1"}
			for k, v := range e.env {
				env[k] = v
			}
			g, _, _ := startInternal(t, env, fakeKeys{})
			c, br := openServed(t, g)
			e.end(t, g, c, br)
			waitOpen(t, g, 0)
			next, _ := openServed(t, g) // fails if refused
			next.Close()
			waitOpen(t, g, 0)
		})
	}
}

// The drain at shutdown closes the idle connections, and with them their
// places.
func TestTheShutdownFreesTheIdleConnectionsPlaces(t *testing.T) {
	g, _, _ := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "3"}, fakeKeys{})
	for range 3 {
		openServed(t, g)
	}
	waitOpen(t, g, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitOpen(t, g, 0)
}

// readEnd reads c until the gateway closes it.
func readEnd(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("waiting for the gateway to close the connection: %v", err)
	}
}

// A flood of refusals is answered on the accepting goroutine
// (maxRefusalsWaiting): each answer should make little garbage.
func BenchmarkRefusalAnswer(b *testing.B) {
	requestID := strings.Repeat("0123456789abcdef", 2)
	b.ReportAllocs()
	for b.Loop() {
		_ = writeRefusal(io.Discard, requestID)
	}
}

// A kept-alive connection whose request had a body near BodyLimit holds
// no more memory, once answered, than one that had none: fasthttp keeps
// each connection's request body buffer until its next request, and
// GATEWAY_MAX_CONNECTIONS is sized on ~21 KB a connection, not 21 KB and
// a 64 KiB body.
func TestAnIdleConnectionHoldsNoRequestBody(t *testing.T) {
	const conns = 300
	g, _, _ := startInternal(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "1000", "LOG_LEVEL": "error"}, fakeKeys{})
	body := strings.Repeat("x", BodyLimit-1024)
	request := "POST /v1/nope HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	before := heapInUse()
	for range conns {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if resp := ask(t, c, bufio.NewReaderSize(c, 512), request); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("a request with a body = %d, want 404", resp.StatusCode)
		}
	}
	waitOpen(t, g, conns)
	perConnection := (int64(heapInUse()) - int64(before)) / conns
	// ~21 KB held by a connection; its body would add 63 KiB.
	if perConnection > 40<<10 {
		t.Errorf("each idle connection holds %d KB of heap once its request with a %d KB body was answered, want under 40 KB",
			perConnection>>10, len(body)>>10)
	}
}

// heapInUse is the heap's live bytes after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// A flood of refusals cannot take the lingering an ordinary close needs:
// refused clients that read their 503 and keep their end open each hold
// a lingering connection (lingerclose), and when those were the ones an
// ordinary close counts on, a 413 of a body still arriving was closed at
// once, and its client read a reset instead of the envelope.
func TestRefusalsLeaveOrdinaryClosesTheirLingering(t *testing.T) {
	const lingering = 4
	g, _ := startWithHook(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "1", "LOG_LEVEL": "error"}, func(g *Gateway) {
		g.keys = fakeKeys{}
		g.linger.MaxConns = lingering
		g.linger.IdleTimeout = time.Minute // a refused client silent after its answer holds its place
	})
	served, servedReader := openServed(t, g)
	for range 2 * lingering {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		checkRefusal(t, ask(t, c, bufio.NewReader(c), "GET /v1/nope HTTP/1.1\r\nHost: gw\r\n\r\n"), nil)
	}
	waitRefusalsEnded(t, g)
	const size = 12 << 20 // on loopback a few MB unsent make the reset certain
	tooLarge := "POST /v1/nope HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(size) + "\r\n\r\n" + strings.Repeat(" ", size)
	_ = served.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(served, tooLarge); err != nil {
		t.Fatalf("sending a body over the limit after %d refusals: %v; want it taken in, then the 413", 2*lingering, err)
	}
	resp, err := http.ReadResponse(servedReader, nil)
	if err != nil {
		t.Fatalf("after %d refusals, the 413 of a body still arriving: %v; want the envelope", 2*lingering, err)
	}
	if body, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), `"payload_too_large"`) {
		t.Errorf("after %d refusals, a body over the limit = %d %s, want 413 payload_too_large", 2*lingering, resp.StatusCode, body)
	}
}

// waitRefusalsEnded waits until every refusal g started was answered and
// closed.
func waitRefusalsEnded(t *testing.T, g *Gateway) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); g.refusals.waiting() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals still waiting after 10 s, want none", g.refusals.waiting())
		}
	}
}

// The shutdown answers the refused connections still waiting for their
// request, and closes them, before it returns: left waiting, they were
// answered after it, or in the binary closed unanswered by the process's
// exit, their clients reading an end of stream without a word.
func TestTheShutdownAnswersTheRefusalsStillWaiting(t *testing.T) {
	g, _ := startWithHook(t, map[string]string{"GATEWAY_MAX_CONNECTIONS": "1", "LOG_LEVEL": "error"}, func(g *Gateway) {
		g.keys = fakeKeys{}
		g.refusalWait = time.Minute // still waiting when the shutdown comes
	})
	openServed(t, g)
	waiting := dialStillWaiting(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := g.refusals.waiting(); n != 0 {
		t.Errorf("%d refusals still waiting once Shutdown returned, want none", n)
	}
	_ = waiting.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(waiting), nil)
	if err != nil {
		t.Fatalf("a refused connection waiting at the shutdown: %v; want the 503", err)
	}
	checkRefusal(t, resp, waiting)
}

// The closes lingering show on the metrics, with their budget's bound,
// and a close the budget has no place for is counted: the one harm of a
// full budget (a client still sending reads a reset instead of its
// answer), which nothing showed. Of two clients that keep their end open
// after a Connection: close answer, the first lingers on a budget of one
// and the second is turned away.
func TestLingeringClosesShowOnMetrics(t *testing.T) {
	g, _ := startWithHook(t, nil, func(g *Gateway) {
		g.linger = lingerclose.Options{IdleTimeout: time.Minute, MaxTime: time.Minute, MaxBytes: 1 << 20, MaxConns: 1}
	})
	for range 2 {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ask(t, c, bufio.NewReader(c), "GET /v1/nope HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
	}
	want := map[string]float64{
		`gateway_connections_lingering{budget="closes"}`: 1, `gateway_connections_lingering_max{budget="closes"}`: 1,
		`gateway_connections_linger_refused_total{budget="closes"}`:   1,
		`gateway_connections_lingering{budget="refusals"}`:            0,
		`gateway_connections_lingering_max{budget="refusals"}`:        maxRefusalsLingering,
		`gateway_connections_linger_refused_total{budget="refusals"}`: 0,
	}
	// The second close comes once its answer is written: wait for it.
	var got map[string]float64
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got = lingeringSeries(t, g); maps.Equal(got, want) || time.Now().After(end) {
			break
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("lingering series = %v, want %v", got, want)
	}
}

// lingeringSeries are g's series of lingering closes, by name{budget}.
func lingeringSeries(t *testing.T, g *Gateway) map[string]float64 {
	t.Helper()
	families, err := g.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	for _, family := range families {
		if !strings.HasPrefix(family.GetName(), "gateway_connections_linger") {
			continue
		}
		for _, m := range family.GetMetric() {
			name := fmt.Sprintf("%s{budget=%q}", family.GetName(), m.GetLabel()[0].GetValue())
			series[name] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return series
}
