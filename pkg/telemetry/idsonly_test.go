package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Spans of a process that records nothing still make a trace: a new one at
// the root, the parent's (local or from a traceparent header) below it, and
// a new root where asked, each span with an id of its own.
func TestIDsOnlySpansContinueTheirTrace(t *testing.T) {
	tracer := idsOnlyProvider{}.Tracer("test")
	rootCtx, root := tracer.Start(context.Background(), "root")
	rootSC := root.SpanContext()
	if !rootSC.IsValid() || root.IsRecording() || rootSC.IsSampled() {
		t.Fatalf("root span context = %+v, recording %v; want valid ids, not recorded nor sampled", rootSC, root.IsRecording())
	}
	if _, other := tracer.Start(context.Background(), "root"); other.SpanContext().TraceID() == rootSC.TraceID() {
		t.Errorf("two roots share trace id %s", rootSC.TraceID())
	}

	_, child := tracer.Start(rootCtx, "child")
	if got := child.SpanContext(); got.TraceID() != rootSC.TraceID() || got.SpanID() == rootSC.SpanID() || !got.SpanID().IsValid() {
		t.Errorf("child = trace %s span %s; want trace %s and a new span id", got.TraceID(), got.SpanID(), rootSC.TraceID())
	}

	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	remote := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	_, server := tracer.Start(remote, "server", trace.WithSpanKind(trace.SpanKindServer))
	if got := server.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("span under a remote parent has trace %s, want the parent's", got)
	}
	if server.SpanContext().IsSampled() {
		t.Errorf("span under a sampled remote parent is flagged sampled, but nothing records it")
	}
	_, newRoot := tracer.Start(remote, "server", trace.WithNewRoot())
	if got := newRoot.SpanContext().TraceID().String(); got == "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("WithNewRoot kept the parent's trace %s", got)
	}
}

func BenchmarkStartIDsOnly(b *testing.B) {
	tracer := idsOnlyProvider{}.Tracer("bench")
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot()}
	for b.Loop() {
		_, span := tracer.Start(context.Background(), "op", opts...)
		span.End()
	}
}

func BenchmarkStartSDKNeverSample(b *testing.B) {
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())).Tracer("bench")
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot()}
	for b.Loop() {
		_, span := tracer.Start(context.Background(), "op", opts...)
		span.End()
	}
}
