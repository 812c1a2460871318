package tracestore

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/envelope"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

func TestReceivesSpansFromTheOTLPExporter(t *testing.T) {
	var file bytes.Buffer
	store := New(&file, 0)
	ctx := context.Background()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporterTo(t, store)),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("svc"))))
	tracer := tp.Tracer("test")
	ctx, parent := tracer.Start(ctx, "parent")
	_, child := tracer.Start(ctx, "child", trace.WithAttributes(attribute.String("app.error_code", "unauthenticated"),
		attribute.String("app.auth_failure", "revoked"), attribute.String("app.unread_reason", "header"), attribute.String("api_key.id", "k1"),
		attribute.String("app.item_id", "coin-7"), attribute.String("app.external_order_id", "o-7"),
		attribute.String("app.idempotency_key", "k-7"), attribute.Bool("app.idempotent_replay", true),
		attribute.String("server.address", "10.1.2.3"), attribute.String("server.port", "8082")))
	child.AddEvent("sent again", trace.WithAttributes(attribute.String("upstream.failed_attempt.kind", "closed")))
	child.End()
	parent.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	traceID := parent.SpanContext().TraceID().String()
	spans := store.Trace(traceID)
	if len(spans) != 2 {
		t.Fatalf("Trace(%s) has %d spans, want 2", traceID, len(spans))
	}
	var tree bytes.Buffer
	WriteTree(&tree, spans, nil)
	lines := strings.Split(strings.TrimSpace(tree.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "parent") || !strings.HasPrefix(lines[1], "  child") || !strings.Contains(lines[0], "svc") ||
		!strings.Contains(lines[1], "app.error_code=unauthenticated app.auth_failure=revoked app.unread_reason=header api_key.id=k1 app.item_id=coin-7 app.external_order_id=o-7 "+
			"app.idempotency_key=k-7 app.idempotent_replay=true server.address=10.1.2.3 server.port=8082") || lines[2] != "    · sent again upstream.failed_attempt.kind=closed" {
		t.Errorf("WriteTree =\n%s\nwant parent, then the indented child with its error code, auth failure and key, then its event", tree.String())
	}
	if got := strings.Count(file.String(), "\n"); got != 2 {
		t.Errorf("file has %d lines, want 2", got)
	}
}

// An exporter told to compress (OTEL_EXPORTER_OTLP_COMPRESSION=gzip, which
// make run passes to every binary) is a valid OTLP/HTTP client: its spans
// are kept, where each export was refused 400 and make trace found none.
// JSON with a charset parameter is JSON too.
func TestReceivesCompressedAndCharsetExports(t *testing.T) {
	store := New(nil, 0)
	srv := httptest.NewServer(store)
	defer srv.Close()
	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"),
		otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	_, span := tp.Tracer("test").Start(ctx, "compressed")
	span.End()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatalf("export with gzip: %v", err)
	}
	if got := store.Trace(span.SpanContext().TraceID().String()); len(got) != 1 {
		t.Errorf("a gzip export kept %d spans, want 1", len(got))
	}
	resp, err := http.Post(srv.URL+"/v1/traces", "application/json; charset=utf-8", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST JSON with a charset = %d, want 200", resp.StatusCode)
	}
}

// The collector answers what it cannot take with the stack's envelope.
func TestErrorsAreEnvelopes(t *testing.T) {
	srv := httptest.NewServer(New(nil, 0))
	defer srv.Close()
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/nope", "", 404},
		{"POST", "/v1/traces", "not protobuf", 400},
		{"POST", "/v1/traces", strings.Repeat("x", maxExportBytes+1), 413},
		{"POST", "/v1/traces", "gzip:not gzip", 400},
		{"POST", "/v1/traces", "gzip:" + gzipped(strings.Repeat("x", maxExportBytes+1)), 413},
		{"POST", "/v1/traces", "br:x", 415},
	} {
		encoding, body, compressed := strings.Cut(tc.body, ":")
		if !compressed {
			encoding, body = "", tc.body
		}
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(body))
		req.Header.Set("Content-Encoding", encoding)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var env envelope.Parsed
		err = json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || env.Error == nil || env.Meta.RequestID == "" ||
			resp.Header.Get("Content-Type") != envelope.ContentType {
			t.Errorf("%s %s = %d %+v (%v), want %d with an error envelope", tc.method, tc.path, resp.StatusCode, env, err, tc.status)
		}
	}
}

// Spans the store cannot write to its file (a full disk) are answered 500,
// which the exporters report in their processes' logs ("opentelemetry
// error (spans may be lost)"); a 200 would tell them the spans were kept
// while make trace finds none of them.
func TestSpansNotWrittenAreAnError(t *testing.T) {
	srv := httptest.NewServer(New(failingWriter{}, 0))
	defer srv.Close()
	body, err := proto.Marshal(&collectortrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{TraceId: make([]byte, 16), SpanId: make([]byte, 8), Name: "s"}}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(srv.URL+"/v1/traces", "application/x-protobuf", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env envelope.Parsed
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil || resp.StatusCode != http.StatusInternalServerError ||
		env.Error == nil || env.Error.Code != "internal_error" {
		t.Errorf("POST /v1/traces with the file failing = %d %+v (%v), want 500 internal_error", resp.StatusCode, env, err)
	}
}

func gzipped(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return b.String()
}

// failingWriter fails every write, as a file on a full disk does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// A server span that matched no route shows its path: a service's has no
// http.route then, the gateway's the placeholder "unmatched" (404) or
// "unrouted" (a request it could not read). A routed span's path is its
// route, a client's its URL.
func TestUnroutedServerSpanShowsItsPath(t *testing.T) {
	for _, tc := range []struct {
		sp   Span
		want bool
	}{
		{Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"url.path": "/v1/nope"}}, true},
		{Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"url.path": "/v1/nope", "http.route": "unmatched"}}, true},
		{Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"url.path": "/v1/nope", "http.route": "unrouted"}}, true},
		{Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"url.path": "/v1/nope", "http.route": "/v1/{x}"}}, false},
		{Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"url.path": "/v1/nope", "http.route": "GET /v1/{x}"}}, false},
		{Span{Kind: "SPAN_KIND_CLIENT", Attributes: map[string]string{"url.path": "/v1/nope"}}, false},
	} {
		if got := strings.Contains(interesting(tc.sp), "url.path=/v1/nope"); got != tc.want {
			t.Errorf("interesting(%+v) = %q: shows the path %v, want %v", tc.sp, interesting(tc.sp), got, tc.want)
		}
	}
}

// Whether a failed sale was applied (app.sale_applied, on the gateway's
// and sales-writer's server spans of a sale's 5xx) is shown: the root
// README's table sends the on-call reader to it, and make trace left it out.
func TestWhetherAFailedSaleWasAppliedIsShown(t *testing.T) {
	sp := Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"http.route": "POST /v1/export/items/{item_id}/sales/confirm",
		"http.response.status_code": "502", "app.error_code": "bad_gateway", "app.idempotency_key": "k-7", "app.sale_applied": "maybe"}}
	if got := interesting(sp); !strings.Contains(got, "app.idempotency_key=k-7 app.sale_applied=maybe") {
		t.Errorf("interesting(%+v) = %q, want whether the sale was applied, after its key", sp, got)
	}
}

// The X-Request-Id a client sent, its own id for the call, is shown on the
// gateway's server span: it is how a ticket quoting that id is tied to the
// request id.
func TestClientsOwnRequestIDIsShown(t *testing.T) {
	sp := Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"http.route": "GET /v1/export/items",
		"http.response.status_code": "401", "app.client_request_id": "ticket-42"}}
	if got := interesting(sp); !strings.Contains(got, "app.client_request_id=ticket-42") {
		t.Errorf("interesting(%+v) = %q, want the client's own request id", sp, got)
	}
}

// The trace id of a client's own traceparent is shown on the gateway's
// server span: the gateway starts a trace of its own, and a client's
// tracing shows only its id.
func TestClientsOwnTraceIDIsShown(t *testing.T) {
	sp := Span{Kind: "SPAN_KIND_SERVER", Attributes: map[string]string{"http.route": "GET /v1/export/items",
		"http.response.status_code": "200", "app.client_trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}}
	if got := interesting(sp); !strings.Contains(got, "app.client_trace_id=4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("interesting(%+v) = %q, want the client's own trace id", sp, got)
	}
}

// How a list page's read ahead ended is shown on the span of a request
// that waited for it: a page that took seconds shows why (a read that
// failed, or one left unread) without opening the span.
func TestHowAWaitedForReadAheadEndedIsShown(t *testing.T) {
	sp := Span{Kind: "SPAN_KIND_INTERNAL", Name: "export read-ahead wait",
		Attributes: map[string]string{"export.read_ahead.result": "failed"}}
	if got := interesting(sp); got != "export.read_ahead.result=failed" {
		t.Errorf("interesting(%+v) = %q, want how the read ended", sp, got)
	}
}

// A value a client chose is printed on one line, its control characters
// escaped: an item id decoded from %0A%1B[2J forges no line of the tree
// and clears no terminal.
func TestTreeEscapesControlCharacters(t *testing.T) {
	var tree bytes.Buffer
	WriteTree(&tree, []Span{{SpanID: "1", Name: "POST", Service: "sales-writer", Kind: "SPAN_KIND_SERVER",
		Attributes: map[string]string{"app.item_id": "a\n\x1b[2Jforged", "url.path": "/v1/x\ny"},
		Events:     []Event{{Name: "e", Attributes: map[string]string{"k": "v\rw"}}}}}, nil)
	out := tree.String()
	if strings.Count(out, "\n") != 2 || strings.ContainsAny(out, "\x1b\r") ||
		!strings.Contains(out, `app.item_id="a\n\x1b[2Jforged"`) || !strings.Contains(out, `url.path="/v1/x\ny"`) {
		t.Errorf("tree =\n%q\nwant two lines, the values quoted with their control characters escaped", out)
	}
}

// A proxy span names the instance it reached; a SQL span does not repeat
// the one database every SQL span reaches.
func TestServerAddressOnlyOutsideSQLSpans(t *testing.T) {
	proxy := Span{Kind: "SPAN_KIND_CLIENT", Attributes: map[string]string{"server.address": "10.0.0.7", "server.port": "8082"}}
	sql := Span{Kind: "SPAN_KIND_CLIENT", Attributes: map[string]string{"server.address": "/run/pg", "server.port": "5432",
		"db.system.name": "postgresql", "db.operation.name": "SELECT"}}
	if got := interesting(proxy); got != "server.address=10.0.0.7 server.port=8082" {
		t.Errorf("interesting(proxy span) = %q, want its instance", got)
	}
	if got := interesting(sql); got != "db.operation.name=SELECT" {
		t.Errorf("interesting(SQL span) = %q, want only its operation", got)
	}
}

// A span's links are kept: the gateway's "rate limit" span links to the
// Redis round trip it waited on, often in another request's trace.
func TestKeepsLinks(t *testing.T) {
	store := New(nil, 0)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporterTo(t, store)))
	_, other := tp.Tracer("test").Start(context.Background(), "rate limit batch")
	other.End()
	_, linking := tp.Tracer("test").Start(context.Background(), "rate limit", trace.WithLinks(trace.Link{SpanContext: other.SpanContext()}))
	linking.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := store.Trace(linking.SpanContext().TraceID().String())
	want := Link{TraceID: other.SpanContext().TraceID().String(), SpanID: other.SpanContext().SpanID().String()}
	if len(spans) != 1 || len(spans[0].Links) != 1 || spans[0].Links[0] != want {
		t.Errorf("spans = %+v, want one with the link %+v", spans, want)
	}
}

// boundedWriter fails the test's tree once it has written more than a
// tree of a few spans can: a tree that loops never ends on its own.
type boundedWriter struct {
	bytes.Buffer
	limit int
}

func (w *boundedWriter) Write(p []byte) (int, error) {
	if w.Len()+len(p) > w.limit {
		panic("tree longer than its spans")
	}
	return w.Buffer.Write(p)
}

// Links into a span's own trace, to a trace not in the file, between two
// traces both ways, and spans of a linked trace that are each other's
// parent (a file any OTLP sender on loopback writes to) print each span
// at most once: WriteTree walked from a link's target, where a parent
// cycle has no root to stop it, and make trace grew until it was killed.
func TestTreeEndsOnCyclicLinks(t *testing.T) {
	const a, b = "0000000000000000000000000000000a", "0000000000000000000000000000000b"
	spans := []Span{
		{TraceID: a, SpanID: "a0", Name: "GET /v1/export/items"},
		{TraceID: a, SpanID: "a1", ParentID: "a0", Name: "rate limit", Links: []Link{
			{TraceID: a, SpanID: "a0"}, {TraceID: b, SpanID: "b1"}, {TraceID: "0000000000000000000000000000000c", SpanID: "c1"}}},
		{TraceID: a, SpanID: "a2", ParentID: "a0", Name: "rate limit", Links: []Link{{TraceID: b, SpanID: "b1"}}},
	}
	linked := []Span{
		{TraceID: b, SpanID: "b1", ParentID: "b2", Name: "rate limit batch", Links: []Link{{TraceID: a, SpanID: "a1"}}},
		{TraceID: b, SpanID: "b2", ParentID: "b1", Name: "redis.pipeline evalsha"},
		{TraceID: b, SpanID: "b3", ParentID: "b3", Name: "its own parent"},
	}
	out := &boundedWriter{limit: 1 << 16}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("WriteTree did not end: %v; first lines:\n%.600s", r, out.String())
			}
		}()
		WriteTree(out, spans, linked)
	}()
	got := out.String()
	for name, want := range map[string]int{"GET /v1/export/items": 1, "rate limit": 2, "rate limit batch": 1, "redis.pipeline evalsha": 1} {
		if n := strings.Count(got, name+"  "); n != want {
			t.Errorf("%q shown %d times, want %d:\n%s", name, n, want, got)
		}
	}
	if !strings.Contains(got, "rate limit batch (span b1, shown above)") || !strings.Contains(got, "of this trace") || !strings.Contains(got, "c1 of trace 0000000000000000000000000000000c (not found)") {
		t.Errorf("tree =\n%s\nwant the link into its own trace and the one to a missing trace named", got)
	}
}

// A span's error status, and its description, are kept and printed first
// on its line: a proxy span whose answer broke off after its head says
// 200, and the tree showed that alone, so the span where the request
// failed read as a success. A span with no status set prints none.
func TestTreeShowsAFailedSpansStatus(t *testing.T) {
	store := New(nil, 0)
	ctx := context.Background()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporterTo(t, store)))
	ctx, server := tp.Tracer("test").Start(ctx, "GET /v1/export/items")
	_, proxy := tp.Tracer("test").Start(ctx, "proxy export-reader", trace.WithAttributes(attribute.Int("http.response.status_code", 200)))
	proxy.SetStatus(codes.Error, "closed\nforged")
	proxy.End()
	server.End()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	var tree bytes.Buffer
	WriteTree(&tree, store.Trace(server.SpanContext().TraceID().String()), nil)
	lines := strings.Split(strings.TrimSpace(tree.String()), "\n")
	if len(lines) != 2 || strings.Contains(lines[0], "status=") ||
		!strings.HasSuffix(lines[1], ` status=ERROR("closed\nforged") http.response.status_code=200`) {
		t.Errorf("WriteTree =\n%s\nwant the server span without a status, the proxy span's error and its description before its 200", tree.String())
	}
}

// exporterTo returns an OTLP/HTTP exporter to store, served on loopback
// until the test ends.
func exporterTo(t *testing.T, store *Store) sdktrace.SpanExporter {
	t.Helper()
	srv := httptest.NewServer(store)
	t.Cleanup(srv.Close)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	return exp
}
