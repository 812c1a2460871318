package edge

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/tracestore"
)

func TestShutdownDrainsInFlightRequests(t *testing.T) {
	g, _, logs := startInternal(t, nil, fakeKeys{})
	url := "http://" + g.Addr() + "/v1/export/items?slow=1"
	key := wellFormedKey(t)
	status := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	waitInFlight(t, g, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown() = %v, want nil", err)
	}
	if got := <-status; got != 200 {
		t.Fatalf("in-flight request during shutdown = %d, want 200", got)
	}
	if _, err := http.Get("http://" + g.Addr() + "/v1/health"); err == nil {
		t.Error("a new request after shutdown was served, want connection refused")
	}
	if !logLine(logs.String(), `"msg":"draining"`, `"in_flight":1`) || strings.Contains(logs.String(), "cut off") {
		t.Errorf("logs = %s, want draining with in_flight 1 and nothing cut off", logs.String())
	}
}

// A request the drain cuts off is named in a line of its own: its client
// got a closed connection, no answer and no request id, the gateway writes
// no access line and exports no server span for it, and the WARN said only
// how many were cut off (seen on a make run stack: three calls cut off by a
// 5 s drain, found only through the services' 499 lines). The line gives
// what the client can quote, the time, its address, the method and path.
func TestARequestTheDrainCutsOffIsNamed(t *testing.T) {
	g, sr, logs := startInternal(t, nil, fakeKeys{})
	key := wellFormedKey(t)
	failed := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+g.Addr()+"/v1/export/items?slow=1", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	waitInFlight(t, g, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := g.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown() = nil, want the drain's timeout")
	}
	<-failed // answered or not: here the process goes on, and the handler ends
	var requestID string
	for _, s := range sr.Ended() { // its "rate limit" span ended before the cut
		requestID = s.SpanContext().TraceID().String()
	}
	if !hex32(requestID) {
		t.Fatalf("no span of the request to take its id from (%q)", requestID)
	}
	if !logLine(logs.String(), `"level":"WARN"`, `"msg":"request cut off by the drain"`, `"request_id":"`+requestID+`"`,
		`"method":"GET"`, `"route":"GET /v1/export/items"`, `"path":"/v1/export/items"`, `"client_ip":"127.0.0.1"`, `"duration_ms":`) {
		t.Errorf("no line naming the request cut off (request id %s):\n%s", requestID, logs.String())
	}
}

// A request still in flight when the drain runs out of time, but answered
// while the gateway closes the rest and flushes its spans, is not named
// as cut off: fasthttp leaves its connection open, and its client gets its
// answer. Named when the drain timed out, it was reported cut off, its
// client holding a 200. The one still in flight as the gateway stops is.
func TestARequestAnsweredAfterTheDrainTimedOutIsNotNamedCutOff(t *testing.T) {
	release := map[string]chan struct{}{"late": make(chan struct{}), "hung": make(chan struct{})}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if held, ok := release[path.Base(r.URL.Path)]; ok {
			<-held
		}
		envelope.WriteData(w, 200, "item", envelope.Meta{})
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { close(release["hung"]) }) // before the upstream's Close, which waits for it
	lateAnswered := make(chan *http.Response, 1)
	g, logs := startWithHook(t, map[string]string{"EXPORT_READER_URLS": upstream.URL}, func(g *Gateway) {
		g.keys = fakeKeys{}
		flush := g.shutdownTP
		g.shutdownTP = func(ctx context.Context) error { // the late call is answered during the flush
			close(release["late"])
			<-lateAnswered
			return flush(ctx)
		}
	})
	key := wellFormedKey(t)
	for _, item := range []string{"late", "hung"} {
		go func() {
			req, _ := http.NewRequest("GET", "http://"+g.Addr()+"/v1/export/items/"+item, nil)
			req.Header.Set("X-API-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			if item == "late" {
				if err != nil {
					t.Errorf("the late call: %v, want its answer", err)
				}
				lateAnswered <- resp
			}
		}()
	}
	waitInFlight(t, g, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := g.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown() = nil, want the drain's timeout")
	}
	if logLine(logs.String(), `"msg":"request cut off by the drain"`, `"path":"/v1/export/items/late"`) {
		t.Errorf("the request answered after the drain timed out is named cut off:\n%s", logs.String())
	}
	if !logLine(logs.String(), `"msg":"request cut off by the drain"`, `"path":"/v1/export/items/hung"`) ||
		!logLine(logs.String(), `"msg":"drain timed out: requests cut off"`, `"cut_off":1`) {
		t.Errorf("want the request still in flight at the stop named, and counted alone:\n%s", logs.String())
	}
}

// A drain that runs out of time, its one late request answered while the
// gateway closes the rest and flushes its spans, cut nothing off: its line
// says so, with the requests late at the deadline, not "requests cut off"
// with a cut_off of 0, and Shutdown still returns the drain's timeout (the
// exit status: the drain ran out of its time).
func TestADrainWhoseLateRequestsAllEndedSaysNoneWasCutOff(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		envelope.WriteData(w, 200, "item", envelope.Meta{})
	}))
	t.Cleanup(upstream.Close)
	answered := make(chan error, 1)
	g, logs := startWithHook(t, map[string]string{"EXPORT_READER_URLS": upstream.URL}, func(g *Gateway) {
		g.keys = fakeKeys{}
		flush := g.shutdownTP
		g.shutdownTP = func(ctx context.Context) error { // the late call is answered during the flush
			close(release)
			if err := <-answered; err != nil {
				t.Errorf("the late call: %v, want its answer", err)
			}
			return flush(ctx)
		}
	})
	key := wellFormedKey(t)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+g.Addr()+"/v1/export/items/late", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	waitInFlight(t, g, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := g.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown() = nil, want the drain's timeout")
	}
	if logLine(logs.String(), `"msg":"drain timed out: requests cut off"`) ||
		logLine(logs.String(), `"msg":"request cut off by the drain"`) {
		t.Errorf("a drain whose late request was answered says requests were cut off:\n%s", logs.String())
	}
	if !logLine(logs.String(), `"msg":"drain timed out: the requests still in flight ended as the gateway stopped"`, `"late":1`, `"cut_off":0`) {
		t.Errorf("want the drain's timeout said, with its one late request and none cut off:\n%s", logs.String())
	}
}

// The drain names at most maxCutOffLines requests (a gateway stopped under a
// flood of hung calls writes no more), each path as the access line writes
// one (cut at 128 characters: a path is as long as fasthttp's buffer
// allows), and none once its request has ended.
func TestTheLinesOfRequestsCutOffAreBounded(t *testing.T) {
	var f inFlightRequests
	long := "/v1/export/items/" + strings.Repeat("a", 300)
	tickets := make([]uint64, 0, maxCutOffLines+5)
	for range maxCutOffLines + 5 {
		tickets = append(tickets, f.add(&request{id: strings.Repeat("0", 32), method: "GET",
			route: "GET /v1/export/items/{id}", path: long, clientIP: "127.0.0.1", start: time.Now()}))
	}
	var out strings.Builder
	f.logCutOff(slog.New(slog.NewJSONHandler(&out, nil)), time.Now())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != maxCutOffLines {
		t.Errorf("%d lines for %d requests cut off, want %d", len(lines), len(tickets), maxCutOffLines)
	}
	var line struct{ Path string }
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatal(err)
	}
	if want := httpserver.LoggableClientValue(long); line.Path != want || len(line.Path) >= len(long) {
		t.Errorf("path %q, want it as the access line writes it, %q", line.Path, want)
	}
	for _, n := range tickets {
		f.remove(n)
	}
	out.Reset()
	if f.logCutOff(slog.New(slog.NewJSONHandler(&out, nil)), time.Now()); out.Len() > 0 {
		t.Errorf("requests that ended named as cut off:\n%s", out.String())
	}
}

// The drain's lines are written with no lock of the in-flight set held:
// a log writer that blocks (a full pipe to the log collector) held each
// shard's lock for as long, and every request that ended in the
// meantime, and every one that started, waited on it to remove or add
// its entry.
func TestTheLinesOfRequestsCutOffAreWrittenUnlocked(t *testing.T) {
	var f inFlightRequests
	for range 2 * inFlightShards {
		f.add(&request{id: strings.Repeat("0", 32), method: "GET", route: "GET /v1/export/items",
			path: "/v1/export/items", clientIP: "127.0.0.1", start: time.Now()})
	}
	locked := &lockWatch{f: &f}
	f.logCutOff(slog.New(locked), time.Now())
	if locked.lines != 2*inFlightShards || locked.underLock != 0 {
		t.Errorf("logCutOff wrote %d lines, %d of them with a shard's lock held; want %d, none under a lock",
			locked.lines, locked.underLock, 2*inFlightShards)
	}
}

// lockWatch is a slog.Handler that counts the lines written while a shard
// of f is locked.
type lockWatch struct {
	f                *inFlightRequests
	lines, underLock int
}

func (*lockWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *lockWatch) WithAttrs([]slog.Attr) slog.Handler     { return w }
func (w *lockWatch) WithGroup(string) slog.Handler          { return w }

func (w *lockWatch) Handle(context.Context, slog.Record) error {
	w.lines++
	for i := range w.f.shards {
		mu := &w.f.shards[i].mu
		if !mu.TryLock() {
			w.underLock++
			return nil
		}
		mu.Unlock()
	}
	return nil
}

// A Shutdown right after Start (a stop signal while the gateway started,
// with no GATEWAY_SHUTDOWN_DELAY) closes the public listener too: fasthttp's
// Shutdown closes only the listeners its Serve has taken, and Serve runs in
// a goroutine of its own, which may not have reached that yet. The listener
// then stayed open, served by a Serve no one stops.
func TestShutdownRightAfterStartClosesTheListener(t *testing.T) {
	for run := range 20 { // the race is lost now and then: a few runs show it
		g, _, _ := startInternal(t, nil, fakeKeys{})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := g.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown() = %v, want nil", err)
		}
		cancel()
		// Long enough for a late Serve to have taken the listener.
		time.Sleep(50 * time.Millisecond)
		if conn, err := net.Dial("tcp", g.Addr()); err == nil {
			conn.Close()
			t.Fatalf("run %d: the public address accepts connections after Shutdown", run)
		}
	}
}

// An answer the drain waits for says Connection: close. fasthttp closes
// the connection once it is written; said without the header, the client
// takes the connection for kept alive and sends its next request on it,
// into a connection closing under it: a POST is then lost without an
// answer, and the client cannot tell whether it arrived. Told, it opens a
// new connection, which a stopped gateway refuses, a failure that is safe
// to retry elsewhere.
func TestDrainedAnswerClosesItsConnection(t *testing.T) {
	g, _, _ := startInternal(t, nil, fakeKeys{})
	conn, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "GET /v1/export/items?slow=1 HTTP/1.1\r\nHost: gateway\r\nX-API-Key: " + wellFormedKey(t) + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	waitInFlight(t, g, 1)
	stopped := make(chan error, 1)
	go func() { stopped <- g.Shutdown(context.Background()) }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("in-flight request during the drain: %v, want its answer", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("answer during the drain = %d, Connection %q; want 200 with Connection: close",
			resp.StatusCode, resp.Header.Get("Connection"))
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Shutdown() = %v, want nil", err)
	}
}

// From the stop signal on (Drain, GATEWAY_SHUTDOWN_DELAY), every answer
// says Connection: close, its 200s included, and the connection is
// closed after it: a client that keeps its connections (nginx's to its
// upstreams) lets each go at its next answer instead of holding it idle
// until the drain closes it, maybe as it sends a POST on it, which is
// then lost unanswered (nginx does not send a POST again: its 502). A
// HEAD's answer and that of a method Fiber does not know (answered
// outside Fiber's routing: answerUnknownMethods) say it too.
func TestAnswersWhileDrainingCloseTheirConnection(t *testing.T) {
	g, _, _ := startInternal(t, nil, fakeKeys{})
	key := wellFormedKey(t)
	requests := []struct {
		method string
		status int
	}{{"GET", 200}, {"HEAD", 200}, {"FOO", 405}}
	for _, draining := range []bool{false, true} {
		if draining {
			g.Drain()
		}
		for _, rq := range requests {
			conn, err := net.Dial("tcp", g.Addr())
			if err != nil {
				t.Fatal(err)
			}
			head := rq.method + " /v1/export/items HTTP/1.1\r\nHost: gateway\r\nX-API-Key: " + key + "\r\n\r\n"
			if _, err := io.WriteString(conn, head); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, &http.Request{Method: rq.method})
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			// After Connection: close, the gateway closes its end: the
			// next read sees the end of the stream.
			closed := false
			if draining {
				_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := br.ReadByte()
				closed = err == io.EOF
			}
			conn.Close()
			if resp.StatusCode != rq.status || resp.Close != draining || closed != draining {
				t.Errorf("draining %v: %s = %d, Connection %q, connection closed %v; want %d, Connection: close and closed only while draining",
					draining, rq.method, resp.StatusCode, resp.Header.Get("Connection"), closed, rq.status)
			}
		}
	}
}

// Shutdown closes an idle kept-alive connection at once, also when its
// client neither sends nor closes: the connection's goroutine, blocked
// reading, returns as soon as the connection is closed, although the
// socket lingers (gateway/lingerclose).
func TestShutdownLetsGoOfASilentIdleConnection(t *testing.T) {
	g, _, _ := startInternal(t, nil, fakeKeys{})
	conn, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /v1/health HTTP/1.1\r\nHost: gateway\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	time.Sleep(1100 * time.Millisecond) // fasthttp's idle bookkeeping counts in whole seconds
	start := time.Now()
	if err := g.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown() = %v, want nil", err)
	}
	// Lingering, the drain would hold it for lingerclose.Defaults.IdleTimeout (2 s).
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("Shutdown with a silent idle client took %v, want it let go at once (about 0.1 s)", took)
	}
}

// A drain that runs out of time says how many requests it cut off: their
// clients saw the connection close, and they get no access line.
func TestShutdownSaysWhatItCutOff(t *testing.T) {
	g, _, logs := startInternal(t, nil, fakeKeys{})
	shutDownCuttingOffOne(t, g, wellFormedKey(t))
	if !logLine(logs.String(), `"msg":"drain timed out: requests cut off"`, `"cut_off":1`) {
		t.Errorf("logs = %s, want a drain timed out line with cut_off 1", logs.String())
	}
}

// A drain that runs out of time still leaves the last spans their own
// time to reach the collector: those of the requests around the stop are
// the ones an SRE looks for. The flush shared the drain's deadline, and
// with none of it left, the spans still queued were dropped unsent.
func TestShutdownFlushesSpansAfterADrainThatTimedOut(t *testing.T) {
	store := tracestore.New(nil, 0)
	collector := httptest.NewServer(store)
	defer collector.Close()
	// The exporter and its batcher read the process's environment.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000") // queued until the last flush
	g, _ := startWithHook(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL},
		func(g *Gateway) { g.keys = fakeKeys{} })
	key := wellFormedKey(t)
	served, _ := get(t, "http://"+g.Addr()+"/v1/export/items", map[string]string{"X-API-Key": key})
	requestID := served.Header.Get("X-Request-Id")
	shutDownCuttingOffOne(t, g, key)
	if spans := store.Trace(requestID); len(spans) == 0 {
		t.Errorf("spans of request %q at the collector once Shutdown returned: none, want its trace", requestID)
	}
}

// shutDownCuttingOffOne stops g with one request (sent with key) still
// waiting on the upstream, so that the drain runs out of time.
func shutDownCuttingOffOne(t *testing.T, g *Gateway, key string) {
	t.Helper()
	go func() {
		req, _ := http.NewRequest("GET", "http://"+g.Addr()+"/v1/export/items?slow=1", nil)
		req.Header.Set("X-API-Key", key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitInFlight(t, g, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := g.Shutdown(ctx); err == nil {
		t.Error("Shutdown() = nil with a request still in flight at its deadline, want an error")
	}
}

// waitInFlight waits until g has n requests in its handler, so that a stop
// comes while they are in flight (startWithHook's upstream answers a slow
// one 0.5 s after it arrives). A fixed 200 ms for the client's goroutine
// to get its request there was too short on a loaded machine: the stop
// came first, and the request was refused, or the drain had nothing to
// wait for.
func waitInFlight(t *testing.T, g *Gateway, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); g.inFlight.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight after 10 s, want %d", g.inFlight.Load(), n)
		}
	}
}
