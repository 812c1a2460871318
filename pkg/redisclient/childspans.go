package redisclient

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
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

// pipelinesUnderSpans keeps redisotel from formatting the commands of a
// pipeline sent under no span: it formats them all (every argument, for
// the span's name and db.statement) before it asks the tracer for a span,
// which childSpansOnly then does not record: some 440 B and an allocation
// or two per decision of the gateway's limiter, whose batches go under a
// span only when a sampled request is in them ("rate limit batch"). Its
// filter (skip) sees the commands, not the context, so this hook, run
// before redisotel's, notes the first command of each pipeline it sends
// under a span, and skip passes every other. Spans under a span are as
// before.
type pipelinesUnderSpans struct {
	underSpan sync.Map // redis.Cmder (the pipeline's first) -> struct{}, while it is sent
}

func (g *pipelinesUnderSpans) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *pipelinesUnderSpans) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *pipelinesUnderSpans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || !trace.SpanContextFromContext(ctx).IsValid() {
			return next(ctx, cmds)
		}
		g.underSpan.Store(cmds[0], struct{}{})
		defer g.underSpan.Delete(cmds[0])
		return next(ctx, cmds)
	}
}

// skip is redisotel's pipeline filter: true (no span, nothing formatted)
// for a pipeline not sent under a span.
func (g *pipelinesUnderSpans) skip(cmds []redis.Cmder) bool {
	if len(cmds) == 0 {
		return true
	}
	_, under := g.underSpan.Load(cmds[0])
	return !under
}
