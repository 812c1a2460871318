package edge

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The trace context the gateway writes by hand is the one OTel's W3C
// propagator writes, so the services' propagator reads it the same way.
func TestAddTraceContextMatchesThePropagator(t *testing.T) {
	state, err := trace.ParseTraceState("vendor=abc,other=x1")
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	for _, sc := range []trace.SpanContext{
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: state}),
	} {
		want := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), want)

		var h fasthttp.RequestHeader
		addTraceContext(&h, sc)
		for _, name := range []string{"traceparent", "tracestate"} {
			if got := string(h.Peek(name)); got != want[name] {
				t.Errorf("%s = %q, want %q", name, got, want[name])
			}
		}
	}

	var h fasthttp.RequestHeader
	addTraceContext(&h, trace.SpanContext{})
	if got := h.Peek("traceparent"); got != nil {
		t.Errorf("traceparent for an invalid span context = %q, want none", got)
	}
}
