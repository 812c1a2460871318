package sales

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A group with traced calls has one span "commit group" (a child of the
// first traced call in the group's order, linked to every traced call),
// and each traced call a span "commit group wait" linked back to it: from
// one request's trace an SRE finds the group its sale committed in. No
// span says a call's key, order or owner: the group's span sits in one
// call's trace, the others' calls among them.
func TestAGroupIsTracedInItsCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	owner := saleFixture(t, db, "a", "b", "c")
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	w := NewGroupingWriter(db, time.Hour, 1, GroupStats{})
	release := holdRunners(t, w)
	items := []string{"c", "b", "a"} // a is not traced
	spans := map[string]trace.Span{}
	answers := make([]chan answer, len(items))
	for i, item := range items {
		callCtx := ctx
		if item != "a" {
			callCtx, spans[item] = tracer.Start(ctx, "sale "+item)
		}
		answers[i] = make(chan answer, 1)
		go func() {
			res, err := w.Execute(callCtx, confirmOf(owner, "secret-key-"+item, item, "order-"+item))
			answers[i] <- answer{res, err}
		}()
		queued(t, w, i+1)
	}
	release()
	for i := range answers {
		if got := answered(t, items[i], answers[i]); got.err != nil {
			t.Fatalf("confirm of %s: %v", items[i], got.err)
		}
	}
	for _, s := range spans {
		s.End()
	}
	var groups, waits []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "commit group":
			groups = append(groups, s)
		case "commit group wait":
			waits = append(waits, s)
		}
		for _, a := range s.Attributes() {
			if v := a.Value.String(); strings.Contains(v, "secret-key") || strings.Contains(v, "order-") || strings.Contains(v, owner) {
				t.Errorf("span %q has %s = %q: a call's key, order or owner", s.Name(), a.Key, v)
			}
		}
	}
	if len(groups) != 1 || len(waits) != 2 {
		t.Fatalf("%d commit group spans and %d waits, want 1 and 2 (the traced calls)", len(groups), len(waits))
	}
	group := groups[0]
	// The group runs in item order: b is its first traced call.
	if group.Parent().SpanID() != spans["b"].SpanContext().SpanID() {
		t.Errorf("commit group's parent is %s, want b's call span", group.Parent().SpanID())
	}
	attrs := map[string]string{}
	for _, a := range group.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["app.commit_group.calls"] != "3" || attrs["app.commit_group.traced_calls"] != "2" {
		t.Errorf("commit group's attributes %v, want calls 3, traced_calls 2", attrs)
	}
	if links := linkedSpans(group); !links[spans["b"].SpanContext().SpanID()] || !links[spans["c"].SpanContext().SpanID()] || len(links) != 2 {
		t.Errorf("commit group links %v, want b's and c's call spans", links)
	}
	for _, wait := range waits {
		if !linkedSpans(wait)[group.SpanContext().SpanID()] {
			t.Errorf("commit group wait under %s is not linked to the group's span", wait.Parent().SpanID())
		}
		if p := wait.Parent().SpanID(); p != spans["b"].SpanContext().SpanID() && p != spans["c"].SpanContext().SpanID() {
			t.Errorf("commit group wait's parent is %s, want a traced call's span", p)
		}
	}
}

func linkedSpans(s sdktrace.ReadOnlySpan) map[trace.SpanID]bool {
	ids := map[trace.SpanID]bool{}
	for _, l := range s.Links() {
		ids[l.SpanContext.SpanID()] = true
	}
	return ids
}
