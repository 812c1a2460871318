package edge

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/ratelimit"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/racedetector"
	"github.com/coinexport/export/pkg/saleclaim"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/pkg/tracestore"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const testSecret = "internal-test-identity-secret-0123456789"

// fakeKeys grants every well-formed key a read key of owner o1.
type fakeKeys struct{}

func (fakeKeys) Lookup(context.Context, string, func() bool) (keystore.Key, error) {
	return keystore.Key{ID: "k1", OwnerID: "o1", Scopes: []string{identity.ScopeExportRead}}, nil
}

// panicKeys panics on every lookup, to exercise recovery.
type panicKeys struct{}

func (panicKeys) Lookup(context.Context, string, func() bool) (keystore.Key, error) { panic("boom") }

// The fakes know no key without a lookup.
func (fakeKeys) Known(string) (keystore.Key, bool)     { return keystore.Key{}, false }
func (panicKeys) Known(string) (keystore.Key, bool)    { return keystore.Key{}, false }
func (refusingKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

// startInternal starts a gateway whose key lookup is keys and whose spans
// go to the returned recorder.
func startInternal(t *testing.T, env map[string]string, keys keyLookup) (*Gateway, *tracetest.SpanRecorder, *testenv.Output) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	g, logs := startWithHook(t, env, func(g *Gateway) {
		g.keys = keys
		g.tracer = tp.Tracer("test")
	})
	return g, sr, logs
}

// startWithHook starts a gateway in front of a test upstream (which takes
// 0.5 s to answer a query with slow set), with env over the test's
// settings and hook applied before it serves.
func startWithHook(t *testing.T, env map[string]string, hook func(*Gateway)) (*Gateway, *testenv.Output) {
	t.Helper()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			time.Sleep(500 * time.Millisecond)
		}
		envelope.WriteData(w, 200, r.Header.Get("Traceparent"), envelope.Meta{})
	}))
	t.Cleanup(upstream.Close)
	vars := map[string]string{
		"GATEWAY_ADDR": "127.0.0.1:0", "GATEWAY_ADMIN_ADDR": "127.0.0.1:0", "IDENTITY_SECRET": testSecret,
		"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"RATE_LIMIT_KEY_PREFIX": testenv.KeyPrefix(t), "EXPORT_READER_URLS": upstream.URL,
		// Not the defaults, 127.0.0.1:8082 and :8083: a make run's, if one
		// runs on the machine, would be probed and sent to.
		"SALES_WRITER_URLS": "http://" + testenv.RefusingAddr(t), "SHOP_SCHEMA_URLS": "http://" + testenv.RefusingAddr(t),
	}
	for k, v := range env {
		vars[k] = v
	}
	getenv := func(k string) string { return vars[k] }
	cfg, err := LoadConfig(getenv)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Output{}
	g, err := start(context.Background(), cfg, logging.New(logs, cfg.LogLevel, "gateway"), getenv, hook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	return g, logs
}

// get sends GET url with its path and query exactly as written (so also
// what url.Parse refuses, such as a broken %-escape).
func get(t *testing.T, url string, headers map[string]string) (*http.Response, envelope.Parsed) {
	t.Helper()
	host, target, _ := strings.Cut(strings.TrimPrefix(url, "http://"), "/")
	req, err := http.NewRequest("GET", "http://"+host+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = "/" + target
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatalf("GET %s: body is not an envelope: %v", url, err)
	}
	return resp, env
}

func TestPanicIsA500Envelope(t *testing.T) {
	g, _, logs := startInternal(t, nil, panicKeys{})
	resp, env := get(t, "http://"+g.Addr()+"/v1/export/items", map[string]string{"X-API-Key": wellFormedKey(t)})
	if resp.StatusCode != 500 || env.Error == nil || env.Error.Code != "internal_error" {
		t.Fatalf("GET with a panicking lookup = %d %+v, want 500 internal_error", resp.StatusCode, env.Error)
	}
	if !hex32(env.Meta.RequestID) || env.Meta.RequestID != resp.Header.Get("X-Request-Id") {
		t.Errorf("meta.request_id = %q, X-Request-Id = %q, want equal, 32 hex", env.Meta.RequestID, resp.Header.Get("X-Request-Id"))
	}
	if n := strings.Count(logs.String(), `"msg":"panic while serving"`); n != 1 {
		t.Errorf("panic logged %d times, want once", n)
	}
	if !strings.Contains(logs.String(), "goroutine") {
		t.Error("the panic's log line lacks the stack")
	}
	// The gateway keeps serving.
	if resp, _ := get(t, "http://"+g.Addr()+"/v1/health", nil); resp.StatusCode != 200 {
		t.Errorf("GET /v1/health after a panic = %d, want 200", resp.StatusCode)
	}
}

// saleKeys grants every well-formed key a sales key of owner o1 and
// platform market-a.
type saleKeys struct{}

func (saleKeys) Lookup(context.Context, string, func() bool) (keystore.Key, error) {
	return keystore.Key{ID: "k2", OwnerID: "o1", PlatformID: "market-a", Scopes: []string{identity.ScopeSalesWrite}}, nil
}
func (saleKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

// panicAfterSending is a tracer whose proxy spans panic once the gateway
// records the instance that answered: after the request went upstream.
type panicAfterSending struct{ trace.Tracer }

func (p panicAfterSending) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, span := p.Tracer.Start(ctx, name, opts...)
	if strings.HasPrefix(name, "proxy ") {
		return ctx, panickingSpan{span}
	}
	return ctx, span
}

type panickingSpan struct{ trace.Span }

func (panickingSpan) SetAttributes(...attribute.KeyValue) { panic("boom after sending") }

// panicOnFailure is a tracer whose proxy spans panic when the gateway
// marks them failed: after upstream.Do has returned its error.
type panicOnFailure struct{ trace.Tracer }

func (p panicOnFailure) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, span := p.Tracer.Start(ctx, name, opts...)
	if strings.HasPrefix(name, "proxy ") {
		return ctx, failurePanickingSpan{span}
	}
	return ctx, span
}

type failurePanickingSpan struct{ trace.Span }

func (failurePanickingSpan) SetStatus(codes.Code, string) { panic("boom after every attempt failed") }

// A panic of the gateway's own on a sale route says what is known of the
// sale: before the request went upstream (here in the key's lookup), or
// once upstream.Do said that none of its attempts left (every writer
// refused the connection), nothing was applied; once it went (here as its
// answer came back), the sale may have been, and a retry with the same
// Idempotency-Key settles it. Both said only "internal error", which tells
// a platform neither to keep the key nor that it need not reconcile.
func TestSalePanicSaysWhetherTheSaleWasSent(t *testing.T) {
	var hits atomic.Int64
	writer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost { // not the health probes
			hits.Add(1)
		}
		envelope.WriteData(w, 200, map[string]string{"status": "inactive"}, envelope.Meta{})
	}))
	t.Cleanup(writer.Close)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	refusing := "http://" + testenv.RefusingAddr(t)
	for _, tt := range []struct {
		name     string
		writers  string // SALES_WRITER_URLS
		hook     func(*Gateway)
		wantHits int64
		want     string
		applied  string // the access line's sale_applied
	}{
		{"panic before sending", writer.URL, func(g *Gateway) { g.keys = panicKeys{} }, 0,
			"internal error; nothing was applied: retry with backoff and the same Idempotency-Key, and quote meta.request_id if it persists", "no"},
		{"panic once every writer refused", refusing, func(g *Gateway) { g.keys, g.tracer = saleKeys{}, panicOnFailure{tp.Tracer("test")} }, 0,
			"internal error; nothing was applied: retry with backoff and the same Idempotency-Key, and quote meta.request_id if it persists", "no"},
		{"panic after sending", writer.URL, func(g *Gateway) { g.keys, g.tracer = saleKeys{}, panicAfterSending{tp.Tracer("test")} }, 1,
			"internal error; the sale may have been applied: retry with backoff and the same Idempotency-Key, and quote meta.request_id if it persists", "maybe"},
	} {
		hits.Store(0)
		g, logs := startWithHook(t, map[string]string{"SALES_WRITER_URLS": tt.writers}, tt.hook)
		resp, answer, err := postConfirm(t, g.Addr())
		if err != nil || resp.StatusCode != 500 || answer.Error == nil || answer.Error.Code != "internal_error" || answer.Error.Message != tt.want {
			t.Errorf("%s: confirm = %d %+v (%v), want 500 internal_error %q", tt.name, resp.StatusCode, answer.Error, err, tt.want)
		}
		if !strings.Contains(logs.String(), `"sale_applied":"`+tt.applied+`"`) {
			t.Errorf("%s: the access line does not record sale_applied %s:\n%s", tt.name, tt.applied, logs.String())
		}
		if hits.Load() != tt.wantHits || !strings.Contains(logs.String(), `"msg":"panic while serving"`) {
			t.Errorf("%s: the writer got %d sales, want %d; the panic logged: %v", tt.name, hits.Load(), tt.wantHits,
				strings.Contains(logs.String(), `"msg":"panic while serving"`))
		}
	}
}

func hex32(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

func wellFormedKey(t *testing.T) string {
	t.Helper()
	secret, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

func TestEachRequestIsOneNewTrace(t *testing.T) {
	clientTrace := "0af7651916cd43dd8448eb211c80319c"
	traceparent := "00-" + clientTrace + "-b7ad6b7169203331-01"
	for _, trust := range []bool{false, true} {
		name := map[bool]string{false: "untrusted traceparent", true: "trusted traceparent"}[trust]
		t.Run(name, func(t *testing.T) {
			g, sr, _ := startInternal(t, map[string]string{"GATEWAY_TRUST_TRACEPARENT": strconv.FormatBool(trust)}, fakeKeys{})
			resp, env := get(t, "http://"+g.Addr()+"/v1/export/items", map[string]string{
				"X-API-Key": wellFormedKey(t), "traceparent": traceparent})
			if resp.StatusCode != 200 {
				t.Fatalf("GET = %d %+v, want 200", resp.StatusCode, env.Error)
			}
			requestID := resp.Header.Get("X-Request-Id")
			if (requestID == clientTrace) != trust {
				t.Errorf("request id = %s with the client's trace %s and trust=%v", requestID, clientTrace, trust)
			}
			var upstreamTP string
			_ = json.Unmarshal(env.Data, &upstreamTP)
			if !strings.Contains(upstreamTP, requestID) {
				t.Errorf("upstream traceparent = %q, want trace %s", upstreamTP, requestID)
			}
			spans := map[string]sdktrace.ReadOnlySpan{}
			for _, s := range sr.Ended() {
				if s.SpanContext().TraceID().String() != requestID {
					t.Errorf("span %q has trace %s, want %s", s.Name(), s.SpanContext().TraceID(), requestID)
				}
				spans[s.Name()] = s
			}
			server, ok := spans["GET /v1/export/items"]
			if !ok {
				t.Fatalf("no server span among %v", keysOf(spans))
			}
			if server.SpanKind() != trace.SpanKindServer || server.Parent().IsValid() != trust {
				t.Errorf("server span kind %v, parent valid %v; want server, parent valid = %v", server.SpanKind(), server.Parent().IsValid(), trust)
			}
			attrs := map[string]string{}
			for _, a := range server.Attributes() {
				attrs[string(a.Key)] = a.Value.String()
			}
			for k, v := range map[string]string{"request.id": requestID, "owner.id": "o1", "api_key.id": "k1", "http.response.status_code": "200"} {
				if attrs[k] != v {
					t.Errorf("server span %s = %q, want %q", k, attrs[k], v)
				}
			}
			// The key's first request fetches a rate-limit lease from Redis,
			// so it has a rate-limit span; an in-memory key lookup has none.
			if _, ok := spans["authenticate"]; ok {
				t.Error(`an "authenticate" span for a key found in memory`)
			}
			for _, child := range []string{"rate limit", "proxy export-reader"} {
				s, ok := spans[child]
				if !ok || s.Parent().SpanID() != server.SpanContext().SpanID() {
					t.Errorf("span %q missing or not a child of the server span", child)
				}
			}
			if class := attrOf(spans["rate limit"], "app.rate_limit.class"); class != classExportRead {
				t.Errorf("rate limit span: app.rate_limit.class = %q, want %s (the budget it waited on)", class, classExportRead)
			}
			// It links to the Redis round trip it waited on, a child of
			// the server span of the first traced request in its batch:
			// this one's, alone in it.
			batch, ok := spans["rate limit batch"]
			if links := spans["rate limit"].Links(); !ok || len(links) != 1 || !links[0].SpanContext.Equal(batch.SpanContext()) {
				t.Errorf(`rate limit span's links = %v, want the "rate limit batch" span (found: %v)`, links, ok)
			} else if batch.Parent().SpanID() != server.SpanContext().SpanID() {
				t.Errorf("batch span's parent = %v, want the server span", batch.Parent().SpanID())
			}
			if spans["proxy export-reader"].SpanKind() != trace.SpanKindClient {
				t.Errorf("proxy span kind = %v, want client", spans["proxy export-reader"].SpanKind())
			}
		})
	}
}

// Health checks record no span (issue 7: "health checks not sampled"):
// /v1/health is what Kubernetes' readiness probe and a load balancer poll,
// every few seconds for each gateway, and each probe was a trace of its
// own (a make run stack's traces.jsonl held its own checks' GET /v1/health
// spans). The answer still has a request id, and its access line the ids
// to grep; other routes still record. Under always_on, which samples a
// child whatever its parent, so that no "rate limit" span of the check's
// first lease fetch from Redis is recorded either.
func TestHealthChecksRecordNoSpan(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	g, logs := startWithHook(t, nil, func(g *Gateway) {
		g.keys = fakeKeys{}
		g.tracer = tp.Tracer("test")
	})
	base := "http://" + g.Addr()
	ids := map[string]bool{}
	for _, method := range []string{"GET", "HEAD", "GET"} {
		req, _ := http.NewRequest(method, base+"/v1/health", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if resp.StatusCode != 200 || len(id) != 32 || ids[id] {
			t.Fatalf("%s /v1/health = %d, X-Request-Id %q; want 200 and a new 32-hex id", method, resp.StatusCode, id)
		}
		ids[id] = true
		if !logLine(logs.String(), `"route":"`+method+` /v1/health"`, `"request_id":"`+id+`"`, `"trace_id":"`+id+`"`, `"span_id":"`) {
			t.Errorf("no access line of %s /v1/health with request_id, trace_id %s and a span_id:\n%s", method, id, logs.String())
		}
	}
	if spans := sr.Ended(); len(spans) != 0 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name()+" (trace "+s.SpanContext().TraceID().String()+")")
		}
		t.Errorf("health checks recorded %d spans, want none: %v", len(spans), names)
	}
	resp, env := get(t, base+"/v1/export/items", map[string]string{"X-API-Key": wellFormedKey(t)})
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/export/items = %d %+v, want 200", resp.StatusCode, env.Error)
	}
	if !slices.ContainsFunc(sr.Ended(), func(s sdktrace.ReadOnlySpan) bool {
		return s.Name() == "GET /v1/export/items" && s.SpanContext().TraceID().String() == resp.Header.Get("X-Request-Id")
	}) {
		t.Errorf("GET /v1/export/items recorded no server span in trace %s", resp.Header.Get("X-Request-Id"))
	}
}

// attrOf is the value of a span's attribute key ("" when s is nil or has
// none).
func attrOf(s sdktrace.ReadOnlySpan, key string) string {
	if s == nil {
		return ""
	}
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

func keysOf(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

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

func TestLoadConfig(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://db/x", "IDENTITY_SECRET": testSecret}
	getenv := func(extra map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		}
	}
	cfg, err := LoadConfig(getenv(nil))
	if err != nil {
		t.Fatalf("LoadConfig(minimal) error = %v", err)
	}
	if cfg.Addr != "127.0.0.1:8080" || cfg.MaxHeaderBytes != 8192 || cfg.UpstreamMaxConns != 512 ||
		!cfg.RateLimitEnabled || cfg.RateExportRead.Limit != 6000 || len(cfg.ExportReaderURLs) != 1 {
		t.Errorf("LoadConfig(minimal) = %+v, want the documented defaults", cfg)
	}
	if cfg.UpstreamResolveInterval != 0 {
		t.Errorf("UpstreamResolveInterval = %v by default, want 0 (each URL one instance)", cfg.UpstreamResolveInterval)
	}
	if cfg, err := LoadConfig(getenv(map[string]string{"UPSTREAM_RESOLVE_INTERVAL": "5s"})); err != nil || cfg.UpstreamResolveInterval != 5*time.Second {
		t.Errorf("LoadConfig(UPSTREAM_RESOLVE_INTERVAL=5s) = %v, %v; want 5s", cfg.UpstreamResolveInterval, err)
	}
	for name, value := range map[string]string{
		"DATABASE_URL": "", "IDENTITY_SECRET": "short", "GATEWAY_MAX_HEADER_BYTES": "100",
		"UPSTREAM_MAX_CONNS": "0", "KEY_CACHE_TTL": "-1s", "RATE_LIMIT_ENABLED": "perhaps",
		"RATE_LIMIT_EXPORT_READ": "0-M", "RATE_LIMIT_SALES_WRITE": "lots",
		"UPSTREAM_RESOLVE_INTERVAL": "50ms", "LOG_LEVEL": "verbose",
		// Values that would take every instance out, hold every request
		// behind a stalled database or Redis, or do nothing.
		"UPSTREAM_PROBE_INTERVAL": "10ms", "KEY_LOOKUP_TIMEOUT": "1h", "RATE_LIMIT_REDIS_TIMEOUT": "10s", "KEY_CACHE_UNHEARD_TTL": "1m",
		"EXPORT_READER_URLS": "http://user:s3cretpw@127.0.0.1:8081", "SALES_WRITER_URLS": "127.0.0.1:8082",
		"SHOP_SCHEMA_URLS": "http://127.0.0.1:8083/x?y=1", "GOGC": "abc", "GOMEMLIMIT": "0",
		// A proxy header believed from anyone: refused, as is a host name.
		"GATEWAY_PROXY_HEADER": "X-Forwarded-For", "GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8,proxy.local",
	} {
		_, err := LoadConfig(getenv(map[string]string{name: value}))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("LoadConfig(%s=%q) error = %v, want one naming %s", name, value, err, name)
		} else if strings.Contains(err.Error(), "s3cretpw") {
			t.Errorf("LoadConfig(%s=%q) error = %v quotes the password", name, value, err)
		}
	}
	// A header name no request can carry is refused, not left unread.
	for _, header := range []string{"X Forwarded For", "X-Forwarded-For:", "X-Real-IP,X-Forwarded-For"} {
		_, err := LoadConfig(getenv(map[string]string{"GATEWAY_PROXY_HEADER": header, "GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8"}))
		if err == nil || !strings.Contains(err.Error(), "GATEWAY_PROXY_HEADER must be a header name") {
			t.Errorf("LoadConfig(GATEWAY_PROXY_HEADER=%q) error = %v, want it refused", header, err)
		}
	}
	// RFC 7239's Forwarded holds for=… pairs: never read as an address, it
	// made every client the proxy.
	for _, header := range []string{"Forwarded", "forwarded"} {
		_, err := LoadConfig(getenv(map[string]string{"GATEWAY_PROXY_HEADER": header, "GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8"}))
		if err == nil || !strings.Contains(err.Error(), "GATEWAY_PROXY_HEADER=Forwarded is not read") {
			t.Errorf("LoadConfig(GATEWAY_PROXY_HEADER=%q) error = %v, want it refused", header, err)
		}
	}
	// The headers proxies set beside X-Forwarded-For hold no address:
	// named for it, each made every client the proxy.
	for _, header := range []string{"X-Forwarded-Proto", "x-forwarded-host", "X-FORWARDED-PORT", "Host", "Via"} {
		_, err := LoadConfig(getenv(map[string]string{"GATEWAY_PROXY_HEADER": header, "GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8"}))
		if err == nil || !strings.Contains(err.Error(), "GATEWAY_PROXY_HEADER="+header+" holds no address") {
			t.Errorf("LoadConfig(GATEWAY_PROXY_HEADER=%q) error = %v, want it refused", header, err)
		}
	}
	for _, header := range []string{"X-Forwarded-For", "X-Real-IP", "True-Client-IP", "CF-Connecting-IP"} {
		if _, err := LoadConfig(getenv(map[string]string{"GATEWAY_PROXY_HEADER": header, "GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8"})); err != nil {
			t.Errorf("LoadConfig(GATEWAY_PROXY_HEADER=%q) = %v, want it read", header, err)
		}
	}
	// Trusting every address believes the client's own entry of the header.
	for _, everyone := range []string{"0.0.0.0/0", "10.0.0.0/8, ::/0", "::ffff:0.0.0.0/96"} {
		_, err := LoadConfig(getenv(map[string]string{"GATEWAY_PROXY_HEADER": "X-Forwarded-For", "GATEWAY_TRUSTED_PROXIES": everyone}))
		if err == nil || !strings.Contains(err.Error(), "GATEWAY_TRUSTED_PROXIES must list the proxies, not every address") {
			t.Errorf("LoadConfig(GATEWAY_TRUSTED_PROXIES=%s) error = %v, want it refused", everyone, err)
		}
	}
	if _, err := LoadConfig(getenv(map[string]string{"EXPORT_READER_URLS": " , "})); err == nil {
		t.Error("LoadConfig(EXPORT_READER_URLS without a URL) = nil error")
	}
	for _, twice := range []string{"http://127.0.0.1:18281,http://127.0.0.1:18281", "http://Reader:80,http://reader/", "http://[::1]:18281,http://[0:0::1]:18281"} {
		_, err := LoadConfig(getenv(map[string]string{"EXPORT_READER_URLS": twice}))
		if err == nil || !strings.Contains(err.Error(), "EXPORT_READER_URLS lists") || !strings.Contains(err.Error(), "twice") {
			t.Errorf("LoadConfig(EXPORT_READER_URLS=%s) error = %v, want one naming the address listed twice", twice, err)
		}
	}
	if _, err := LoadConfig(getenv(map[string]string{"EXPORT_READER_URLS": "http://127.0.0.1:1,http://127.0.0.1:2,https://127.0.0.1:1"})); err != nil {
		t.Errorf("LoadConfig(three instances) = %v, want nil", err)
	}
	// The start-up log shows durations as durations, and no secret.
	cfg, _ = LoadConfig(getenv(map[string]string{"DATABASE_URL": "postgres://u:dbpw@db/x"}))
	logged := cfg.LogValue().String()
	if !strings.Contains(logged, "upstream_read_timeout=30s") || strings.Contains(logged, "dbpw") || strings.Contains(logged, testSecret) {
		t.Errorf("LogValue() = %s, want durations like 30s and no secret", logged)
	}
}

// An owner's slots are split between the sale routes and the export
// routes: a quarter for the sales unless set, and never a split that
// leaves the export routes none (a sale share at or over the whole
// refused at start, not an owner whose list pages are all 429). With the
// cap off, the share is not checked against it.
func TestOwnerSlotsSplitAsConfigured(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://db/x", "IDENTITY_SECRET": testSecret}
	load := func(extra map[string]string) (Config, error) {
		return LoadConfig(func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		})
	}
	for _, c := range []struct {
		total, sale       string
		wantTotal, wantSa int
	}{
		{"", "", 64, 16}, {"32", "", 32, 8}, {"3", "", 3, 1}, {"2", "", 2, 1}, {"64", "40", 64, 40}, {"0", "", 0, 1}, {"0", "500", 0, 500},
	} {
		cfg, err := load(map[string]string{"RATE_LIMIT_OWNER_IN_FLIGHT": c.total, "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": c.sale})
		if err != nil || cfg.OwnerInFlight != c.wantTotal || cfg.OwnerSaleInFlight != c.wantSa {
			t.Errorf("RATE_LIMIT_OWNER_IN_FLIGHT=%q RATE_LIMIT_OWNER_SALE_IN_FLIGHT=%q: %d, %d, %v; want %d, %d",
				c.total, c.sale, cfg.OwnerInFlight, cfg.OwnerSaleInFlight, err, c.wantTotal, c.wantSa)
		}
	}
	for _, c := range []struct{ total, sale, names string }{
		{"1", "", "RATE_LIMIT_OWNER_IN_FLIGHT must be 0 (no cap) or at least 2"},
		{"64", "64", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT (64) must be below"},
		{"64", "100", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT (100) must be below"},
		{"64", "0", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT must be an integer"},
	} {
		_, err := load(map[string]string{"RATE_LIMIT_OWNER_IN_FLIGHT": c.total, "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": c.sale})
		if err == nil || !strings.Contains(err.Error(), c.names) {
			t.Errorf("RATE_LIMIT_OWNER_IN_FLIGHT=%q RATE_LIMIT_OWNER_SALE_IN_FLIGHT=%q: error %v, want %q", c.total, c.sale, err, c.names)
		}
	}
	// Every keyed route has a share, and the shares add up to the whole.
	slots := newOwnerSlots(newMetrics(), 64, 16)
	sum := 0
	for _, rt := range routes {
		if rt.Scope == "" {
			continue
		}
		if slots[rt.Upstream] == nil {
			t.Errorf("route %s: no owner slots for %s", rt.Name(), rt.Upstream)
		}
	}
	for _, s := range slots {
		sum += s.slots.limit
	}
	if sum != 64 || slots[upstreamSalesWriter].slots.limit != 16 {
		t.Errorf("newOwnerSlots(64, 16): %d in all, %d for sales; want 64 and 16", sum, slots[upstreamSalesWriter].slots.limit)
	}
}

// An instance that breaks off its answer halfway gets the client a whole
// 502 envelope, never a 200 cut short: an answer without a length (which
// export-reader never sends) is read whole, on the list route as on GET
// by id.
func TestAnswerCutOffUpstreamIsA502(t *testing.T) {
	upstream := testenv.ServeConns(t, func(conn net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
			return
		}
		// A page as net/http sends it (chunked), broken off after a first
		// chunk of ~100 KB: a streaming proxy would have sent the client a
		// 200 by then.
		chunk := append([]byte(`{"data":[`), bytes.Repeat([]byte(`{"id":"a1"},`), 100_000/12)...)
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(chunk), chunk)
	})
	g, _, _ := startInternal(t, map[string]string{"EXPORT_READER_URLS": "http://" + upstream}, fakeKeys{})
	for _, path := range []string{"/v1/export/items/a1", "/v1/export/items"} {
		resp, env := get(t, "http://"+g.Addr()+path, map[string]string{"X-API-Key": wellFormedKey(t)})
		if resp.StatusCode != 502 || env.Error == nil || env.Error.Code != "bad_gateway" || env.Meta.RequestID == "" {
			t.Errorf("GET %s through an instance that cut its answer = %d %+v %+v, want 502 bad_gateway with a request id",
				path, resp.StatusCode, env.Error, env.Meta)
		}
	}
}

// An answer read whole in the gateway that its instance breaks off after
// its head fails its proxy span, as one that fails before its head does:
// the span covers the read, which for an item once happened in upstream.Do.
// Ended at the head, an item broken off showed a proxy span of 200 and no
// error under its client's 502.
func TestAnswerBrokenOffAfterItsHeadFailsItsProxySpan(t *testing.T) {
	upstream := testenv.ServeConns(t, func(conn net.Conn) {
		r, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		length := 8000 // read into the client's answer at once (relaySmall)
		if r.URL.Query().Get("cursor") == "held" {
			length = 100_000 // held whole (relayWholeInto)
		}
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"data\":[", length)
	})
	g, sr, _ := startInternal(t, map[string]string{"EXPORT_READER_URLS": "http://" + upstream}, fakeKeys{})
	for _, path := range []string{"/v1/export/items/a1", "/v1/export/items?cursor=held"} {
		if resp, env := get(t, "http://"+g.Addr()+path, map[string]string{"X-API-Key": wellFormedKey(t)}); resp.StatusCode != 502 {
			t.Fatalf("GET %s through an instance that broke its answer off = %d %+v, want 502", path, resp.StatusCode, env.Error)
		}
	}
	var failed int
	for _, s := range sr.Ended() {
		if s.Name() == "proxy export-reader" && s.Status().Code == codes.Error && s.Status().Description == "bad_response" {
			failed++
		}
	}
	if failed != 2 {
		t.Errorf("%d proxy spans failed bad_response, want 2 (an item, a list page held whole)", failed)
	}
}

// A key a client puts in the path is refused like one in the query, and no
// span records it: spans carry url.path.
func TestKeyInThePathIsRefusedAndNotTraced(t *testing.T) {
	g, sr, logs := startInternal(t, nil, fakeKeys{})
	key := wellFormedKey(t)
	// Answers without a route (404, or 405 for the GET of a POST route) come
	// before any key is looked at; their spans are checked all the same.
	for path, want := range map[string]int{
		"/v1/export/items/" + key:                    401,
		"/v1/export/items/" + key + "/sales/confirm": 405,
		"/v1/nope/" + key:                            404,
		// A letter escaped hides nothing.
		"/v1/export/items/" + fmt.Sprintf("%%%02X", key[0]) + key[1:]: 401,
		// Nor does a broken escape elsewhere in the path.
		"/v1/%zz/" + fmt.Sprintf("%%%02X", key[0]) + key[1:]: 404,
	} {
		resp, env := get(t, "http://"+g.Addr()+path, map[string]string{"X-API-Key": wellFormedKey(t)})
		if resp.StatusCode != want || env.Error == nil {
			t.Errorf("GET %s = %d %+v, want %d", strings.Replace(path, key, "<key>", 1), resp.StatusCode, env.Error, want)
		}
	}
	spans := sr.Ended()
	if len(spans) == 0 {
		t.Fatal("no span recorded")
	}
	for _, s := range spans {
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), key) || strings.Contains(a.Value.String(), key[1:]) {
				t.Errorf("span %q attribute %s holds the key", s.Name(), a.Key)
			}
		}
	}
	if strings.Contains(logs.String(), key) {
		t.Error("the key is in the logs")
	}
}

// fasthttp takes raw bytes that are not UTF-8 in a path; the span records
// them as U+FFFD, since OTLP cannot encode such a string and would drop the
// span's whole export batch.
func TestSpanPathIsUTF8(t *testing.T) {
	g, sr, _ := startInternal(t, nil, fakeKeys{})
	conn, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /v1/export/items/coin\xff\xfe HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, s := range sr.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "url.path" {
				paths = append(paths, a.Value.AsString())
			}
		}
	}
	if len(paths) == 0 || paths[0] != "/v1/export/items/coin\uFFFD" {
		t.Errorf("url.path attributes = %q, want the path with U+FFFD for the bytes that are not UTF-8", paths)
	}
}

// A key mistyped or cut short in the path is no key: the request is served
// (here: the item is looked up, and the fake upstream is not there), but no
// span or log records that much of a secret.
func TestNearMissKeyInThePathIsServedAndNotTraced(t *testing.T) {
	g, sr, logs := startInternal(t, nil, fakeKeys{})
	key := wellFormedKey(t)
	mistyped := key[:20] + string(key[20]^1) + key[21:]
	for _, id := range []string{mistyped, key[:30]} {
		resp, _ := get(t, "http://"+g.Addr()+"/v1/export/items/"+id, map[string]string{"X-API-Key": wellFormedKey(t)})
		if resp.StatusCode == 401 {
			t.Errorf("GET with a near-miss key %.8s… as item id = 401, want it served like any id", id)
		}
	}
	for _, s := range sr.Ended() {
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), key[4:20]) {
				t.Errorf("span %q attribute %s = %q holds most of a key", s.Name(), a.Key, a.Value.String())
			}
		}
	}
	if strings.Contains(logs.String(), key[4:20]) {
		t.Errorf("the logs hold most of a key:\n%s", logs.String())
	}
}

// Every kind errorKind returns has its series created at start
// (kindUnavailable, and instanceErrorKinds for each instance), so none
// appears only with its first failure.
func TestErrorKindsAreAllListed(t *testing.T) {
	if kind := errorKind(upstream.ErrUnavailable); kind != kindUnavailable {
		t.Errorf("errorKind(%v) = %q, want %q", upstream.ErrUnavailable, kind, kindUnavailable)
	}
	for _, err := range []error{upstream.ErrUnreachable, upstream.ErrTimeout,
		upstream.ErrClosed, upstream.ErrBadResponse, errIdentityRefused, fmt.Errorf("wrapped: %w", upstream.ErrTimeout)} {
		if kind := errorKind(err); !slices.Contains(instanceErrorKinds, kind) {
			t.Errorf("errorKind(%v) = %q, not in instanceErrorKinds %v", err, kind, instanceErrorKinds)
		}
	}
	// Every kind upstream.Do repeats after has its retry series.
	for _, err := range []error{upstream.ErrUnreachable, upstream.ErrTimeout, upstream.ErrClosed, upstream.ErrBadResponse} {
		if kind := errorKind(err); !slices.Contains(repeatedErrorKinds, kind) {
			t.Errorf("errorKind(%v) = %q, not in repeatedErrorKinds %v", err, kind, repeatedErrorKinds)
		}
	}
}

// A request sent again says so in its trace and its access line: the proxy
// span, which then holds two attempts' server spans, has an event naming
// the first attempt's failure and the instance that failed, and the access
// line names that instance beside the one that answered (the "sent again"
// warning is throttled, so it cannot be relied on for a given request).
func TestRepeatIsAnEventOfTheProxySpan(t *testing.T) {
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteData(w, 200, "ok", envelope.Meta{})
	}))
	t.Cleanup(good.Close)
	firstProbe := make(chan struct{})
	var once sync.Once
	gone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(firstProbe) }) // only the prober calls it
	}))
	g, sr, logs := startInternal(t, map[string]string{
		"EXPORT_READER_URLS": gone.URL + "," + good.URL, "UPSTREAM_PROBE_INTERVAL": "1h"}, fakeKeys{})
	select {
	case <-firstProbe:
	case <-time.After(5 * time.Second):
		t.Fatal("the prober never asked the instance")
	}
	gone.Close() // after the first probe found it up: only a request can notice
	var requestIDs []string
	for range 2 { // round-robin: one of the two meets the refusing instance first
		resp, env := get(t, "http://"+g.Addr()+"/v1/export/items/coin-1", map[string]string{"X-API-Key": wellFormedKey(t)})
		if resp.StatusCode != 200 {
			t.Fatalf("GET = %d %+v, want 200", resp.StatusCode, env.Error)
		}
		requestIDs = append(requestIDs, resp.Header.Get("X-Request-Id"))
	}
	events := 0
	for _, s := range sr.Ended() {
		for _, ev := range s.Events() {
			if ev.Name != "sent again" {
				continue
			}
			events++
			attrs := map[string]string{}
			for _, a := range ev.Attributes {
				attrs[string(a.Key)] = a.Value.String()
			}
			want := map[string]string{"upstream.failed_attempt.kind": "unreachable", "upstream.failed_attempt.instance": gone.URL}
			if s.Name() != "proxy export-reader" || !maps.Equal(attrs, want) {
				t.Errorf("event %q on span %q with %v, want it on the proxy span with %v", ev.Name, s.Name(), attrs, want)
			}
		}
	}
	if events != 1 {
		t.Errorf("%d repeat events, want 1", events)
	}
	repeated := 0
	for _, id := range requestIDs {
		line := ""
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, id) && strings.Contains(l, `"msg":"request"`) {
				line = l
			}
		}
		if !strings.Contains(line, `"upstream_failed_instance"`) {
			continue
		}
		repeated++
		for _, want := range []string{`"upstream_failed_instance":"` + gone.URL + `"`, `"upstream_failed_kind":"unreachable"`,
			`"upstream_instance":"` + good.URL + `"`} {
			if !strings.Contains(line, want) {
				t.Errorf("access line of the repeated request = %s, want %s", line, want)
			}
		}
	}
	if repeated != 1 {
		t.Errorf("%d access lines name a failed instance, want 1:\n%s", repeated, logs.String())
	}
}

// The 429 of the cap on shop schema calls in flight names its limit on
// the server span, as every limit's 429 does.
func TestShopSchemaInFlightRefusalNamesItsLimitOnTheSpan(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		arrived <- struct{}{}
		select { // bounded, so that a missing refusal fails the test rather than hanging it
		case <-release:
		case <-time.After(10 * time.Second):
		}
	}))
	t.Cleanup(shop.Close)
	g, sr, _ := startInternal(t, map[string]string{"SHOP_SCHEMA_URLS": shop.URL, "RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT": "1"}, fakeKeys{})
	url := "http://" + g.Addr() + "/v1/sync/prestashop/schema"
	held := make(chan error, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader("{}"))
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	<-arrived
	resp, err := http.Post(url, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 {
		t.Fatalf("second call in flight = %d, want 429", resp.StatusCode)
	}
	requestID := resp.Header.Get("X-Request-Id")
	for _, s := range sr.Ended() {
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		if s.SpanKind() == trace.SpanKindServer && attrs["request.id"] == requestID {
			if got := attrs["app.rate_limit.class"]; got != "shop_schema_in_flight" {
				t.Errorf("server span of the 429: app.rate_limit.class = %q, want shop_schema_in_flight", got)
			}
			return
		}
	}
	t.Fatal("no server span of the 429")
}

// A sale the gateway answers 503 unavailable because its key could not be
// checked (the key store out of reach) was sent nowhere: its access line
// and its answer say nothing was applied, as every other answer the
// gateway gives a sale itself says what it knows of the sale. They said
// nothing, and an SRE tracing the sale by its request id found neither a
// claim there nor a line in sales-writer.
func TestASaleWhoseKeyCouldNotBeCheckedWasNotApplied(t *testing.T) {
	g, _, logs := startInternal(t, nil, refusingKeys{errors.New("dial unix /run/pg/.s.PGSQL.5432: connect: no such file or directory")})
	resp, answer, err := postConfirm(t, g.Addr())
	if err != nil || answer.Error == nil || answer.Error.Message != errSaleAuthUnavailable.Message {
		t.Errorf("a sale whose key could not be checked: %+v (%v), want the message %q", answer.Error, err, errSaleAuthUnavailable.Message)
	}
	requestID := resp.Header.Get("X-Request-Id")
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, requestID) && strings.Contains(l, `"msg":"request"`) {
			line = l
		}
	}
	if resp.StatusCode != 503 || !strings.Contains(line, `"error_code":"unavailable"`) || !strings.Contains(line, `"sale_applied":"no"`) {
		t.Errorf("a sale whose key could not be checked = %d, access line %s; want 503 unavailable and sale_applied no", resp.StatusCode, line)
	}
}

// refusingKeys refuses every key, for the cause in err (and names the key
// when it is revoked, as keystore does).
type refusingKeys struct{ err error }

func (r refusingKeys) Lookup(context.Context, string, func() bool) (keystore.Key, error) {
	if errors.Is(r.err, keystore.ErrRevokedKey) {
		return keystore.Key{ID: "k-revoked", OwnerID: "o1", Scopes: []string{identity.ScopeExportRead}}, r.err
	}
	return keystore.Key{}, r.err
}

// Every 401 reads alike to the client, but its access line and span say
// why, and a revoked key is named: an operator asked "why does this
// marketplace get 401?" finds the answer by the request id.
func TestAuthFailuresSayWhy(t *testing.T) {
	tests := []struct {
		cause     error
		reason    string
		keyID     string
		headerKey string
	}{
		{keystore.ErrRevokedKey, "revoked", "k-revoked", wellFormedKey(t)},
		{keystore.ErrUnknownKey, "unknown", "", wellFormedKey(t)},
		{keystore.ErrMalformedKey, "malformed", "", "cxr_nope"},
		{keystore.ErrMissingKey, "missing", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			g, sr, logs := startInternal(t, nil, refusingKeys{tt.cause})
			headers := map[string]string{}
			if tt.headerKey != "" {
				headers["X-API-Key"] = tt.headerKey
			}
			resp, env := get(t, "http://"+g.Addr()+"/v1/export/items", headers)
			if resp.StatusCode != 401 || env.Error == nil || env.Error.Message != errUnauthenticated.Message {
				t.Fatalf("GET = %d %+v, want the one 401 of every cause", resp.StatusCode, env.Error)
			}
			requestID := resp.Header.Get("X-Request-Id")
			var server sdktrace.ReadOnlySpan
			for _, s := range sr.Ended() {
				if s.SpanKind() == trace.SpanKindServer {
					server = s
				}
			}
			if server == nil {
				t.Fatal("no server span")
			}
			attrs := map[string]string{}
			for _, a := range server.Attributes() {
				attrs[string(a.Key)] = a.Value.String()
			}
			if attrs["app.auth_failure"] != tt.reason || attrs["api_key.id"] != tt.keyID {
				t.Errorf("span app.auth_failure = %q, api_key.id = %q; want %q, %q", attrs["app.auth_failure"], attrs["api_key.id"], tt.reason, tt.keyID)
			}
			var line string
			for l := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(l, requestID) && strings.Contains(l, `"msg":"request"`) {
					line = l
				}
			}
			if !strings.Contains(line, `"auth_failure":"`+tt.reason+`"`) || (tt.keyID != "") != strings.Contains(line, `"key_id":"`+tt.keyID+`"`) {
				t.Errorf("access line = %s, want auth_failure %q and key_id %q", line, tt.reason, tt.keyID)
			}
		})
	}
}

// misreadHead tells each head a proxy in front could read otherwise by its
// refusal, and passes heads any parser reads alike, whatever their values
// hold. The heads are read by fasthttp first, as the server does.
func TestMisreadHead(t *testing.T) {
	next := "GET /v1/health HTTP/1.1\r\nHost: gateway\r\n\r\n" // a CRLFCRLF buffered after the head
	for _, tt := range []struct {
		name, head string
		want       error
	}{
		{"plain", "Host: g\r\nX-API-Key: k\r\nContent-Length: 2\r\n\r\n", nil},
		{"colons and cookies in values", "Host: g\r\nX-A: a:b\r\nCookie: a=1; b=2:3\r\nTrailer: X-B\r\n\r\n", nil},
		{"names that only start alike", "Host: g\r\nTransfer_Encodings: x\r\nContent_Lengthy: 1\r\nCache-Control: no\r\n\r\n", nil},
		{"chunked", "Host: g\r\nTransfer-Encoding: chunked\r\n\r\n", nil},
		{"a bare LF between fields", "Host: g\r\nX-A: a\nX-API-Key: k\r\n\r\n", errBareLineFeed},
		{"a bare LF ending the last field", "Host: g\r\nContent-Length: 0\n\r\n", errBareLineFeed},
		{"a bare LF for the empty line", "Host: g\r\nContent-Length: 0\r\n\n", errBareLineFeed},
		{"a folded line", "Host: g\r\nX-A: a\r\n b\r\n\r\n", errObsFold},
		{"a folded line, tab", "Host: g\r\nX-A: a\r\n\tb\r\n\r\n", errObsFold},
		{"Transfer_Encoding", "Host: g\r\nTransfer_Encoding: chunked\r\n\r\n", errFramingLookalike},
		{"content_length", "Host: g\r\ncontent_length: 0\r\n\r\n", errFramingLookalike},
		{"Transfer Encoding", "Host: g\r\nTransfer Encoding: chunked\r\n\r\n", errFramingLookalike},
		{"Content Length", "Host: g\r\nContent Length: 0\r\n\r\n", errFramingLookalike},
		{"chunked and a length", "Host: g\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n", errAmbiguousFraming},
	} {
		var h fasthttp.RequestHeader
		raw := "POST /v1/x HTTP/1.1\r\n" + tt.head + next
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatalf("%s: fasthttp refused %q: %v", tt.name, raw, err)
		}
		if got := misreadHead(&h); got != tt.want {
			t.Errorf("%s: misreadHead = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// BenchmarkMisreadHead is the check's cost on a usual GET, which every
// request pays.
func BenchmarkMisreadHead(b *testing.B) {
	var h fasthttp.RequestHeader
	raw := "GET /v1/export/items/coin-1 HTTP/1.1\r\nHost: gateway\r\nUser-Agent: wrk\r\nAccept: application/json\r\n" +
		"Accept-Encoding: gzip\r\nX-API-Key: cxr_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ012345\r\nConnection: keep-alive\r\n\r\n"
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := misreadHead(&h); err != nil {
			b.Fatalf("a plain GET refused: %v", err)
		}
	}
}

// What the gateway answers for each way an upstream call fails: nothing
// sent (503 with Retry-After, a retry applies nothing twice) apart from
// sent and lost (502, 504: the call may have been applied).
func TestUpstreamFailureAnswers(t *testing.T) {
	for _, tt := range []struct {
		err        error
		status     int
		code       string
		retryAfter bool
	}{
		{upstream.ErrUnavailable, 503, "upstream_unavailable", true},
		{fmt.Errorf("%w: http://10.0.0.1:8082: dial tcp: connection refused", upstream.ErrUnreachable), 503, "upstream_unavailable", true},
		{upstream.ErrClosed, 502, "bad_gateway", false},
		{upstream.ErrBadResponse, 502, "bad_gateway", false},
		{upstream.ErrTimeout, 504, "upstream_timeout", false},
	} {
		ae, logged := toAPIError(tt.err)
		if ae.Status != tt.status || ae.Code != tt.code || (ae.RetryAfter > 0) != tt.retryAfter || !logged {
			t.Errorf("toAPIError(%v) = %d %s (Retry-After %s, logged %v), want %d %s, Retry-After %v, logged",
				tt.err, ae.Status, ae.Code, ae.RetryAfter, logged, tt.status, tt.code, tt.retryAfter)
		}
	}
}

// hasTrailerFields finds fields after the chunks, even empty or announced,
// and none in requests without them, whatever their header section holds
// (specials fasthttp parses apart, repeats, cookies, an announcement, an
// empty body it gives a length).
func TestHasTrailerFields(t *testing.T) {
	head := "POST /v1/x HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n"
	for _, tt := range []struct {
		name, headers, body string
		want                bool
	}{
		{"none", "", "2\r\n{}\r\n0\r\n\r\n", false},
		{"empty body", "", "0\r\n\r\n", false},
		{"specials and repeats", "Content-Type: application/json\r\nUser-Agent: a\r\nCookie: a=1; b=2\r\nCookie: c=3\r\n" +
			"Connection: keep-alive\r\nX-A: 1\r\nX-A: 2\r\nTrailer: X-B\r\nAccept: */*\r\n", "2\r\n{}\r\n0\r\n\r\n", false},
		{"one field", "", "2\r\n{}\r\n0\r\nX-API-Key: k\r\n\r\n", true},
		{"a repeat of a header", "X-A: 1\r\n", "2\r\n{}\r\n0\r\nX-A: 2\r\n\r\n", true},
		{"declared", "Trailer: X-B\r\n", "0\r\nX-B: 1\r\n\r\n", true},
		{"declared, none sent", "Trailer: X-B\r\n", "0\r\n\r\n", false},
		{"an empty value", "", "0\r\nX-B:\r\n\r\n", true},
	} {
		var req fasthttp.Request
		br := bufio.NewReader(strings.NewReader(head + tt.headers + "\r\n" + tt.body))
		if err := req.Read(br); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := hasTrailerFields(&req.Header); got != tt.want {
			t.Errorf("%s: hasTrailerFields = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// Route names (metric labels, span names) write a parameter as the
// services do, {item_id}, so one query matches a route in every process.
func TestRouteNamesMatchTheServices(t *testing.T) {
	want := map[string]bool{
		"GET /v1/health": true, "POST /v1/sync/prestashop/schema": true, "GET /v1/export/items": true,
		"GET /v1/export/items/{item_id}": true, "POST /v1/export/items/{item_id}/sales/confirm": true,
		"POST /v1/export/items/{item_id}/sales/cancel": true,
	}
	for _, rt := range routes {
		if !want[rt.Name()] {
			t.Errorf("route %s %s is named %q, not one of the services' names", rt.Method, rt.Path, rt.Name())
		}
	}
}

// A request no route serves is named as the routing table would name it:
// a 405 after its path (the pattern alone, no method), a 404 unmatched.
func TestRouteNameOf(t *testing.T) {
	for _, tt := range []struct{ method, path, want string }{
		{"GET", "/v1/export/items/coin-1", "GET /v1/export/items/{item_id}"},
		{"HEAD", "/v1/export/items", "HEAD /v1/export/items"},
		{"POST", "/v1/export/items/coin-1/sales/confirm", "POST /v1/export/items/{item_id}/sales/confirm"},
		{"GET", "/v1/export/items/coin-1/sales/confirm", "/v1/export/items/{item_id}/sales/confirm"},
		{"DELETE", "/v1/export/items/coin-1", "/v1/export/items/{item_id}"},
		{"FOO", "/v1/health", "/v1/health"},
		{"get", "/v1/health", "/v1/health"},
		{"GET", "/v1/nothing", "unmatched"},
		{"GET", "/v1/export/items//sales/confirm", "unmatched"},
	} {
		if got := routeNameOf(tt.method, tt.path); got != tt.want {
			t.Errorf("routeNameOf(%q, %q) = %q, want %q", tt.method, tt.path, got, tt.want)
		}
	}
}

// logLine reports whether one line of logs holds every part.
func logLine(logs string, parts ...string) bool {
	for line := range strings.SplitSeq(logs, "\n") {
		found := true
		for _, p := range parts {
			found = found && strings.Contains(line, p)
		}
		if found {
			return true
		}
	}
	return false
}

func TestErrorCodeLabel(t *testing.T) {
	for code, want := range map[string]string{
		"":                           "none",
		"rate_limited":               "rate_limited",
		"shop_401":                   "shop_401",
		"Rate_Limited":               "other",
		"bad code":                   "other",
		"code\n":                     "other",
		strings.Repeat("a", 64):      strings.Repeat("a", 64),
		strings.Repeat("a", 65):      "other",
		"cxr_ABCDEFGHIJKLMNOPQRSTUV": "other",
	} {
		if got := errorCodeLabel([]byte(code)); got != want {
			t.Errorf("errorCodeLabel(%q) = %q, want %q", code, got, want)
		}
	}
}

// What an SRE is handed may be a client's own X-Request-Id rather than
// meta.request_id, or a 404 whose trace was sampled out: the access line
// and the server span record the client's id (never adopting it as the
// request id), and a 404 unmatched line names the path it was sent to,
// both as client values are recorded (no key, cut at 128 characters).
func TestAccessLineNamesTheClientsOwnIDAndAnUnmatchedPath(t *testing.T) {
	g, sr, logs := startInternal(t, nil, fakeKeys{})
	base := "http://" + g.Addr()
	key := wellFormedKey(t)
	long := strings.Repeat("r", 200)
	for _, tt := range []struct {
		name, path, clientID string
		status               int
		wantLog, wantSpan    []string // access line fields; app.client_request_id
		notInLog             string
	}{
		{"client's id", "/v1/export/items", "ticket-42", 200,
			[]string{`"client_request_id":"ticket-42"`}, []string{"ticket-42"}, `"path"`},
		{"client's id holding a key", "/v1/export/items", "x" + key, 200,
			[]string{`"client_request_id":"[holds an API key]"`}, []string{"[holds an API key]"}, key},
		{"client's id cut", "/v1/export/items", long, 200,
			[]string{`"client_request_id":"` + long[:128] + `…"`}, []string{long[:128] + "…"}, long},
		{"unmatched path", "/v1/export/itemz", "", 404,
			[]string{`"route":"unmatched"`, `"path":"/v1/export/itemz"`}, nil, `client_request_id`},
		{"unmatched path with a key", "/v1/nope/" + key, "", 404,
			[]string{`"route":"unmatched"`, `"path":"/v1/nope/[key]"`}, nil, key},
	} {
		t.Run(tt.name, func(t *testing.T) {
			headers := map[string]string{"X-API-Key": key}
			if tt.clientID != "" {
				headers["X-Request-Id"] = tt.clientID
			}
			resp, env := get(t, base+tt.path, headers)
			requestID := resp.Header.Get("X-Request-Id")
			// (The fake upstream's 200 has no meta.request_id of its own.)
			if resp.StatusCode != tt.status || (tt.status != 200 && requestID != env.Meta.RequestID) || requestID == tt.clientID {
				t.Fatalf("GET %s = %d, X-Request-Id %q, meta.request_id %q; want %d and the gateway's own id",
					tt.path, resp.StatusCode, requestID, env.Meta.RequestID, tt.status)
			}
			line := accessLineOf(logs.String(), requestID) // written before the answer's last byte
			for _, want := range tt.wantLog {
				if !strings.Contains(line, want) {
					t.Errorf("access line %s lacks %s", line, want)
				}
			}
			if strings.Contains(line, tt.notInLog) {
				t.Errorf("access line %s holds %s", line, tt.notInLog)
			}
			var got []string
			for _, s := range sr.Ended() {
				if s.SpanContext().TraceID().String() != requestID || s.SpanKind() != trace.SpanKindServer {
					continue
				}
				for _, a := range s.Attributes() {
					if a.Key == attrClientRequestID {
						got = append(got, a.Value.AsString())
					}
				}
			}
			if !slices.Equal(got, tt.wantSpan) {
				t.Errorf("server span's %s = %q, want %q", attrClientRequestID, got, tt.wantSpan)
			}
		})
	}
}

// accessLineOf is the access line of the request requestID.
func accessLineOf(logs, requestID string) string {
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, `"msg":"request"`) && strings.Contains(line, requestID) {
			return line
		}
	}
	return ""
}

// The series of an instance discovery removed go at the next change, even
// those a request still in flight on it brought back with its failure
// after the removal: pods rescheduled at every rollout would otherwise
// pile up series for as long as the gateway runs.
func TestSeriesOfRemovedInstancesGo(t *testing.T) {
	m := newMetrics()
	const up, a, b, c = "export-reader", "http://10.0.0.1:8081", "http://10.0.0.2:8081", "http://10.0.0.3:8081"
	m.followInstances(up, []string{a, b})
	m.followInstances(up, []string{b}) // a's pod is gone
	m.upstreamErrors.WithLabelValues(up, a, "closed").Inc()
	m.upstreamRetries.WithLabelValues(up, a, "closed").Inc()
	m.followInstances(up, []string{b, c})
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, family := range families {
		for _, metric := range family.GetMetric() {
			for _, label := range metric.GetLabel() {
				if label.GetName() == "upstream_instance" && label.GetValue() == a {
					t.Errorf("%s keeps a series of %s, removed two changes ago: %v", family.GetName(), a, metric.GetLabel())
				}
			}
		}
	}
}

// A listener that stops serving on its own is named in the error Failed
// delivers (the binary logs it and stops): it was fasthttp's or
// net/http's bare "use of closed network connection", which said neither
// which listener nor which address.
func TestAFailedListenerIsNamed(t *testing.T) {
	g, _ := startWithHook(t, nil, nil)
	g.adminLn.Close() // as if the admin listener broke
	select {
	case err := <-g.Failed():
		if want := "admin listener " + g.AdminAddr() + " stopped serving"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Failed() = %v, want an error with %q", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Failed() delivered nothing after the admin listener was closed")
	}
}

// Each claim the gateway's line records of a sale (saleClaims) is what its
// answer says: the drill reads the answer (salescheck.SaysNothingApplied:
// "nothing was applied", or the code upstream_unavailable), the SRE the
// line, and the two must not part.
func TestSaleClaimsSayWhatTheirMessagesSay(t *testing.T) {
	for ae, claim := range saleClaims {
		saysMaybe := strings.Contains(ae.Message, saleclaim.MayHaveBeenApplied)
		saysNo := strings.Contains(ae.Message, saleclaim.NothingApplied) || ae.Code == "upstream_unavailable"
		want := saleclaim.Nothing
		if saysMaybe {
			want = saleclaim.Maybe
		}
		if saysMaybe == saysNo || claim != want {
			t.Errorf("saleClaims[%d %s %q] = %q, which its message does not say", ae.Status, ae.Code, ae.Message, claim)
		}
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Every way a GET by id (or its HEAD) can end gives its upstream
// connection back for the next request, its owner's slot and its held
// bytes: 2,000 of them over UPSTREAM_MAX_CONNS=2 all get the reader's
// answer (none a 503 for want of a free connection, nor a 504 waiting for
// one), over a handful of connections (a streamed answer's connection is
// reused only once its body has been read to its end: closed otherwise,
// each GET would dial one), and nothing is left held.
func TestEveryEndingOfAnItemGivesBackItsConnection(t *testing.T) {
	var gzipped bytes.Buffer
	zw := gzip.NewWriter(&gzipped)
	_, _ = zw.Write(bytes.Repeat([]byte(`{"id":"a1"},`), 5000))
	_ = zw.Close()
	var dialled atomic.Int64
	reader := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch item := path.Base(r.URL.Path); item {
		case "healthz":
		case "gone":
			envelope.WriteError(w, http.StatusNotFound, "not_found", "no such item", "r")
		case "failing":
			envelope.WriteError(w, http.StatusInternalServerError, "internal_error", "internal error", "r")
		case "unchanged":
			w.WriteHeader(http.StatusNotModified)
		case "none":
			w.WriteHeader(http.StatusNoContent)
		case "gzipped":
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Length", strconv.Itoa(gzipped.Len()))
			_, _ = w.Write(gzipped.Bytes())
		default: // its size in bytes
			n, _ := strconv.Atoi(item)
			w.Header().Set("Content-Length", item)
			_, _ = w.Write(bytes.Repeat([]byte("x"), n))
		}
	}))
	reader.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			dialled.Add(1)
		}
	}
	reader.Start()
	t.Cleanup(reader.Close)
	// The owner's cap off (0) too: no slot is taken, and request.endCall,
	// which each of these calls ends with, has none to give back.
	for _, ownerCap := range []string{"8", "0"} {
		t.Run("RATE_LIMIT_OWNER_IN_FLIGHT="+ownerCap, func(t *testing.T) {
			dialled.Store(0)
			getEveryEnding(t, reader.URL, ownerCap, &dialled)
		})
	}
}

// getEveryEnding is TestEveryEndingOfAnItemGivesBackItsConnection with
// the owner's cap at ownerCap, against reader, which counts its dials in
// dialled.
func getEveryEnding(t *testing.T, reader, ownerCap string, dialled *atomic.Int64) {
	g, _, _ := startInternal(t, map[string]string{"EXPORT_READER_URLS": reader, "UPSTREAM_MAX_CONNS": "2",
		"RATE_LIMIT_ENABLED": "false", "RATE_LIMIT_OWNER_IN_FLIGHT": ownerCap, "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1"}, fakeKeys{})
	want := map[string]int{"2000": 200, "0": 200, "16384": 200, "16385": 200, "100000": 200, "gzipped": 200,
		"gone": 404, "failing": 500, "unchanged": 304, "none": 204}
	items := slices.Sorted(maps.Keys(want))
	key := wellFormedKey(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 500 {
				item, method := items[i%len(items)], "GET"
				if i%3 == 0 {
					method = "HEAD"
				}
				req, _ := http.NewRequest(method, "http://"+g.Addr()+"/v1/export/items/"+item, nil)
				req.Header.Set("X-API-Key", key)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("%s %s: %v", method, item, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want[item] {
					t.Errorf("%s %s = %d, want %d", method, item, resp.StatusCode, want[item])
					return
				}
			}
		})
	}
	wg.Wait()
	if n := dialled.Load(); n > 4 { // 2, and the health probe's
		t.Errorf("2,000 GETs over UPSTREAM_MAX_CONNS=2 dialled the reader %d times, want at most 4", n)
	}
	// fasthttp gives an answer's stream back once it has written it,
	// which may be after its client has read it.
	for deadline := time.Now().Add(5 * time.Second); heldBytes(g) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of answers still held after every GET ended, want none", heldBytes(g))
		}
	}
	if g.ownerSlots == nil { // no cap: no slot taken
		return
	}
	share := g.ownerSlots[upstreamExportReader].slots
	share.mu.Lock()
	defer share.mu.Unlock()
	if len(share.held) != 0 {
		t.Errorf("owner slots held after every GET ended: %v, want none", share.held)
	}
}

// Items read into their client's answer at once (relaySmall) leave the
// buffers of pages read whole (pages) to pages: bytebufferpool keeps only
// buffers up to the size of 95 % of the buffers put back (it calibrates
// every 42,000 of a size), so once items of ~2 KB, many times more
// numerous than a sync's pages, shared their pool, a ~100 KB page's
// buffer was dropped when put back and every page read whole was read
// into a buffer made afresh: the 100 KB of garbage per page that cost the
// gateway 1.6 times its CPU per sync page (relayedStream.WriteTo).
func TestItemsLeaveThePagesBuffersPooled(t *testing.T) {
	if racedetector.Enabled {
		t.Skip("sync.Pool drops a quarter of what is put back under the race detector")
	}
	relayed := func(body []byte, relay func(resp, answer *fasthttp.Response, done callEnd) error) {
		answer, resp := fasthttp.AcquireResponse(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		answer.SetBodyStream(bytes.NewReader(body), len(body))
		if err := relay(resp, answer, endFunc(func() {})); err != nil {
			t.Fatal(err)
		}
		if err := resp.BodyWriteTo(io.Discard); err != nil { // and closes a page's stream, putting its buffer back
			t.Fatal(err)
		}
	}
	item, page := bytes.Repeat([]byte("i"), 2000), bytes.Repeat([]byte("p"), 100_000)
	for range 45_000 { // past the calibration's 42,000
		relayed(item, relaySmall)
	}
	relayed(page, relayWhole) // a buffer of a page's size, put back
	if perPage := allocatedPerRun(50, func() { relayed(page, relayWhole) }); perPage > 20_000 {
		t.Errorf("a 100 KB page read whole after 45,000 items allocated %d bytes, want its pooled buffer reused (under 20,000)", perPage)
	}
}

// allocatedPerRun is the bytes the process allocated per run of f, over
// runs of it.
func allocatedPerRun(runs int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// heldBytes is what g's heldAnswers counts held.
func heldBytes(g *Gateway) int { return g.heldAnswers.bytesHeld() }

// panicking is a body stream whose read panics.
type panicking struct{}

func (panicking) Read([]byte) (int, error) { panic("boom while reading the answer") }

// An answer whose read panics (guardedServe answers the 500) still ends
// its call once, done run and the held page given back, as a read that
// fails does, and as relaySmall's reads do: proxyUntilRelayed has handed
// both over by then. Without, the owner's slot and the page's bytes of
// heldAnswersLimit were held for the process's life.
func TestAPanicWhileReadingAPageEndsItsCallOnce(t *testing.T) {
	for name, relayed := range map[string]func(resp, answer *fasthttp.Response, done callEnd) error{
		"held whole": relayWhole,
		"small":      relaySmall,
	} {
		answer := fasthttp.AcquireResponse()
		answer.SetBodyStream(panicking{}, 100)
		var resp fasthttp.Response
		ended := 0
		func() {
			defer func() { _ = recover() }()
			_ = relayed(&resp, answer, endFunc(func() { ended++ }))
		}()
		if ended != 1 {
			t.Errorf("%s: a read that panicked ended its call %d times, want once", name, ended)
		}
	}
}

// relayWhole reads a stream for an HTTP/1.0 client up to its bound: one
// byte more is a 502 bad_gateway (nothing has been written yet), the
// answer released and its call ended (done) all the same; at the bound it
// is sent, with its length.
func TestRelayWholeBoundsTheStream(t *testing.T) {
	for _, size := range []int{readWholeWithoutLength, readWholeWithoutLength + 1} {
		answer := fasthttp.AcquireResponse()
		answer.SetBodyStream(io.LimitReader(zeros{}, int64(size)), -1)
		var resp fasthttp.Response
		ended := 0
		err := relayWhole(&resp, answer, endFunc(func() { ended++ }))
		if size > readWholeWithoutLength {
			if ae, _ := toAPIError(err); ae != errBadGateway || ended != 1 {
				t.Errorf("%d bytes: error %v, call ended %d times; want a 502 bad_gateway, the call ended once", size, err, ended)
			}
			continue
		}
		if err != nil || resp.Header.ContentLength() != size || ended != 0 {
			t.Errorf("%d bytes: error %v, Content-Length %d, call ended %d times; want the answer with its length, the call going on", size, err, resp.Header.ContentLength(), ended)
		}
		resp.Reset() // closes the stream, as fasthttp once it has written it
		if ended != 1 {
			t.Errorf("%d bytes: call ended %d times once written, want once", size, ended)
		}
	}
}

// A list page read whole (relayWhole, with its length) leaves the gateway
// as the page read into an answer's body did, cheaply: in one write besides
// the headers' buffer, not copied through the connection's write buffer
// (fasthttp's copy of a body stream without WriterTo: a write per 4 KiB
// here, per 4 KiB then 32 KiB on a TCP connection), and from a pooled
// buffer, not 100 KB of garbage a page.
// Each cost the gateway about as much CPU as the rest of the relay
// (BenchmarkGatewaySyncPage: ~290 µs a page against ~95 µs before pages
// were streamed; ~100 µs with both).
func TestAPageReadWholeLeavesInOneWriteFromAPooledBuffer(t *testing.T) {
	page := bytes.Repeat([]byte("x"), 100<<10)
	conn := &countedWrites{}
	conn.kept.Grow(2 * len(page)) // once: what the test keeps is no allocation of the relay's
	relayPage := func() (writes int) {
		answer := fasthttp.AcquireResponse()
		answer.SetBodyStream(bytes.NewReader(page), len(page))
		var resp fasthttp.Response
		ended := 0
		if err := relayWhole(&resp, answer, endFunc(func() { ended++ })); err != nil {
			t.Fatalf("relayWhole: %v", err)
		}
		conn.kept.Reset()
		conn.writes = 0
		w := bufio.NewWriterSize(conn, 4096) // fasthttp's default write buffer
		if err := resp.Write(w); err != nil || w.Flush() != nil {
			t.Fatalf("writing the answer: %v", err)
		}
		if !bytes.HasSuffix(conn.kept.Bytes(), page) || ended != 1 {
			t.Fatalf("the page did not leave whole (%d bytes written), or the call ended %d times", conn.kept.Len(), ended)
		}
		return conn.writes
	}
	if writes := relayPage(); writes > 3 {
		t.Errorf("a 100 KiB page left in %d writes, want at most 3 (headers, the rest of the buffer, the page)", writes)
	}
	if racedetector.Enabled {
		return // under the race detector sync.Pool drops a share of what it is given back: allocations mean nothing
	}
	if perPage := allocatedPerRun(50, func() { relayPage() }); perPage > 32<<10 {
		t.Errorf("relaying a 100 KiB page allocated %d bytes, want a pooled buffer", perPage)
	}
}

// A page of large items (about 5 MB) read whole is not pooled once it has
// left: its buffer would be held for the ordinary pages after it, outside
// heldAnswersLimit's count.
func TestAPageOfLargeItemsLeavesNoBufferPooled(t *testing.T) {
	page := bytes.Repeat([]byte("x"), 5<<20)
	answer := fasthttp.AcquireResponse()
	answer.SetBodyStream(bytes.NewReader(page), len(page))
	var resp fasthttp.Response
	if err := relayWhole(&resp, answer, endFunc(func() {})); err != nil {
		t.Fatalf("relayWhole: %v", err)
	}
	resp.Reset() // closes the stream, as fasthttp once it has written it
	next := pages.Get()
	defer releasePage(next)
	if cap(next.B) > maxPooledPage {
		t.Errorf("the next page's buffer holds %d bytes, want at most %d pooled", cap(next.B), maxPooledPage)
	}
}

// A list page held whole counts, against heldAnswersLimit, the buffer it
// is read into: a pooled one may have been grown by a page of up to
// maxPooledPage, and a smaller page held in it holds all of it. Counted
// by the pages' lengths, 33 pages of 1 KB in buffers of 1 MiB were counted
// 33 KB of the 32 MiB.
func TestAHeldPageCountsTheBufferItIsReadInto(t *testing.T) {
	budget := &byteBudget{limit: 32 << 20}
	grown := func() *bytebufferpool.ByteBuffer {
		return &bytebufferpool.ByteBuffer{B: make([]byte, 0, maxPooledPage)}
	}
	held := 0
	for range 32 {
		page := &heldPageEnd{budget: budget}
		if !page.growTo(grown(), 1000) {
			t.Fatalf("a 1 KB page in a buffer of %d bytes refused with %d held, want it held", maxPooledPage, held)
		}
		held += page.held
	}
	if (&heldPageEnd{budget: budget}).growTo(grown(), 1000) {
		t.Errorf("a 33rd page of 1 KB, each in a buffer of %d bytes, was held: the budget counts %d bytes of %d held",
			maxPooledPage, budget.held, 33*maxPooledPage)
	}
	budget.give(held)
}

// A page larger than its buffer counts what the buffer grows to: its
// length and what the allocation rounds it up to (its size class, or 8 KiB
// pages past 32 KiB). Counted by its length, a page of 100,001 bytes held
// 106,496 and was counted 100,001.
func TestAHeldPageCountsItsBufferOnceGrown(t *testing.T) {
	for _, length := range []int{20_001, 100_001, 5 << 20} {
		budget := &byteBudget{limit: 32 << 20}
		page, held := &bytebufferpool.ByteBuffer{}, &heldPageEnd{budget: budget}
		if !held.growTo(page, length) {
			t.Fatalf("a page of %d bytes in an empty buffer was refused", length)
		}
		if cap(page.B) < length || held.held != cap(page.B) || budget.held != cap(page.B) {
			t.Errorf("a page of %d bytes grew its buffer to %d bytes and counted %d (budget %d), want the buffer's bytes counted",
				length, cap(page.B), held.held, budget.held)
		}
	}
}

// An answer without a length (relayWithoutLength) counts its buffer
// against heldAnswersLimit while it is held, as a list page does, and gives
// it back once it has left: read outside the budget, up to 64 MiB each,
// such answers were bounded by nothing together. While other answers hold
// the budget it is the 503 errAnswersHeldFull, not the service's failure;
// one larger than the whole budget, the 502 of an answer too large.
func TestAnAnswerWithoutALengthIsHeldWithinTheBudget(t *testing.T) {
	const size = 100_000
	g := &Gateway{heldAnswers: &byteBudget{limit: 3 * size}}
	var resp fasthttp.Response
	ended := 0
	if err := g.relayWithoutLength(&resp, lengthless(size), endFunc(func() { ended++ })); err != nil {
		t.Fatalf("an answer of %d bytes without a length: %v, want it relayed", size, err)
	}
	if held := heldBytes(g); held < size || resp.Header.ContentLength() != size {
		t.Errorf("while relayed: %d bytes held, Content-Length %d; want at least %d held, and its length", held, resp.Header.ContentLength(), size)
	}
	var other fasthttp.Response
	err := g.relayWithoutLength(&other, lengthless(2*size), endFunc(func() { ended++ }))
	if ae, _ := toAPIError(err); ae != errAnswersHeldFull || ended != 1 {
		t.Errorf("another while the budget is held: %v, call ended %d times; want errAnswersHeldFull, the call ended", err, ended)
	}
	resp.Reset() // closes the stream, as fasthttp once it has written it
	if ended != 2 || heldBytes(g) != 0 {
		t.Errorf("once both ended: calls ended %d times and %d bytes held; want 2 and none", ended, heldBytes(g))
	}
	err = g.relayWithoutLength(&other, lengthless(3*size), endFunc(func() {}))
	if ae, _ := toAPIError(err); ae != errBadGateway || heldBytes(g) != 0 {
		t.Errorf("an answer as large as the whole budget: %v, %d bytes held; want the 502 bad_gateway, none held", err, heldBytes(g))
	}
	if err := g.relayWithoutLength(&other, lengthless(2*size), endFunc(func() {})); err != nil {
		t.Errorf("an answer of %d bytes with nothing else held: %v, want it relayed", 2*size, err)
	}
	other.Reset()
}

// lengthless is an answer of size bytes without a length, as
// relayWithoutLength reads.
func lengthless(size int) *fasthttp.Response {
	answer := fasthttp.AcquireResponse()
	answer.SetBodyStream(io.LimitReader(zeros{}, int64(size)), -1)
	return answer
}

// An answer without a length read into a pooled buffer that already holds
// more than the answer (a page's, up to maxPooledPage) counts that buffer
// while it is held, as a page with its length does (growTo): counted only
// once it had to grow, a 500 KB answer held in a buffer of 1 MiB was
// counted nothing, and was relayed while other answers held the budget.
func TestAnAnswerWithoutALengthCountsItsPooledBuffer(t *testing.T) {
	budget := &byteBudget{limit: 32 << 20}
	pooled := func() *bytebufferpool.ByteBuffer {
		return &bytebufferpool.ByteBuffer{B: make([]byte, 0, maxPooledPage)}
	}
	var resp fasthttp.Response
	if err := relayWholeInto(&resp, lengthless(500_000), pooled(), &heldPageEnd{budget: budget, then: endFunc(func() {})}); err != nil {
		t.Fatalf("an answer of 500,000 bytes without a length: %v, want it relayed", err)
	}
	if budget.held < maxPooledPage {
		t.Errorf("an answer of 500,000 bytes held in a buffer of %d bytes counted %d, want the buffer counted", maxPooledPage, budget.held)
	}
	resp.Reset() // closes the stream, as fasthttp once it has written it
	if budget.held != 0 {
		t.Errorf("once it has left, %d bytes held, want none", budget.held)
	}
	budget.take(budget.limit - maxPooledPage/2) // other answers'
	err := relayWholeInto(&resp, lengthless(1000), pooled(), &heldPageEnd{budget: budget, then: endFunc(func() {})})
	if ae, _ := toAPIError(err); ae != errAnswersHeldFull {
		t.Errorf("an answer of 1,000 bytes in a buffer of %d bytes with %d of %d bytes held: %v, want errAnswersHeldFull",
			maxPooledPage, budget.held, budget.limit, err)
	}
	resp.Reset()
}

// A pooled buffer larger than the whole budget allows an answer without a
// length (with a budget under maxPooledPage) is not read into: the answer
// is read into a buffer of its own, within the budget.
func TestAnAnswerWithoutALengthLeavesAPooledBufferLargerThanTheBudget(t *testing.T) {
	budget := &byteBudget{limit: 64 << 10}
	page := &bytebufferpool.ByteBuffer{B: make([]byte, 0, maxPooledPage)}
	var resp fasthttp.Response
	if err := relayWholeInto(&resp, lengthless(10_000), page, &heldPageEnd{budget: budget, then: endFunc(func() {})}); err != nil {
		t.Fatalf("an answer of 10,000 bytes without a length within a budget of %d: %v, want it relayed", budget.limit, err)
	}
	if budget.held > budget.limit || budget.held < 10_000 {
		t.Errorf("%d bytes counted for an answer of 10,000 bytes within a budget of %d", budget.held, budget.limit)
	}
	resp.Reset()
}

// readWithoutLength keeps a byte of the budget to tell an answer too large
// from one that fits: within a budget of limit bytes, with nothing else
// held, an answer of limit-1 bytes is relayed with its length, and one of
// limit bytes or more is the 502 of an answer too large, not the 503 of a
// budget others hold; with a budget nearly full, an answer that fits in
// what is left is relayed and a larger one is the 503. None counts more
// than the budget, but for what an allocation rounds up, and every one
// gives back what it held.
func TestAnAnswerWithoutALengthAtTheBudgetsEdges(t *testing.T) {
	const limit = 1 << 20
	for _, c := range []struct {
		name         string
		limit, other int
		size         int
		want         *apiError // nil: relayed
	}{
		{"a byte under the budget", limit, 0, limit - 1, nil},
		{"as large as the budget", limit, 0, limit, errBadGateway},
		{"a byte over the budget", limit, 0, limit + 1, errBadGateway},
		{"far over the budget", limit, 0, 3 * limit, errBadGateway},
		{"empty within a budget of 1", 1, 0, 0, nil},
		{"a byte within a budget of 1", 1, 0, 1, errBadGateway},
		{"within what is left of a budget nearly full", limit, limit - firstReadWithoutLength, firstReadWithoutLength - 1, nil},
		{"past what is left of a budget nearly full", limit, limit - firstReadWithoutLength, firstReadWithoutLength + 1, errAnswersHeldFull},
	} {
		budget := &byteBudget{limit: c.limit, held: c.other}
		ended := 0
		var resp fasthttp.Response
		err := relayWholeInto(&resp, lengthless(c.size), &bytebufferpool.ByteBuffer{}, &heldPageEnd{budget: budget, then: endFunc(func() { ended++ })})
		switch ae, _ := toAPIError(err); {
		case c.want == nil && (err != nil || resp.Header.ContentLength() != c.size):
			t.Errorf("%s: %v, Content-Length %d; want it relayed with %d", c.name, err, resp.Header.ContentLength(), c.size)
		case c.want != nil && ae != c.want:
			t.Errorf("%s: %v, want %s %s", c.name, err, c.want.Code, c.want.Message)
		case budget.held > c.limit+8<<10:
			t.Errorf("%s: %d bytes counted of a budget of %d, want at most what the allocation rounds up past it", c.name, budget.held, c.limit)
		}
		resp.Reset()
		if ended != 1 || budget.held != c.other {
			t.Errorf("%s: once it has ended, the call ended %d times and %d bytes held; want once and the others' %d", c.name, ended, budget.held, c.other)
		}
	}
}

// An answer without a length that breaks off, or whose read panics, after
// its buffer has grown a few times, in a pooled buffer or a new one, gives
// back every byte it counted and ends its call once.
func TestAnAnswerWithoutALengthCutShortGivesBackWhatItHeld(t *testing.T) {
	for name, body := range map[string]func() io.Reader{
		"broken off": func() io.Reader {
			return io.MultiReader(io.LimitReader(zeros{}, 300_000), iotest.ErrReader(io.ErrUnexpectedEOF))
		},
		"panicking": func() io.Reader { return io.MultiReader(io.LimitReader(zeros{}, 300_000), panicking{}) },
	} {
		for _, pooled := range []int{0, 100_000} {
			budget := &byteBudget{limit: 32 << 20, held: 1000}
			answer := fasthttp.AcquireResponse()
			answer.SetBodyStream(body(), -1)
			ended := 0
			var resp fasthttp.Response
			func() {
				defer func() { _ = recover() }()
				page := &bytebufferpool.ByteBuffer{B: make([]byte, 0, pooled)}
				err := relayWholeInto(&resp, answer, page, &heldPageEnd{budget: budget, then: endFunc(func() { ended++ })})
				if ae, _ := toAPIError(err); ae != errBadGateway {
					t.Errorf("%s in a buffer of %d: %v, want the 502 bad_gateway", name, pooled, err)
				}
			}()
			if ended != 1 || budget.held != 1000 {
				t.Errorf("%s in a buffer of %d: the call ended %d times, %d bytes held; want once and the others' 1000", name, pooled, ended, budget.held)
			}
		}
	}
}

// A buffer grown from one that holds something (a pooled page's, or the
// one an answer without a length doubles as it fills) grows to what it
// must hold, rounded up to its size class alone (at most 8 KiB past 32
// KiB), not by append's steps of a quarter past 256 bytes: grown so, a
// buffer of 20 MiB asked to hold 32 MiB became 39 MiB, 7 MiB counted past
// a budget of 32 MiB, and one of 100,000 bytes asked to hold 150,000 became
// 163,840.
func TestAHeldBufferGrowsToWhatItMustHold(t *testing.T) {
	for _, c := range []struct{ from, to int }{{4 << 10, 8 << 10}, {100_000, 150_000}, {1 << 20, 2 << 20}, {20 << 20, 32 << 20}} {
		budget := &byteBudget{limit: 32 << 20}
		page, held := &bytebufferpool.ByteBuffer{B: make([]byte, c.from)}, &heldPageEnd{budget: budget}
		if !held.growTo(page, c.to) {
			t.Fatalf("a buffer of %d bytes grown to %d refused", c.from, c.to)
		}
		if cap(page.B) < c.to || cap(page.B) >= c.to+8<<10 || budget.held != cap(page.B) || len(page.B) != c.from {
			t.Errorf("a buffer of %d bytes grown to hold %d: %d bytes (%d of them kept), %d counted; want at most 8 KiB more, counted, its bytes kept",
				c.from, c.to, cap(page.B), len(page.B), budget.held)
		}
	}
}

// relayWhole relays answer read whole, as relayAnswer does a list page,
// within a budget that holds anything.
func relayWhole(resp, answer *fasthttp.Response, done callEnd) error {
	return relayWholeInto(resp, answer, pages.Get(), &heldPageEnd{budget: &byteBudget{limit: math.MaxInt}, then: done})
}

// countedWrites is a connection that keeps what is written and counts the
// writes. It has no ReadFrom (bytes.Buffer's is not promoted), through
// which bufio would hand it the rest of a stream uncounted.
type countedWrites struct {
	kept   bytes.Buffer
	writes int
}

func (c *countedWrites) Write(p []byte) (int, error) {
	c.writes++
	return c.kept.Write(p)
}

// The WARN of a proxy header entry that is no address is said again a
// minute later while it keeps happening, counting the entries held back
// in between: said once per process, a trusted client that sent junk once
// (here "x") used it up, and the misconfiguration that followed (a header
// of the scheme, "https" on every request) was never said.
func TestAProxyHeaderThatIsNoAddressIsSaidAgainAMinuteLater(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	g, logs := startWithHook(t, map[string]string{"GATEWAY_PROXY_HEADER": "X-Client-Scheme", "GATEWAY_TRUSTED_PROXIES": "127.0.0.1"},
		func(g *Gateway) { g.notAnAddressLog.Now = func() time.Time { return time.Unix(0, now.Load()) } })
	health := func(scheme string) {
		t.Helper()
		if resp, _ := get(t, "http://"+g.Addr()+"/v1/health", map[string]string{"X-Client-Scheme": scheme}); resp.StatusCode != 200 {
			t.Fatalf("GET /v1/health = %d, want 200", resp.StatusCode)
		}
	}
	health("x")
	now.Add(int64(20 * time.Second))
	health("https")
	health("https")
	now.Add(int64(41 * time.Second))
	health("https")

	type warning struct {
		Level   string `json:"level"`
		Proxy   string `json:"proxy"`
		Entry   string `json:"entry"`
		Skipped int    `json:"skipped_since_last"`
	}
	var warnings []warning
	for line := range strings.Lines(logs.String()) {
		if !strings.Contains(line, `"setting":"GATEWAY_PROXY_HEADER"`) {
			continue
		}
		var w warning
		if err := json.Unmarshal([]byte(line), &w); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		warnings = append(warnings, w)
	}
	want := []warning{
		{Level: "WARN", Proxy: "127.0.0.1", Entry: "1 bytes: letters", Skipped: 0},
		{Level: "WARN", Proxy: "127.0.0.1", Entry: "5 bytes: letters", Skipped: 2},
	}
	if !slices.Equal(warnings, want) {
		t.Errorf("warnings naming GATEWAY_PROXY_HEADER = %+v, want %+v: the first entry, then a minute later the one seen then with the 2 held back", warnings, want)
	}
	if strings.Contains(logs.String(), "https") {
		t.Errorf("the logs quote the header's value:\n%s", logs)
	}
}

// An address's keys in lookup at once are bounded by what its guess
// budget has left, where the requests of one key share its lookup and its
// place (a platform's workers on a key not yet cached), and a lookup that
// ended while the budget was read counts still: its failure may have
// reached the budget after the read.
func TestGuessLookupsShareAKeysPlaceAndCountThoseEndedDuringARead(t *testing.T) {
	var l guessLookups
	left := func(n int64) ratelimit.Decision { return ratelimit.Decision{Allowed: n > 0, Remaining: n} }
	acquire := func(address, secret string, d ratelimit.Decision) bool {
		return l.acquire(address, secret, l.peeking(address), d)
	}
	for i := range 3 {
		if !acquire("a", "k1", left(2)) {
			t.Fatalf("request %d of one key on a budget of 2 refused; want them to share its lookup", i+1)
		}
	}
	if !acquire("a", "k2", left(2)) {
		t.Fatal("a second key on a budget of 2 refused")
	}
	if acquire("a", "k3", left(2)) {
		t.Fatal("a third key on a budget of 2 taken; want it refused")
	}
	if !acquire("b", "k3", left(2)) {
		t.Fatal("another address's key refused: want each address counted apart")
	}
	if acquire("a", "k1", left(0)) {
		t.Fatal("a key in lookup joined on a spent budget; want it refused")
	}
	// k2's lookup ends while a read of the budget is under way (the read
	// sent before its failure was taken): the read's 2 left still counts it.
	since := l.peeking("a")
	l.release("a", "k2")
	if l.acquire("a", "k4", since, left(2)) {
		t.Fatal("a key taken on a read sent before a lookup's end, counting it as ended; want it refused")
	}
	if !acquire("a", "k4", left(2)) {
		t.Fatal("a key refused on a read sent after the lookup's end")
	}
	for range 3 {
		l.release("a", "k1")
	}
	l.release("a", "k4")
	l.release("b", "k3")
	if len(l.address) != 0 {
		t.Errorf("addresses kept with nothing under way: %v", l.address)
	}
}

// heldKeys holds each lookup of key that its budget allows until told to
// go on (one per value sent on proceed), then refuses it as unknown; any
// other key is refused at once.
type heldKeys struct {
	key     string
	arrived chan struct{}
	proceed chan struct{}
}

func (h heldKeys) Lookup(_ context.Context, secret string, mayFetch func() bool) (keystore.Key, error) {
	if secret != h.key {
		return keystore.Key{}, keystore.ErrUnknownKey
	}
	if !mayFetch() {
		return keystore.Key{}, keystore.ErrThrottled
	}
	h.arrived <- struct{}{}
	<-h.proceed
	return keystore.Key{}, keystore.ErrUnknownKey
}

func (heldKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

// A key's place among its address's lookups outlives the request that took
// it when another request of the key still waits on the lookup: what names
// the place must not be that request's header. With Immutable off
// (app.go), c.Get's string is the request's buffer, which fasthttp fills
// with the connection's next request once the handler returns; kept as the
// map's key, the place could no longer be found, the last request's
// release counted a new one down to -1 instead, and the address kept both
// for good (each such pair one place fewer, for as long as the gateway
// ran; with what the buffer held next, other keys included, in memory).
func TestGuessLookupsOutliveTheHeaderThatNamedThem(t *testing.T) {
	keys := heldKeys{key: wellFormedKey(t), arrived: make(chan struct{}), proceed: make(chan struct{})}
	g, _, _ := startInternal(t, map[string]string{"RATE_LIMIT_AUTH_FAILURES": "60-M"}, keys)
	url := "http://" + g.Addr() + "/v1/export/items"
	// Two connections, each kept alive: one per request of the key.
	clients := [2]*http.Client{{Transport: &http.Transport{}}, {Transport: &http.Transport{}}}
	send := func(c *http.Client, key string) int {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := c.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // the status is what counts
		resp.Body.Close()
		return resp.StatusCode
	}
	done := [2]chan int{make(chan int, 1), make(chan int, 1)}
	for i := range clients {
		go func() { done[i] <- send(clients[i], keys.key) }()
		<-keys.arrived
	}
	keys.proceed <- struct{}{}
	var first int
	select {
	case <-done[0]:
	case <-done[1]:
		first = 1
	}
	// The first one's connection carries another key, of the same length,
	// while the other request of the key still waits on its lookup.
	if status := send(clients[first], wellFormedKey(t)); status != http.StatusUnauthorized {
		t.Errorf("another key = %d, want 401", status)
	}
	keys.proceed <- struct{}{}
	<-done[1-first]
	g.guessLookups.mu.Lock()
	defer g.guessLookups.mu.Unlock()
	if a := g.guessLookups.address["127.0.0.1"]; a != nil {
		t.Errorf("the address keeps %d keys in lookup with none under way", len(a.keys))
	}
}

// panicAfterBudgetKeys takes its budget's place, then panics.
type panicAfterBudgetKeys struct{}

func (panicAfterBudgetKeys) Lookup(_ context.Context, _ string, mayFetch func() bool) (keystore.Key, error) {
	mayFetch()
	panic("boom after the budget was asked")
}

func (panicAfterBudgetKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

// A lookup that panics once its budget gave it a place among its address's
// keys in lookup gives the place back: kept, each such panic would leave
// the address one place fewer for as long as the gateway ran.
func TestALookupThatPanicsGivesItsPlaceBack(t *testing.T) {
	g, _, _ := startInternal(t, nil, panicAfterBudgetKeys{})
	resp, env := get(t, "http://"+g.Addr()+"/v1/export/items", map[string]string{"X-API-Key": wellFormedKey(t)})
	if resp.StatusCode != 500 || env.Error == nil || env.Error.Code != "internal_error" {
		t.Fatalf("GET with a lookup panicking = %d %+v, want 500 internal_error", resp.StatusCode, env.Error)
	}
	g.guessLookups.mu.Lock()
	defer g.guessLookups.mu.Unlock()
	if a := g.guessLookups.address["127.0.0.1"]; a != nil {
		t.Errorf("the address keeps %d keys in lookup after the lookup panicked", len(a.keys))
	}
}

// A 408 on a new connection is timed from the connection's start in its
// server span too, as its access line is: the span began when the answer
// did, and `make trace` showed a fraction of a millisecond for a request
// whose client had held the connection for the whole read timeout, beside
// a log line of 3 s for the same request id.
func TestRequestTimeoutsSpanIsTimedFromTheConnectionsStart(t *testing.T) {
	g, sr, _ := startInternal(t, map[string]string{"GATEWAY_READ_TIMEOUT": "300ms"}, fakeKeys{})
	resp := UnfinishedRequestAnswer(t, g.Addr())
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("an unfinished request = %d, want 408", resp.StatusCode)
	}
	var server sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(5 * time.Second); server == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, s := range sr.Ended() {
			if s.SpanKind() == trace.SpanKindServer && s.SpanContext().TraceID().String() == resp.Header.Get("X-Request-Id") {
				server = s
			}
		}
	}
	if server == nil {
		t.Fatal("no server span of the 408")
	}
	if took := server.EndTime().Sub(server.StartTime()); took < 300*time.Millisecond {
		t.Errorf("server span of the 408 lasted %v, want at least the 300 ms read timeout its client held the connection", took)
	}
}

// postConfirm sends, as a client would, a confirm of coin-1 under
// Idempotency-Key k1 to the gateway at addr, and returns the answer and
// its envelope (err: it was none).
func postConfirm(t *testing.T, addr string) (*http.Response, envelope.Parsed, error) {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+"/v1/export/items/coin-1/sales/confirm", strings.NewReader(`{"external_order_id":"o"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", wellFormedKey(t))
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var answer envelope.Parsed
	err = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	return resp, answer, err
}

// Every way relayAnswer relays an answer ends its call exactly once, on the
// list and item routes (StreamsLargeAnswers) and shop-schema's, for a
// client of HTTP/1.1 and of 1.0: at once for one read into the client's
// answer or one that failed, once fasthttp closes the stream for one
// handed to it (after its write, or at the response's reset), and the
// bytes of a page held whole come back. A call ended twice gives back a
// slot of another call of the same owner (inFlightSlots.release forgets a
// count at 0), which the end-to-end tests, looking at the slots left
// (TestEveryEndingOfAnItemGivesBackItsConnection), do not see.
func TestEveryRelayOfAnAnswerEndsItsCallOnce(t *testing.T) {
	const held = 100_000 // past smallAnswerBytes
	stream := func(size, length int) func() *fasthttp.Response {
		return func() *fasthttp.Response {
			answer := fasthttp.AcquireResponse()
			answer.SetBodyStream(io.LimitReader(zeros{}, int64(size)), length)
			return answer
		}
	}
	whole := func() *fasthttp.Response {
		answer := fasthttp.AcquireResponse()
		answer.SetBody([]byte(`{"data":[]}`))
		return answer
	}
	for _, c := range []struct {
		name         string
		streams      bool // the route StreamsLargeAnswers
		http11       bool
		budget       int
		answer       func() *fasthttp.Response
		failed       bool // the read fails: the error to answer
		endedAtFirst int  // before fasthttp closes the client's stream
	}{
		{"item read whole by Do (a HEAD's)", true, true, heldAnswersLimit, whole, false, 1},
		{"small item", true, true, heldAnswersLimit, stream(2000, 2000), false, 1},
		{"small item broken off", true, true, heldAnswersLimit, stream(1000, 2000), true, 1},
		{"page held whole", true, true, heldAnswersLimit, stream(held, held), false, 0},
		{"page held whole broken off", true, true, heldAnswersLimit, stream(held-1, held), true, 1},
		{"page past the budget", true, true, held - 1, stream(held, held), false, 0},
		{"page without a length", true, true, heldAnswersLimit, stream(held, -1), false, 0},
		{"page without a length, HTTP/1.0", true, false, heldAnswersLimit, stream(held, -1), false, 0},
		{"page without a length past the budget", true, true, held, stream(held, -1), true, 1},
		{"shop schema", false, true, heldAnswersLimit, stream(held, held), false, 0},
		{"shop schema without a length", false, true, heldAnswersLimit, stream(held, -1), false, 0},
		{"shop schema without a length, HTTP/1.0", false, false, heldAnswersLimit, stream(held, -1), false, 0},
		{"shop schema without a length, HTTP/1.0, past the budget", false, false, held, stream(held, -1), true, 1},
		{"shop schema read whole by Do", false, true, heldAnswersLimit, whole, false, 1},
	} {
		g := &Gateway{heldAnswers: &byteBudget{limit: c.budget}}
		var resp fasthttp.Response
		ended := 0
		err := g.relayAnswer(&resp, route{StreamsLargeAnswers: c.streams}, "", c.http11, c.answer(), endFunc(func() { ended++ }))
		if (err != nil) != c.failed || ended != c.endedAtFirst {
			t.Errorf("%s: error %v, call ended %d times; want failed %v, ended %d times", c.name, err, ended, c.failed, c.endedAtFirst)
			continue
		}
		if err == nil {
			_ = resp.BodyWriteTo(io.Discard) // fasthttp writes it to the client
		}
		resp.Reset() // closes the stream, as fasthttp once it has written it
		if ended != 1 || heldBytes(g) != 0 {
			t.Errorf("%s: once relayed, call ended %d times and %d bytes held; want once and none", c.name, ended, heldBytes(g))
		}
	}
}

// The relay of every answer that is not a failure costs no allocation of
// its own: the check that keeps the gateway's own errAnswersHeldFull off
// the instance's count, with errors.As's target declared for every answer,
// cost each GET by id and list page one (BenchmarkGateway: 15 allocs/op,
// 14 without).
func TestARelayThatDidNotFailAllocatesNothing(t *testing.T) {
	g, span := &Gateway{}, trace.SpanFromContext(context.Background())
	if n := testing.AllocsPerRun(100, func() { _ = g.countRelayFailure(upstreamExportReader, "i", span, nil) }); n != 0 {
		t.Errorf("a relay that did not fail: %v allocations, want none", n)
	}
}
