package export

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A request that waits for its page while it is read ahead has a span of
// the wait, linked to the read's span (in the trace of the request that
// started the read) and saying how the read ended, its error included: a
// page request that waited 9 s for a read ahead stuck behind a lock on
// export_items, then timed out reading the page itself in the second left,
// showed a 10 s server span with a 1 s SELECT under it and nothing else.
func TestARequestWaitingForAReadAheadShowsTheWaitAndTheRead(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tracer := provider.Tracer("test")
	r := &Reader{ahead: newReadAhead(ReadAhead{Pages: 4, TTL: time.Minute, Reads: 1, Timeout: time.Hour})}
	started, release := make(chan struct{}), make(chan struct{})
	lockTimeout := errors.New("export: list: timeout: context deadline exceeded")
	fetch := func(context.Context, position, int) ([]scannedPage, error) {
		close(started)
		<-release // a lock on export_items
		return nil, lockTimeout
	}
	p, earlier := pageBeingReadAhead(t, r, tracer, readingWith(fetch), started)
	waitingSpan := usedOnceItsReadEnds(t, r, tracer, rec, p, release)

	read := spanNamed(t, rec, "export read-ahead")
	if read.Parent().SpanID() != earlier.SpanID() {
		t.Errorf("the read's span is under span %s, want the page that started it", read.Parent().SpanID())
	}
	wait := spanNamed(t, rec, "export read-ahead wait")
	if wait.SpanContext().TraceID() != waitingSpan.TraceID() || wait.Parent().SpanID() != waitingSpan.SpanID() {
		t.Errorf("the wait's span is under span %s of trace %s, want the waiting request's", wait.Parent().SpanID(), wait.SpanContext().TraceID())
	}
	if links := wait.Links(); len(links) != 1 || !links[0].SpanContext.Equal(read.SpanContext()) {
		t.Errorf("the wait's span links to %v, want the read's span %s", links, read.SpanContext().SpanID())
	}
	if got := attr(wait, "export.read_ahead.result"); got != "failed" {
		t.Errorf("export.read_ahead.result %q, want failed", got)
	}
	if got := exceptionMessage(wait); got != lockTimeout.Error() {
		t.Errorf("the wait's exception %q, want the read's error %q", got, lockTimeout)
	}
}

// A request that waits for a page the read-ahead left unread (the replica
// was found behind, so the request reads the page itself under its own
// check) shows result unread and no exception: nothing failed, and an
// exception there sends an SRE looking for an error that did not happen.
func TestAWaitForAPageLeftUnreadRecordsNoError(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	r := &Reader{ahead: newReadAhead(ReadAhead{Pages: 4, TTL: time.Minute, Reads: 1, Timeout: time.Hour})}
	started, release := make(chan struct{}), make(chan struct{})
	c := readingWith(func(context.Context, position, int) ([]scannedPage, error) {
		t.Error("a page read ahead from a replica found behind")
		return nil, nil
	})
	c.fresh = func() error {
		close(started)
		<-release
		return errors.New("replica: 12 s behind")
	}
	p, _ := pageBeingReadAhead(t, r, tracer, c, started)
	usedOnceItsReadEnds(t, r, tracer, rec, p, release)
	wait := spanNamed(t, rec, "export read-ahead wait")
	if got := attr(wait, "export.read_ahead.result"); got != "unread" {
		t.Errorf("export.read_ahead.result %q, want unread", got)
	}
	if got := exceptionMessage(wait); got != "" {
		t.Errorf("the wait of a page left unread records the exception %q, want none", got)
	}
}

// A request whose page was read before it came has no wait span: a span
// for every page would cost each page served from memory.
func TestARequestFindingItsPageReadHasNoWaitSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	r := &Reader{ahead: newReadAhead(ReadAhead{Pages: 4, TTL: time.Minute, Reads: 1, Timeout: time.Hour})}
	fetch := func(context.Context, position, int) ([]scannedPage, error) {
		return []scannedPage{{body: []byte("{}")}}, nil
	}
	c := readingWith(fetch)
	ctx, span := tracer.Start(context.Background(), "earlier page")
	r.ahead.begin(ctx, c, position{ID: "1"}, "1")
	span.End()
	waitForFreeSlots(t, r.ahead)
	p, ok := r.ahead.take(aheadKey{cursor: "1", lang: "ENG", limit: 100})
	if !ok {
		t.Fatal("the page read ahead has no entry")
	}
	if hit, err := r.ahead.use(ctx, p); !hit || err != nil {
		t.Fatalf("use: hit %v, error %v; want the page read ahead", hit, err)
	}
	for _, s := range rec.Ended() {
		if s.Name() == "export read-ahead wait" {
			t.Errorf("a wait span for a page read before its request came")
		}
	}
}

// A wait that ends otherwise than by the read ends its span too: the
// request's context ended while the page was being read (abandoned), or
// the reader stopped, which cuts the read (failed). A span started and
// never ended is never exported, and is held by its processor: after
// either, every span started has ended.
func TestAWaitCutShortEndsItsSpan(t *testing.T) {
	for _, tt := range []struct {
		name, want string
		cut        func(r *Reader, cancelRequest context.CancelFunc)
	}{
		{"the request ends", "abandoned", func(_ *Reader, cancelRequest context.CancelFunc) { cancelRequest() }},
		{"the reader stops", "failed", func(r *Reader, _ context.CancelFunc) { r.StopReadingAhead() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
			r := &Reader{ahead: newReadAhead(ReadAhead{Pages: 4, TTL: time.Minute, Reads: 1, Timeout: time.Hour})}
			defer r.StopReadingAhead()
			started, release := make(chan struct{}), make(chan struct{})
			endRead := sync.OnceFunc(func() { close(release) })
			defer endRead()
			fetch := func(ctx context.Context, _ position, _ int) ([]scannedPage, error) {
				close(started)
				select {
				case <-release:
					return []scannedPage{{body: []byte("{}")}}, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			p, _ := pageBeingReadAhead(t, r, tracer, readingWith(fetch), started)
			waiting, cancelRequest := context.WithCancel(context.Background())
			defer cancelRequest()
			waiting, waitingSpan := tracer.Start(waiting, "waiting page")
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = r.ahead.use(waiting, p)
			}()
			waitForSpanStarted(t, rec, "export read-ahead wait")
			tt.cut(r, cancelRequest)
			<-done
			waitingSpan.End()
			endRead() // a read the request gave up on goes on: it ends now
			waitForFreeSlots(t, r.ahead)
			if got := attr(spanNamed(t, rec, "export read-ahead wait"), "export.read_ahead.result"); got != tt.want {
				t.Errorf("export.read_ahead.result %q, want %s", got, tt.want)
			}
			if started, ended := len(rec.Started()), len(rec.Ended()); started != ended {
				t.Errorf("%d spans started, %d ended", started, ended)
			}
		})
	}
}

func waitForSpanStarted(t *testing.T, rec *tracetest.SpanRecorder, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, s := range rec.Started() {
			if s.Name() == name {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span %q started", name)
		}
		time.Sleep(time.Millisecond)
	}
}

func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no span %q recorded", name)
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func exceptionMessage(s sdktrace.ReadOnlySpan) string {
	for _, e := range s.Events() {
		for _, kv := range e.Attributes {
			if kv.Key == "exception.message" {
				return kv.Value.String()
			}
		}
	}
	return ""
}

// usedOnceItsReadEnds has a request of tracer ("waiting page") use p while
// it is read ahead: once its wait span has started, the read is let end
// (release closed), and the request must then be answered without error.
// It returns the request's span, ended, once r's background reads are done.
func usedOnceItsReadEnds(t *testing.T, r *Reader, tracer trace.Tracer, rec *tracetest.SpanRecorder, p *aheadPage, release chan struct{}) trace.SpanContext {
	t.Helper()
	waiting, waitingSpan := tracer.Start(context.Background(), "waiting page")
	done := make(chan error, 1)
	go func() {
		_, err := r.ahead.use(waiting, p)
		done <- err
	}()
	waitForSpanStarted(t, rec, "export read-ahead wait") // the request waits: the read ends only now
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("use: %v", err)
	}
	waitingSpan.End()
	waitForFreeSlots(t, r.ahead)
	return waitingSpan.SpanContext()
}

// readingWith is a chain of 100-item ENG pages that reads them with fetch.
func readingWith(fetch fetchFunc) *chain {
	return &chain{fetch: fetch, cursor: func(p position) string { return p.ID }, lang: "ENG", limit: 100}
}

// pageBeingReadAhead starts r reading ahead the page after item "1" on c,
// under the span of an earlier page's request of tracer, and returns that
// page once its read has started (started closed), with the earlier
// request's span.
func pageBeingReadAhead(t *testing.T, r *Reader, tracer trace.Tracer, c *chain, started <-chan struct{}) (*aheadPage, trace.SpanContext) {
	t.Helper()
	earlier, earlierSpan := tracer.Start(context.Background(), "earlier page")
	r.ahead.begin(earlier, c, position{ID: "1"}, "1")
	earlierSpan.End()
	<-started
	p, ok := r.ahead.take(aheadKey{cursor: "1", lang: "ENG", limit: 100})
	if !ok {
		t.Fatal("the page being read ahead has no entry")
	}
	return p, earlierSpan.SpanContext()
}
