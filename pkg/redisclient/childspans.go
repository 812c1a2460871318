package redisclient

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// childSpansOnly makes a tracer provider record only spans that have a
// parent. redisotel starts a span for every command, and a command outside
// any request (health pings, background work) would otherwise be a trace of
// its own: noise that hides the traces SREs look up by request id.
type childSpansOnly struct {
	embedded.TracerProvider
	provider trace.TracerProvider
}

func (p childSpansOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{tracer: p.provider.Tracer(name, opts...)}
}

type childTracer struct {
	embedded.Tracer
	tracer trace.Tracer
}

func (t childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx) // a non-recording span
	}
	return t.tracer.Start(ctx, name, opts...)
}
