package edge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coinexport/export/gateway/keystore"
	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/saleclaim"
	"github.com/coinexport/export/pkg/testenv"
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
func (fakeKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

func (panicKeys) Known(string) (keystore.Key, bool) { return keystore.Key{}, false }

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
func startWithHook(t testing.TB, env map[string]string, hook func(*Gateway)) (*Gateway, *testenv.Output) {
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

func wellFormedKey(t testing.TB) string {
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

// Every Redis round trip in a request's trace is one a "rate limit" span
// of that request links to. An unknown or malformed key's 401 is taken
// from two budgets, the address's guesses and its failures, and the first
// was charged untraced: its round trip, a "rate limit batch" child of the
// server span, was in the trace with nothing waiting on it (seen on a
// live stack as a batch span no "rate limit" span linked to).
func TestEveryRoundTripOfATraceIsOneARateLimitSpanWaitedOn(t *testing.T) {
	for _, tt := range []struct {
		cause error
		key   string
	}{{keystore.ErrUnknownKey, wellFormedKey(t)}, {keystore.ErrMalformedKey, "cxr_nope"}} {
		t.Run(tt.cause.Error(), func(t *testing.T) { checkEveryRoundTripIsWaitedOn(t, tt.cause, tt.key) })
	}
}

func checkEveryRoundTripIsWaitedOn(t *testing.T, cause error, key string) {
	g, sr, _ := startInternal(t, nil, refusingKeys{cause})
	resp, env := get(t, "http://"+g.Addr()+"/v1/export/items", map[string]string{"X-API-Key": key})
	if resp.StatusCode != 401 {
		t.Fatalf("GET = %d %+v, want 401", resp.StatusCode, env.Error)
	}
	requestID := resp.Header.Get("X-Request-Id")
	linked := map[trace.SpanID]string{}
	var batches []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.SpanContext().TraceID().String() != requestID {
			continue
		}
		switch s.Name() {
		case "rate limit batch":
			batches = append(batches, s)
		case "rate limit":
			for _, l := range s.Links() {
				linked[l.SpanContext.SpanID()] = attrOf(s, "app.rate_limit.class")
			}
		}
	}
	if len(batches) == 0 {
		t.Fatal(`no "rate limit batch" span in the trace: the budgets' leases came from memory?`)
	}
	classes := map[string]bool{}
	for _, b := range batches {
		class, ok := linked[b.SpanContext().SpanID()]
		if !ok {
			t.Errorf(`"rate limit batch" span %s: no "rate limit" span of the trace links to it`, b.SpanContext().SpanID())
		}
		classes[class] = true
	}
	for _, want := range []string{guessBudget, classAuthFailures} {
		if !classes[want] {
			t.Errorf(`no "rate limit" span of class %s links to a round trip (classes: %v)`, want, classes)
		}
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

// shop-schema's calls are signed with SHOP_SCHEMA_IDENTITY_SECRET, or,
// unset, with IDENTITY_SECRET (a gateway upgraded without it goes on as
// before); set, it is a secret by IDENTITY_SECRET's rules, not
// IDENTITY_SECRET's value, and never quoted in an error or the start-up
// log.
func TestShopSchemaIdentitySecret(t *testing.T) {
	const own = "internal-test-shop-schema-identity-secret-0123456789"
	load := func(shopSchema string) (Config, error) {
		env := map[string]string{"DATABASE_URL": "postgres://db/x", "IDENTITY_SECRET": testSecret, "SHOP_SCHEMA_IDENTITY_SECRET": shopSchema}
		return LoadConfig(func(k string) string { return env[k] })
	}
	for _, tt := range []struct{ set, signs string }{{"", testSecret}, {own, own}} {
		cfg, err := load(tt.set)
		if err != nil {
			t.Fatalf("LoadConfig(SHOP_SCHEMA_IDENTITY_SECRET=%q) error = %v", tt.set, err)
		}
		if got := cfg.ShopSchemaSigningSecret(); got != tt.signs {
			t.Errorf("LoadConfig(SHOP_SCHEMA_IDENTITY_SECRET=%q).ShopSchemaSigningSecret() = %q, want %q", tt.set, got, tt.signs)
		}
		if logged := fmt.Sprint(cfg.LogValue()); strings.Contains(logged, own) || strings.Contains(logged, testSecret) {
			t.Errorf("the start-up log shows a secret: %s", logged)
		}
	}
	for _, tt := range []struct{ value, want string }{
		{testSecret, "must differ from IDENTITY_SECRET"},
		{"short-secret", "at least 32 bytes"},
		{strings.Repeat("ab", 20), "at least 8 different bytes"},
		{own + ",", "nor hold a comma"},
	} {
		_, err := load(tt.value)
		if err == nil || !strings.Contains(err.Error(), "SHOP_SCHEMA_IDENTITY_SECRET must") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("LoadConfig(SHOP_SCHEMA_IDENTITY_SECRET=%q) error = %v, want one saying it %s", tt.value, err, tt.want)
		} else if strings.Contains(err.Error(), tt.value) {
			t.Errorf("LoadConfig(SHOP_SCHEMA_IDENTITY_SECRET=%q) error = %v quotes the value", tt.value, err)
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
		// Past what Redis's script counts exactly (maxRateLimit).
		"RATE_LIMIT_AUTH_FAILURES": "9223372036854775807-M", "RATE_LIMIT_ANONYMOUS": "1000000000001-S",
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

// The largest limit a rate may be set to (maxRateLimit) is counted
// exactly: an unknown key is looked up and refused 401, its address's
// failure budget showing one spent, and a known key's budget one spent per
// request. At 2^63-1, which start took, every decision read none
// remaining: every key not in the cache, valid or not, was refused 429.
func TestTheLargestRateLimitIsCountedExactly(t *testing.T) {
	largest := strconv.FormatInt(maxRateLimit, 10)
	g, _ := startWithHook(t, map[string]string{"RATE_LIMIT_AUTH_FAILURES": largest + "-M"}, nil)
	for spent := range int64(2) {
		resp, _ := get(t, "http://"+g.Addr()+"/v1/export/items", map[string]string{"X-API-Key": wellFormedKey(t)})
		if want := strconv.FormatInt(maxRateLimit-spent-1, 10); resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Errorf("an unknown key at RATE_LIMIT_AUTH_FAILURES=%s-M = %d, X-RateLimit-Remaining %s; want 401, %s",
				largest, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), want)
		}
	}
	g, _, _ = startInternal(t, map[string]string{"RATE_LIMIT_EXPORT_READ": largest + "-S"}, fakeKeys{})
	for spent := range int64(2) {
		resp, _ := get(t, "http://"+g.Addr()+"/v1/export/items/a1", map[string]string{"X-API-Key": wellFormedKey(t)})
		if want := strconv.FormatInt(maxRateLimit-spent-1, 10); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Errorf("a GET at RATE_LIMIT_EXPORT_READ=%s-S = %d, X-RateLimit-Remaining %s; want 200, %s",
				largest, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), want)
		}
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

// An answer whose status is outside HTTP's 200-599 (fasthttp reads any
// three digits, and reads past 1xx but 101) is the instance's failure, a
// 502 envelope, as RFC 9110 15 says a client treats it: relayed, "001"
// reached the client as the status line "HTTP/1.1 1 ..." that its HTTP
// client refused (FuzzRelay), and a 101 told it the connection had
// switched protocols. A "000", which fasthttp reads as 200, was relayed
// as a 200.
func TestAnAnswerWithAStatusOutsideHTTPsRangeIsA502(t *testing.T) {
	var status atomic.Value
	upstream := testenv.ServeConns(t, func(conn net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
			return
		}
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 %s X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", status.Load())
	})
	g, _ := startWithHook(t, map[string]string{"EXPORT_READER_URLS": "http://" + upstream, "SALES_WRITER_URLS": "http://" + upstream},
		func(g *Gateway) { g.keys = relayKeys{} })
	for _, code := range []string{"000", "001", "099", "101", "600", "999"} {
		status.Store(code)
		for _, rt := range relayRoutes[:3] {
			got, err := callRelayed(g.Addr(), wellFormedKey(t), rt.method, rt.target, readWhole11, nil, nil)
			if err != nil || got.status != 502 || !strings.Contains(string(got.body), `"bad_gateway"`) {
				t.Errorf("%s %s, the instance answering %s: %+v (%v), want 502 bad_gateway", rt.method, rt.target, code, got, err)
			}
		}
	}
	status.Store("599")
	if got, err := callRelayed(g.Addr(), wellFormedKey(t), "GET", "/v1/export/items/a1", readWhole11, nil, nil); err != nil || got.status != 599 {
		t.Errorf("the instance answering 599: %+v (%v), want it relayed", got, err)
	}
}

// userInfoSent looks for user info where fasthttp's URI parse takes the
// authority from (the Host header, or the target's): for user info it can
// read, exactly when it reads a user name.
func TestUserInfoSentIsWhereFasthttpReadsIt(t *testing.T) {
	for _, tt := range []struct{ target, host string }{
		{"/v1/a", "u@gw"}, {"/v1/a", "gw"}, {"/v1/a@b", "gw"}, {"http://u@gw/v1/a", "gw"}, {"http://gw/v1/a", "u@gw"},
		{"//u@gw/v1/a", "gw"}, {"//gw/v1/a", "u@gw"}, {"http://gw/v1/a?x=u@y", "gw"}, {"http://gw?u@y", "gw"},
		{"http://gw#u@y", "gw"}, {"http://u:p@gw", "gw"}, {"*", "u@gw"}, {"http://u@gw/v1/a", ""}, {"//u@gw/v1/a", ""},
		{"a/b://c@d/x", "gw"}, {"a/b://c/x", "u@gw"}, {"/a://u@b", "gw"},
	} {
		var req fasthttp.Request
		req.Header.SetRequestURI(tt.target)
		req.Header.SetHost(tt.host)
		want := len(req.URI().Username()) > 0
		if _, got := userInfoSent(&req.Header); got != want {
			t.Errorf("target %q, Host %q: userInfoSent = %v, fasthttp reads user %q", tt.target, tt.host, got, req.URI().Username())
		}
	}
}

// The connection an instance answered 101 Switching Protocols on (or an
// interim 100 then 101) no longer speaks HTTP, and is not used again:
// kept, the bytes the instance sent after the 101 (here a whole second
// answer, sent once the first call had its 502) were the answer the next
// call through it got. One connection per instance, so that a connection
// kept would be the one the next call takes.
func TestAConnectionAnswered101IsNotUsedAgain(t *testing.T) {
	for _, first := range []string{
		"HTTP/1.1 101 Switching Protocols\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
	} {
		answeredFirst := make(chan struct{})
		switched, leftOver := make(chan net.Conn, 1), make(chan struct{})
		var calls atomic.Int64
		upstream := testenv.ServeConns(t, func(conn net.Conn) {
			r := bufio.NewReader(conn)
			for {
				req, err := http.ReadRequest(r)
				if err != nil {
					return
				}
				answer := answerOf("HTTP/1.1 200 OK", []string{"Content-Length: 19"}, `{"data":"fresh"}`+"\n\n\n")
				if req.URL.Path != "/healthz" && calls.Add(1) == 1 {
					answer = []byte(first)
					switched <- conn
				}
				if _, err := conn.Write(answer); err != nil {
					return
				}
			}
		})
		go func() { // the second answer, after the 101, once the first call had its 502
			conn := <-switched
			<-answeredFirst
			_, _ = conn.Write(answerOf("HTTP/1.1 200 OK", []string{"Content-Length: 21"}, `{"data":"left over"}`+"\n"))
			close(leftOver)
		}()
		g, _ := startWithHook(t, map[string]string{"EXPORT_READER_URLS": "http://" + upstream, "UPSTREAM_MAX_CONNS": "1"},
			func(g *Gateway) { g.keys = relayKeys{} })
		got, err := callRelayed(g.Addr(), wellFormedKey(t), "GET", "/v1/export/items/coin-1", readWhole11, nil, nil)
		if err != nil || got.status != 502 {
			t.Fatalf("the instance answering %q: %+v (%v), want 502", first, got, err)
		}
		close(answeredFirst)
		<-leftOver
		got, err = callRelayed(g.Addr(), wellFormedKey(t), "GET", "/v1/export/items/coin-1", readWhole11, nil, nil)
		if err != nil || got.status != 200 || !strings.Contains(string(got.body), "fresh") {
			t.Errorf("the call after the instance answered %q: %d %q (%v), want the instance's next answer, 200 fresh",
				first, got.status, got.body, err)
		}
	}
}

// The statuses the services answer are relayed as they were before the
// 200-599 check, also after interim 1xx answers of the instance's
// (fasthttp's client reads past them: the check sees the final status),
// to a client that sent its sale with "Expect: 100-continue" (the
// gateway's own 100 Continue, then the instance's final answer). The
// instance is not sent Expect (not a forwarded header).
func TestServicesStatusesAreRelayedAfterInterimAnswers(t *testing.T) {
	var status atomic.Value
	var expectSent atomic.Bool
	upstream := testenv.ServeConns(t, func(conn net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		expectSent.Store(expectSent.Load() || req.Header.Get("Expect") != "")
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"+
			"HTTP/1.1 %s X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status.Load())
	})
	g, _ := startWithHook(t, map[string]string{"SALES_WRITER_URLS": "http://" + upstream},
		func(g *Gateway) { g.keys = relayKeys{} })
	body := `{"external_order_id":"o"}`
	for _, code := range []string{"200", "201", "204", "304", "400", "404", "409", "422", "429", "500", "503", "504"} {
		status.Store(code)
		conn, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = fmt.Fprintf(conn, "POST /v1/export/items/coin-1/sales/confirm HTTP/1.1\r\nHost: gateway\r\nX-API-Key: %s\r\n"+
			"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
			wellFormedKey(t), len(body))
		r := bufio.NewReader(conn)
		interim, err := http.ReadResponse(r, nil)
		if err != nil || interim.StatusCode != http.StatusContinue {
			t.Fatalf("the instance to answer %s: the gateway's first answer %v (%v), want 100 Continue", code, interim, err)
		}
		_, _ = io.WriteString(conn, body)
		final, err := http.ReadResponse(r, &http.Request{Method: "POST"})
		switch {
		case err != nil:
			t.Errorf("the instance answering 100, 103, then %s: reading the client's answer: %v", code, err)
		case strconv.Itoa(final.StatusCode) != code:
			t.Errorf("the instance answering 100, 103, then %s: the client got %s, want %s relayed", code, final.Status, code)
		}
		conn.Close()
	}
	if expectSent.Load() {
		t.Error("the instance was sent Expect")
	}
}

// An answer read whole in the gateway that its instance breaks off after
// its head fails its proxy span, as one that fails before its head does:
// the span covers the read, which for an item once happened in upstream.Do.
// Ended at the head, an item broken off showed a proxy span of 200 and no
// error under its client's 502. The failure's kind is the span's error.type
// too, which a search for failed calls reads; it was only the status's
// description.
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
		if s.Name() == "proxy export-reader" && s.Status().Code == codes.Error && s.Status().Description == "bad_response" &&
			attrOf(s, "error.type") == "bad_response" {
			failed++
		}
	}
	if failed != 2 {
		t.Errorf("%d proxy spans failed bad_response with that error.type, want 2 (an item, a list page held whole)", failed)
	}
}

// A service's 5xx relayed to its client fails the proxy span, as the
// client span of OpenTelemetry's HTTP conventions does, with error.type the
// status; a 4xx leaves it unset, as the server spans around it do (gateway
// README, "Request id and traces"). The proxy span said nothing of a 500
// under the gateway's and the service's failed server spans.
func TestARelayed5xxFailsTheProxySpanAndA4xxDoesNot(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, err := strconv.Atoi(path.Base(r.URL.Path))
		if err != nil { // the health probe's /healthz
			status = 200
		}
		envelope.WriteError(w, status, "some_code", "as the test asks", "")
	}))
	t.Cleanup(upstream.Close)
	g, sr, _ := startInternal(t, map[string]string{"EXPORT_READER_URLS": upstream.URL}, fakeKeys{})
	for _, tt := range []struct {
		status    int
		wantError bool
	}{{404, false}, {409, false}, {500, true}, {503, true}} {
		url := "http://" + g.Addr() + "/v1/export/items/" + strconv.Itoa(tt.status)
		resp, env := get(t, url, map[string]string{"X-API-Key": wellFormedKey(t)})
		if resp.StatusCode != tt.status {
			t.Fatalf("GET of an item the service answers %d = %d %+v, want it relayed", tt.status, resp.StatusCode, env.Error)
		}
		var proxySpan sdktrace.ReadOnlySpan
		for _, s := range sr.Ended() {
			if s.Name() == "proxy export-reader" && s.SpanContext().TraceID().String() == resp.Header.Get("X-Request-Id") {
				proxySpan = s
			}
		}
		want := sdktrace.Status{Code: codes.Unset}
		wantType := ""
		if tt.wantError {
			want = sdktrace.Status{Code: codes.Error, Description: strconv.Itoa(tt.status)}
			wantType = strconv.Itoa(tt.status)
		}
		switch {
		case proxySpan == nil:
			t.Errorf("%d: no proxy span in the request's trace", tt.status)
		case proxySpan.Status() != want || attrOf(proxySpan, "error.type") != wantType:
			t.Errorf("%d relayed: proxy span status %+v, error.type %q; want %+v, %q",
				tt.status, proxySpan.Status(), attrOf(proxySpan, "error.type"), want, wantType)
		}
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

// A path no route has is the client's guess, recorded (access line, span)
// to show what it called; a secret it put there is not: a sale module
// that sent its shop's ws_key in the path of the schema route had it in
// the gateway's log and trace store of a live stack. A segment with 32
// letters or digits in a row (a PrestaShop key's length; an API key's
// secret without its tag has 49) is hidden, also %-encoded, once or
// twice; an item id of that shape on the item route, which is no guess,
// is recorded as sent.
func TestUnmatchedPathHidesASecretLikeSegment(t *testing.T) {
	g, sr, logs := startInternal(t, nil, fakeKeys{})
	wsKey := "ZQXWSK7J9M2P4R6T8V1N3B5C7D9F2H4K"
	untagged := wellFormedKey(t)[4:]
	escaped, twice := "", "" // twice: a client that escaped the escapes
	for i := range len(wsKey) {
		escaped += fmt.Sprintf("%%%02X", wsKey[i])
		twice += fmt.Sprintf("%%25%02X", wsKey[i])
	}
	for path, want := range map[string]int{
		"/v1/sync/prestashop/schema/" + wsKey:               404,
		"/v1/" + strings.ToLower(wsKey):                     404,
		"/v1/sync/prestashop/schema/ws_key=" + wsKey + "/x": 404,
		"/v1/nope/" + escaped:                               404,
		"/v1/nope/" + twice:                                 404,
		"/v1/nope/" + untagged:                              404,
	} {
		resp, _ := get(t, "http://"+g.Addr()+path, nil)
		if resp.StatusCode != want {
			t.Errorf("GET %.30s… = %d, want %d", path, resp.StatusCode, want)
		}
	}
	itemID := "coin1980silver0000000000000000ab"
	get(t, "http://"+g.Addr()+"/v1/export/items/"+itemID, map[string]string{"X-API-Key": wellFormedKey(t)})
	var recorded strings.Builder
	itemPathKept := false
	for _, s := range sr.Ended() {
		for _, a := range s.Attributes() {
			recorded.WriteString(a.Value.String() + "|")
			itemPathKept = itemPathKept || a.Key == "url.path" && a.Value.AsString() == "/v1/export/items/"+itemID
		}
	}
	recorded.WriteString(logs.String())
	all := strings.ToLower(recorded.String())
	for _, secret := range []string{wsKey[:16], wsKey[16:], escaped[:48], twice[:80], untagged[:16], untagged[16:32]} {
		if strings.Contains(all, strings.ToLower(secret)) {
			t.Errorf("spans or logs hold %q", secret)
		}
	}
	if !itemPathKept {
		t.Error("the item route's url.path lost its 32-character id: only an unmatched path is the client's guess")
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
		// A field name is a token (RFC 9110 5.1): fasthttp refuses a space
		// before the colon, but takes one inside a name.
		{"Transfer Encoding", "Host: g\r\nTransfer Encoding: chunked\r\n\r\n", errSpaceInFieldName},
		{"Content Length", "Host: g\r\nContent Length: 0\r\n\r\n", errSpaceInFieldName},
		{"X-API Key", "Host: g\r\nX-API Key: k\r\n\r\n", errSpaceInFieldName},
		{"a space inside another name", "Host: g\r\nidempotency key: k\r\n\r\n", errSpaceInFieldName},
		{"spaces in values", "Host: g\r\nUser-Agent: a b c\r\nX-A:  b\t\r\n\r\n", nil},
		{"spaces in values that follow no space", "Host: g\r\nX-A:b c\r\nX-B:\tb c: d\r\n\r\n", nil},
		{"a space in a name, none after the colon", "Host: g\r\nX A:b\r\n\r\n", errSpaceInFieldName},
		// A Host is uri-host [":" port] (RFC 9112 3.2: a 400 for any other).
		{"Host with a port", "Host: gw:8080\r\n\r\n", nil},
		{"Host, IPv6", "host:\t[::1]:8080\t\r\n\r\n", nil},
		{"Host, every character a name may hold", "Host: a-b.c_d~e%41!$&'()*+,;=.example.:1\r\n\r\n", nil},
		{"Host with user info", "Host: user:pw@gw\r\n\r\n", errHostUserInfo},
		{"Host with user info, lower case", "host: u@gw\r\n\r\n", errHostUserInfo},
		// User info is named whatever else is wrong with the Host: a '<' or
		// a '"' before its '@' made it an invalid Host, without the advice
		// to revoke. (fasthttp refuses a DEL or a control byte in any header
		// value itself: noteUnreadableUserInfo.)
		{"Host with user info and a '\"'", "Host: user:pw\"@gw\r\n\r\n", errHostUserInfo},
		{"Host with user info and a '<'", "Host: u<@gw\r\n\r\n", errHostUserInfo},
		{"Host with user info, a '^' after it", "Host: u@g^w\r\n\r\n", errHostUserInfo},
		{"Host with '<'", "Host: g<w\r\n\r\n", errInvalidHost},
		{"Host with '\"'", "Host: \"gw\"\r\n\r\n", errInvalidHost},
		{"Host with '{'", "Host: g{w}\r\n\r\n", errInvalidHost},
		{"Host with '^'", "Host: g^w\r\n\r\n", errInvalidHost},
		{"Host with '|'", "Host: g|w\r\n\r\n", errInvalidHost},
		{"Host with '`'", "Host: g`w\r\n\r\n", errInvalidHost},
		{"Host with UTF-8", "Host: caf\xc3\xa9.example\r\n\r\n", errInvalidHost},
		{"Host with a space", "Host: g w\r\n\r\n", errInvalidHost},
		{"Host with a slash", "Host: gw/x\r\n\r\n", errInvalidHost},
		// RFC 9110 7.6.1: a field named in Connection is for this hop
		// alone. The usual options pass; so do the fields the gateway drops
		// when named (scrubHeaders) or sends of its own (Host, the length).
		// Content-Type and Idempotency-Key, which a sale means nothing
		// without, are refused by name: a proxy in front that honours the
		// option sends neither.
		{"Connection: keep-alive", "Host: g\r\nConnection: keep-alive\r\n\r\n", nil},
		{"Connection naming preferences", "Host: g\r\nConnection: close, Accept-Language,user-agent\r\n\r\n", nil},
		{"Connection naming Host and the length", "Host: g\r\nConnection: Host, Content-Length\r\nContent-Length: 0\r\n\r\n", nil},
		{"Connection naming longer names", "Host: g\r\nConnection: Idempotency-Keys, Content-Type-X, x-idempotency-key\r\n\r\n", nil},
		{"other fields naming Idempotency-Key", "Host: g\r\nX-Connection: Idempotency-Key\r\nCache-Control: idempotency-key\r\n\r\n", nil},
		{"Connection naming Idempotency-Key", "Host: g\r\nConnection: Idempotency-Key\r\n\r\n", errConnectionNamesIdempotencyKey},
		{"Connection naming Idempotency-Key, on a second line", "Host: g\r\nConnection: keep-alive\r\nconnection: TE,\tIDEMPOTENCY-KEY ,\r\n\r\n",
			errConnectionNamesIdempotencyKey},
		{"Connection naming Content-Type", "Host: g\r\nConnection: close,Content-Type\r\nContent-Type: application/json\r\n\r\n", errConnectionNamesContentType},
		{"Connection naming Content-Type alone, no space", "Host: g\r\nConnection:content-type\r\n\r\n", errConnectionNamesContentType},
		{"chunked and a length", "Host: g\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n", errAmbiguousFraming},
		{"a Content-Type", "Host: g\r\ncontent-type: application/json\r\nContent-Types: x\r\n\r\n", nil},
		{"Content-Type in other fields' values", "Host: g\r\nContent-Type: a/b\r\nCache-Control: Content-Type: c/d\r\nX-A: content-type: e/f\r\n\r\n", nil},
		{"two Content-Types in upper case", "Host: g\r\nCONTENT-TYPE: a/b\r\nContent-type: a/b\r\n\r\n", errSeveralContentTypes},
		{"two Content-Types", "Host: g\r\nContent-Type: text/plain\r\nX-A: a\r\ncontent-type: application/json\r\n\r\n", errSeveralContentTypes},
		{"the same Content-Type twice", "Host: g\r\nContent-Type: application/json\r\nContent-Type: application/json\r\n\r\n", errSeveralContentTypes},
	} {
		var h fasthttp.RequestHeader
		raw := "POST /v1/x HTTP/1.1\r\n" + tt.head + next
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatalf("%s: fasthttp refused %q: %v", tt.name, raw, err)
		}
		if got := misreadHead(&h); got != tt.want {
			t.Errorf("%s: misreadHead = %v, want %v", tt.name, refusal(got), refusal(tt.want))
		}
	}
}

// refusal is err's message, which tells apart refusals of one status and
// code (errInvalidHost, errHostUserInfo), or nil.
func refusal(err error) any {
	if ae, ok := err.(*apiError); ok {
		return ae.Message
	}
	return err
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

// scrubHeaders drops a forwarded field that a Connection field names as
// an option (RFC 9110 7.6.1: for this hop alone), on any of its lines and
// in any case, and keeps it otherwise; Host and the length are the
// gateway's own on the way to the service, whatever the client named.
func TestScrubHeadersDropsTheFieldsConnectionNames(t *testing.T) {
	sent := "Host: g\r\nAccept: a/b\r\nAccept-Language: ru\r\nUser-Agent: ua\r\nIf-None-Match: \"e\"\r\nContent-Length: 2\r\n"
	for _, tt := range []struct {
		name, connection string
		want             []string
	}{
		{"no Connection", "", []string{"accept", "accept-language", "content-length", "host", "if-none-match", "user-agent"}},
		{"keep-alive", "Connection: keep-alive\r\n", []string{"accept", "accept-language", "content-length", "host", "if-none-match", "user-agent"}},
		{"close and a field", "Connection: close, Accept-Language\r\n", []string{"accept", "content-length", "host", "if-none-match", "user-agent"}},
		{"fields on two lines, any case", "Connection: USER-AGENT\r\nconnection: ,if-none-match ,\tAccept\r\n",
			[]string{"accept-language", "content-length", "host"}},
		{"Host and the length", "Connection: Host, Content-Length\r\n", []string{"accept", "accept-language", "content-length", "host", "if-none-match", "user-agent"}},
		{"names that only start alike", "Connection: Accept-Languages, User\r\n", []string{"accept", "accept-language", "content-length", "host", "if-none-match", "user-agent"}},
	} {
		var h fasthttp.RequestHeader
		raw := "POST /v1/x HTTP/1.1\r\n" + sent + tt.connection + "\r\n"
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatalf("%s: fasthttp refused %q: %v", tt.name, raw, err)
		}
		scrubHeaders(&h)
		var got []string
		for k := range h.All() {
			got = append(got, strings.ToLower(string(k)))
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: the scrub kept %q, want %q", tt.name, got, tt.want)
		}
	}
}

// BenchmarkScrubHeaders is the scrub's cost on a usual GET, which every
// proxied request pays; the copy of the received head is counted with it.
func BenchmarkScrubHeaders(b *testing.B) {
	var received, h fasthttp.RequestHeader
	raw := "GET /v1/export/items/coin-1 HTTP/1.1\r\nHost: gateway\r\nUser-Agent: wrk\r\nAccept: application/json\r\n" +
		"Accept-Encoding: gzip\r\nX-API-Key: cxr_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ012345\r\nConnection: keep-alive\r\n\r\n"
	if err := received.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		received.CopyTo(&h)
		if scrubHeaders(&h) {
			b.Fatal("a GET without Content-Encoding read as encoded")
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

// A client whose own tracing sent a traceparent, and logged its trace id
// for the call, quotes that id: the gateway does not adopt it (a trace of
// its own, as documented) but records it, on the access line as
// client_trace_id and on the server span as app.client_trace_id, so that
// grep finds the request by it. Before, it was in no line and no span: the
// id led nowhere, and make trace's hint to grep the logs found nothing. A
// trusted traceparent is the request id itself; a malformed one is no id.
func TestAccessLineNamesTheClientsTraceID(t *testing.T) {
	clientTrace := "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tt := range []struct {
		name, traceparent string
		trust             bool
		want              string // client_trace_id, "" for none
	}{
		{"untrusted", "00-" + clientTrace + "-00f067aa0ba902b7-01", false, clientTrace},
		{"untrusted, not sampled", "00-" + clientTrace + "-00f067aa0ba902b7-00", false, clientTrace},
		{"trusted: the request id", "00-" + clientTrace + "-00f067aa0ba902b7-01", true, ""},
		{"malformed", "00-" + clientTrace + "-zz", false, ""},
		{"none", "", false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, sr, logs := startInternal(t, map[string]string{"GATEWAY_TRUST_TRACEPARENT": strconv.FormatBool(tt.trust)}, fakeKeys{})
			headers := map[string]string{"X-API-Key": wellFormedKey(t)}
			if tt.traceparent != "" {
				headers["traceparent"] = tt.traceparent
			}
			resp, env := get(t, "http://"+g.Addr()+"/v1/export/items", headers)
			if resp.StatusCode != 200 {
				t.Fatalf("GET = %d %+v, want 200", resp.StatusCode, env.Error)
			}
			requestID := resp.Header.Get("X-Request-Id")
			if (requestID == clientTrace) != tt.trust {
				t.Errorf("request id %s with the client's trace %s and trust=%v", requestID, clientTrace, tt.trust)
			}
			line := accessLineOf(logs.String(), requestID)
			if line == "" {
				t.Fatalf("no access line of %s", requestID)
			}
			if tt.want != "" && !strings.Contains(line, `"client_trace_id":"`+tt.want+`"`) {
				t.Errorf("access line %s lacks client_trace_id %s", line, tt.want)
			}
			if tt.want == "" && strings.Contains(line, "client_trace_id") {
				t.Errorf("access line %s has a client_trace_id, want none", line)
			}
			var got []string
			for _, s := range sr.Ended() {
				if s.SpanContext().TraceID().String() != requestID || s.SpanKind() != trace.SpanKindServer {
					continue
				}
				for _, a := range s.Attributes() {
					if a.Key == attrClientTraceID {
						got = append(got, a.Value.AsString())
					}
				}
			}
			want := []string{tt.want}
			if tt.want == "" {
				want = nil
			}
			if !slices.Equal(got, want) {
				t.Errorf("server span's %s = %q, want %q", attrClientTraceID, got, want)
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
