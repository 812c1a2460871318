package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// make trace finds a request whose id was quoted upper-cased or with the
// spaces a copy picked up, and refuses what is no request id at all.
func TestShowReadsARequestIDAsQuoted(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	file := filepath.Join(t.TempDir(), "traces.jsonl")
	line := `{"trace_id":"` + id + `","span_id":"00f067aa0ba902b7","service":"gateway","name":"GET /v1/health","kind":"server","start":"2026-11-22T04:00:00Z","duration_ms":1.5}` + "\n"
	if err := os.WriteFile(file, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, quoted := range []string{id, strings.ToUpper(id), " " + id + "\n"} {
		var out bytes.Buffer
		if err := show(&out, file, quoted); err != nil || !strings.Contains(out.String(), "GET /v1/health") {
			t.Errorf("show(%q) = %v, output %q; want the trace", quoted, err, out.String())
		}
	}
	if err := show(&bytes.Buffer{}, file, "not-an-id"); err == nil {
		t.Error("show(not-an-id) = nil error, want one")
	}
}

// make run keeps the last run's spans once, as traces.jsonl.1: make trace
// finds a request of that run there, and of this one in traces.jsonl.
func TestShowReadsTheLastRunsSpansToo(t *testing.T) {
	span := func(traceID, name, start string) string {
		return `{"trace_id":"` + traceID + `","span_id":"00f067aa0ba902b7","service":"gateway","name":"` + name + `","kind":"server","start":"` + start + `","duration_ms":1.5}` + "\n"
	}
	const last, now = "4bf92f3577b34da6a3ce929d0e0e4736", "5bf92f3577b34da6a3ce929d0e0e4737"
	file := filepath.Join(t.TempDir(), "traces.jsonl")
	if err := os.WriteFile(file+".1", []byte(span(last, "GET /v1/export/items", "2026-11-22T06:00:00+03:00")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(span(now, "GET /v1/health", "2026-11-22T04:00:00Z")), 0o600); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{last: "GET /v1/export/items", now: "GET /v1/health"} {
		var out bytes.Buffer
		if err := show(&out, file, id); err != nil || !strings.Contains(out.String(), want) {
			t.Errorf("show(%s) = %v, output %q; want the trace of %s", id, err, out.String(), want)
		}
	}
	// A request of neither run: the error names both files it read, and
	// the requests that record no span at all, whose log lines are all
	// there is: a health check's request id, quoted from its answer, was
	// sent to retry in a few seconds, for ever.
	err := show(io.Discard, file, "6bf92f3577b34da6a3ce929d0e0e4738")
	if err == nil || !strings.Contains(err.Error(), file+".1") {
		t.Errorf("show of a request in neither file = %v, want an error naming %s.1 too", err, file)
	}
	for _, want := range []string{"health check", "not sampled", "grep 6bf92f3577b34da6a3ce929d0e0e4738 " + filepath.Join(filepath.Dir(file), "logs", "*.log*"),
		"the spans kept begin at 2026-11-22 03:00:00 UTC: a request older than that has no span left"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("show of a request in neither file = %v, want it to say %q", err, want)
		}
	}
	// traces.jsonl.1 may hold this run's older spans (serve's --max-bytes),
	// and the logs move to .1 at their own size: a request older than the
	// spans kept may still have its log lines, which the grep finds.
	if err != nil && strings.Contains(err.Error(), "nor log lines") {
		t.Errorf("show of a request in neither file = %v, want no word of its log lines being gone: the grep it gives may find them", err)
	}
}

// An export still being received when serve is told to stop (the last
// batch a stopping binary flushes) is written before serve returns: Serve
// returns as Shutdown begins, and returning then closed the span file
// under the export, whose spans were lost.
func TestServeWritesTheExportInFlightWhenStopped(t *testing.T) {
	file := filepath.Join(t.TempDir(), "traces.jsonl")
	addr := testenv.FreeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	served := make(chan error, 1)
	go func() { served <- serve(ctx, addr, file, 0, io.Discard) }()

	body, err := proto.Marshal(&collectortrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{TraceId: bytes.Repeat([]byte{0xab}, 16),
			SpanId: bytes.Repeat([]byte{1}, 8), Name: "the last span"}}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	for range 100 { // until serve listens
		if conn, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := fmt.Sprintf("POST /v1/traces HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", addr, len(body))
	if _, err := conn.Write(append([]byte(head), body[:1]...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the server is reading the body
	stop()
	time.Sleep(100 * time.Millisecond) // Shutdown has begun
	if _, err := conn.Write(body[1:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the export in flight got no answer: %v", err)
	}
	resp.Body.Close()
	if err := <-served; err != nil {
		t.Fatalf("serve = %v", err)
	}
	written, err := os.ReadFile(file)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(written), "the last span") {
		t.Errorf("export in flight at stop = %d, span file %q (%v); want 200 and the span written", resp.StatusCode, written, err)
	}
}

// Out of file descriptors, tracestore waits with its listener as every
// binary of the stack does (acceptretry), saying so once, and serves the
// connection that waited once a descriptor is free: it logged net/http's
// "Accept error" once a second instead, and out of kernel memory its
// Serve returned and make run stopped the whole stack.
func TestOutOfDescriptorsServeWaitsAndServesAfter(t *testing.T) {
	file := filepath.Join(t.TempDir(), "traces.jsonl")
	addr := testenv.FreeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	var logs testenv.Output
	go func() { served <- serve(ctx, addr, file, 0, &logs) }()
	t.Cleanup(func() { stop(); <-served })
	testenv.WaitListening(t, addr)
	testenv.AnsweredAfterADescriptorShortage(t, addr, "/v1/traces", &logs)
}

// serve --max-bytes keeps the span file under its cap within a run, the
// full one moved to traces.jsonl.1, and show still finds a request whose
// spans moved there: appended for as long as make run was up, the file
// grew by about 1 GB an hour under load and filled the disk.
func TestServeCapsTheSpanFileAndShowReadsWhatMoved(t *testing.T) {
	file := filepath.Join(t.TempDir(), "traces.jsonl")
	addr := testenv.FreeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- run(ctx, []string{"serve", "--addr", addr, "--file", file, "--max-bytes", "4000"}, io.Discard)
	}()
	t.Cleanup(func() { stop(); <-served })
	testenv.WaitListening(t, addr)
	traceID := func(i int) []byte { return bytes.Repeat([]byte{byte(i + 1)}, 16) }
	for i := range 40 {
		body, err := proto.Marshal(&collectortrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
			ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{TraceId: traceID(i),
				SpanId: bytes.Repeat([]byte{1}, 8), Name: fmt.Sprintf("GET /v1/export/items %d", i)}}}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post("http://"+addr+"/v1/traces", "application/x-protobuf", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("export %d = %d, want 200", i, resp.StatusCode)
		}
	}
	for _, f := range []string{file, file + ".1"} {
		if info, err := os.Stat(f); err != nil || info.Size() > 4000 {
			t.Errorf("%s: %v, want it within the cap of 4000 bytes", f, err)
		}
	}
	// The newest spans are in the file, those before in .1 (17 lines of 230
	// bytes a file); the first ones are gone, the price of the cap.
	if err := show(io.Discard, file, fmt.Sprintf("%x", traceID(0))); err == nil {
		t.Error("show of the first export found it: the span files were not capped")
	}
	for i, where := range map[int]string{39: "traces.jsonl", 30: "traces.jsonl.1"} {
		var out bytes.Buffer
		if err := show(&out, file, fmt.Sprintf("%x", traceID(i))); err != nil || !strings.Contains(out.String(), fmt.Sprintf("GET /v1/export/items %d", i)) {
			t.Errorf("show of export %d (in %s) = %v, %q; want its span", i, where, err, out.String())
		}
	}
}

// A request's span that links to a span of another trace (the gateway's
// "rate limit" span, to the Redis round trip another request's trace
// holds) shows that span under it, with its children, and nothing else of
// that trace.
func TestShowFollowsLinksToOtherTraces(t *testing.T) {
	const request, other = "4bf92f3577b34da6a3ce929d0e0e4736", "5bf92f3577b34da6a3ce929d0e0e4737"
	span := func(traceID, spanID, parentID, name, links string) string {
		return `{"trace_id":"` + traceID + `","span_id":"` + spanID + `","parent_span_id":"` + parentID + `","service":"gateway","name":"` + name +
			`","kind":"SPAN_KIND_INTERNAL","start":"2026-11-22T04:00:00Z","duration_ms":1.5,"links":[` + links + `]}` + "\n"
	}
	file := filepath.Join(t.TempDir(), "traces.jsonl")
	lines := span(other, "00000000000000b0", "", "GET /v1/export/items/{item_id}", "") +
		span(other, "00000000000000b1", "00000000000000b0", "rate limit batch", "") +
		span(other, "00000000000000b2", "00000000000000b1", "redis.pipeline evalsha", "") +
		span(request, "00000000000000a0", "", "GET /v1/export/items", "") +
		span(request, "00000000000000a1", "00000000000000a0", "rate limit", `{"trace_id":"`+other+`","span_id":"00000000000000b1"}`)
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := show(&out, file, request); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !strings.Contains(got, "↪ links to (trace "+other+")") || !strings.Contains(got, "rate limit batch") ||
		!strings.Contains(got, "redis.pipeline evalsha") || strings.Contains(got, "items/{item_id}") {
		t.Errorf("show =\n%s\nwant the linked round trip and its Redis span under the rate limit span, and no other span of its trace", got)
	}
}
