package telemetry

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/tracestore"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// A span holding bytes a client sent that are not UTF-8 (a path with %FF, a
// User-Agent) is exported with U+FFFD in their place, and the spans
// exported in the same batch arrive too: the OTLP exporter alone refuses
// the whole batch.
func TestSpansWithInvalidUTF8AreExportedWithTheirBatch(t *testing.T) {
	store := tracestore.New(nil, 0)
	collector := httptest.NewServer(store)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	shutdown, err := Setup(context.Background(), os.Getenv, "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tracer := otel.GetTracerProvider().Tracer("test")
	var link []trace.Link
	end := func(name string, attrs ...attribute.KeyValue) trace.SpanContext {
		_, span := tracer.Start(context.Background(), name, trace.WithAttributes(attrs...), trace.WithLinks(link...))
		span.AddEvent("event \xff", trace.WithAttributes(attribute.String("e", "\xfe")))
		span.SetStatus(codes.Error, "bad \xc3")
		span.End()
		return span.SpanContext()
	}
	before := end("before", attribute.String("url.path", "/v1/export/items/ok"))
	// Strings at every place a span holds them, each of which alone made
	// the exporter refuse the batch.
	link = []trace.Link{{SpanContext: before, Attributes: []attribute.KeyValue{attribute.String("l", "\xff")}}}
	hostile := end("GET \xff", attribute.String("url.path", "/v1/export/items/\xff"),
		attribute.String("user_agent.original", "\xff\xfe"), attribute.StringSlice("list", []string{"a", "\xff"}),
		attribute.String("key \xff", "v"), attribute.Int("n", 7),
		attribute.Slice("slice", attribute.StringValue("\xff")),
		attribute.Map("map", attribute.String("k \xff", "\xff")))
	link = nil
	after := end("after", attribute.String("url.path", "/v1/export/items/ok"))
	if err := shutdown(context.Background()); err != nil { // flushes the batch
		t.Fatalf("shutdown = %v", err)
	}

	for _, sc := range []trace.SpanContext{before, after} {
		if got := store.Trace(sc.TraceID().String()); len(got) != 1 {
			t.Errorf("trace %s: %d spans exported, want 1", sc.TraceID(), len(got))
		}
	}
	got := store.Trace(hostile.TraceID().String())
	if len(got) != 1 {
		t.Fatalf("the span with invalid UTF-8: %d exported, want 1", len(got))
	}
	sp := got[0]
	if sp.Name != "GET \uFFFD" || sp.Attributes["url.path"] != "/v1/export/items/\uFFFD" ||
		sp.Attributes["user_agent.original"] != "\uFFFD" || sp.Attributes["key \uFFFD"] != "v" || sp.Attributes["n"] != "7" {
		t.Errorf("exported span = %q %v, want the invalid bytes as U+FFFD and the rest unchanged", sp.Name, sp.Attributes)
	}
	for k, v := range sp.Attributes {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			t.Errorf("attribute %q = %q is not valid UTF-8", k, v)
		}
	}
}
