package edge

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/racedetector"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// Every way a GET by id (or its HEAD) can end gives its upstream
// connection back for the next request, its owner's slot and its held
// bytes: 2,000 of them over UPSTREAM_MAX_CONNS=2 all get the reader's
// answer (none a 503 for want of a free connection, nor a 504 waiting for
// one), over a handful of connections (a streamed answer's connection is
// reused only once its body has been read to its end: closed otherwise,
// each GET would dial one), and nothing is left held.
func TestEveryEndingOfAnItemGivesBackItsConnection(t *testing.T) {
	var gzipped bytes.Buffer
	zw := gzip.NewWriter(&gzipped)
	_, _ = zw.Write(bytes.Repeat([]byte(`{"id":"a1"},`), 5000))
	_ = zw.Close()
	var dialled atomic.Int64
	reader := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		item := path.Base(r.URL.Path)
		if served := r.Context().Value(servedAGet{}).(*atomic.Bool); item != "healthz" && served.CompareAndSwap(false, true) {
			dialled.Add(1)
		}
		switch item {
		case "healthz":
		case "gone":
			envelope.WriteError(w, http.StatusNotFound, "not_found", "no such item", "r")
		case "failing":
			envelope.WriteError(w, http.StatusInternalServerError, "internal_error", "internal error", "r")
		case "unchanged":
			w.WriteHeader(http.StatusNotModified)
		case "none":
			w.WriteHeader(http.StatusNoContent)
		case "gzipped":
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Length", strconv.Itoa(gzipped.Len()))
			_, _ = w.Write(gzipped.Bytes())
		default: // its size in bytes
			n, _ := strconv.Atoi(item)
			w.Header().Set("Content-Length", item)
			_, _ = w.Write(bytes.Repeat([]byte("x"), n))
		}
	}))
	// A connection counts once it serves an item: the health probe dials one
	// of its own every UPSTREAM_PROBE_INTERVAL, and counted, those made
	// the total grow with the run's length (11 in a 21 s run under -race
	// on a loaded machine).
	reader.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, servedAGet{}, new(atomic.Bool))
	}
	reader.Start()
	t.Cleanup(reader.Close)
	// The owner's cap off (0) too: no slot is taken, and request.endCall,
	// which each of these calls ends with, has none to give back.
	for _, ownerCap := range []string{"8", "0"} {
		t.Run("RATE_LIMIT_OWNER_IN_FLIGHT="+ownerCap, func(t *testing.T) {
			dialled.Store(0)
			getEveryEnding(t, reader.URL, ownerCap, &dialled)
		})
	}
}

// servedAGet keys a reader's connection's flag, set once it serves an
// item (a GET or a HEAD).
type servedAGet struct{}

// getEveryEnding is TestEveryEndingOfAnItemGivesBackItsConnection with
// the owner's cap at ownerCap, against reader, which counts its dials in
// dialled.
func getEveryEnding(t *testing.T, reader, ownerCap string, dialled *atomic.Int64) {
	g, _, _ := startInternal(t, map[string]string{"EXPORT_READER_URLS": reader, "UPSTREAM_MAX_CONNS": "2",
		"RATE_LIMIT_ENABLED": "false", "RATE_LIMIT_OWNER_IN_FLIGHT": ownerCap, "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1"}, fakeKeys{})
	want := map[string]int{"2000": 200, "0": 200, "16384": 200, "16385": 200, "100000": 200, "gzipped": 200,
		"gone": 404, "failing": 500, "unchanged": 304, "none": 204}
	items := slices.Sorted(maps.Keys(want))
	key := wellFormedKey(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 500 {
				item, method := items[i%len(items)], "GET"
				if i%3 == 0 {
					method = "HEAD"
				}
				req, _ := http.NewRequest(method, "http://"+g.Addr()+"/v1/export/items/"+item, nil)
				req.Header.Set("X-API-Key", key)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("%s %s: %v", method, item, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want[item] {
					t.Errorf("%s %s = %d, want %d", method, item, resp.StatusCode, want[item])
					return
				}
			}
		})
	}
	wg.Wait()
	// 2: the reader's connections that served an item. An ending whose
	// connection is closed rather than given back dials once per GET of
	// it, 200 (a 404 closed so dialled 202); one never given back leaves
	// the 2 connections taken and the GETs failing.
	if n := dialled.Load(); n > 8 {
		t.Errorf("2,000 GETs over UPSTREAM_MAX_CONNS=2 dialled the reader %d times, want at most 8", n)
	}
	// fasthttp gives an answer's stream back once it has written it,
	// which may be after its client has read it.
	for deadline := time.Now().Add(5 * time.Second); heldBytes(g) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of answers still held after every GET ended, want none", heldBytes(g))
		}
	}
	if g.ownerSlots == nil { // no cap: no slot taken
		return
	}
	share := g.ownerSlots[upstreamExportReader].slots
	share.mu.Lock()
	defer share.mu.Unlock()
	if len(share.held) != 0 {
		t.Errorf("owner slots held after every GET ended: %v, want none", share.held)
	}
}

// Items read into their client's answer at once (relaySmall) leave the
// buffers of pages read whole (pages) to pages: bytebufferpool keeps only
// buffers up to the size of 95 % of the buffers put back (it calibrates
// every 42,000 of a size), so once items of ~2 KB, many times more
// numerous than a sync's pages, shared their pool, a ~100 KB page's
// buffer was dropped when put back and every page read whole was read
// into a buffer made afresh: the 100 KB of garbage per page that cost the
// gateway 1.6 times its CPU per sync page (relayedStream.WriteTo).
func TestItemsLeaveThePagesBuffersPooled(t *testing.T) {
	if racedetector.Enabled {
		t.Skip("sync.Pool drops a quarter of what is put back under the race detector")
	}
	relayed := func(body []byte, relay func(resp, answer *fasthttp.Response, done callEnd) error) {
		answer, resp := fasthttp.AcquireResponse(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		answer.SetBodyStream(bytes.NewReader(body), len(body))
		if err := relay(resp, answer, endFunc(func() {})); err != nil {
			t.Fatal(err)
		}
		if err := resp.BodyWriteTo(io.Discard); err != nil { // and closes a page's stream, putting its buffer back
			t.Fatal(err)
		}
	}
	item, page := bytes.Repeat([]byte("i"), 2000), bytes.Repeat([]byte("p"), 100_000)
	for range 45_000 { // past the calibration's 42,000
		relayed(item, relaySmall)
	}
	relayed(page, relayWhole) // a buffer of a page's size, put back
	if perPage := allocatedPerRun(50, func() { relayed(page, relayWhole) }); perPage > 20_000 {
		t.Errorf("a 100 KB page read whole after 45,000 items allocated %d bytes, want its pooled buffer reused (under 20,000)", perPage)
	}
}

// allocatedPerRun is the bytes the process allocated per run of f, over
// runs of it.
func allocatedPerRun(runs int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// heldBytes is what g's heldAnswers counts held.
func heldBytes(g *Gateway) int { return g.heldAnswers.bytesHeld() }

// panicking is a body stream whose read panics.
type panicking struct{}

func (panicking) Read([]byte) (int, error) { panic("boom while reading the answer") }

// An answer whose read panics (guardedServe answers the 500) still ends
// its call once, done run and the held page given back, as a read that
// fails does, and as relaySmall's reads do: proxyUntilRelayed has handed
// both over by then. Without, the owner's slot and the page's bytes of
// heldAnswersLimit were held for the process's life.
func TestAPanicWhileReadingAPageEndsItsCallOnce(t *testing.T) {
	for name, relayed := range map[string]func(resp, answer *fasthttp.Response, done callEnd) error{
		"held whole": relayWhole,
		"small":      relaySmall,
	} {
		answer := fasthttp.AcquireResponse()
		answer.SetBodyStream(panicking{}, 100)
		var resp fasthttp.Response
		ended := 0
		func() {
			defer func() { _ = recover() }()
			_ = relayed(&resp, answer, endFunc(func() { ended++ }))
		}()
		if ended != 1 {
			t.Errorf("%s: a read that panicked ended its call %d times, want once", name, ended)
		}
	}
}

// relayWhole reads a stream for an HTTP/1.0 client up to its bound: one
// byte more is a 502 bad_gateway (nothing has been written yet), the
// answer released and its call ended (done) all the same; at the bound it
// is sent, with its length.
func TestRelayWholeBoundsTheStream(t *testing.T) {
	for _, size := range []int{readWholeWithoutLength, readWholeWithoutLength + 1} {
		answer := fasthttp.AcquireResponse()
		answer.SetBodyStream(io.LimitReader(zeros{}, int64(size)), -1)
		var resp fasthttp.Response
		ended := 0
		err := relayWhole(&resp, answer, endFunc(func() { ended++ }))
		if size > readWholeWithoutLength {
			if ae, _ := toAPIError(err); ae != errBadGateway || ended != 1 {
				t.Errorf("%d bytes: error %v, call ended %d times; want a 502 bad_gateway, the call ended once", size, err, ended)
			}
			continue
		}
		if err != nil || resp.Header.ContentLength() != size || ended != 0 {
			t.Errorf("%d bytes: error %v, Content-Length %d, call ended %d times; want the answer with its length, the call going on", size, err, resp.Header.ContentLength(), ended)
		}
		resp.Reset() // closes the stream, as fasthttp once it has written it
		if ended != 1 {
			t.Errorf("%d bytes: call ended %d times once written, want once", size, ended)
		}
	}
}

// A list page read whole (relayWhole, with its length) leaves the gateway
// as the page read into an answer's body did, cheaply: in one write besides
// the headers' buffer, not copied through the connection's write buffer
// (fasthttp's copy of a body stream without WriterTo: a write per 4 KiB
// here, per 4 KiB then 32 KiB on a TCP connection), and from a pooled
// buffer, not 100 KB of garbage a page.
// Each cost the gateway about as much CPU as the rest of the relay
// (BenchmarkGatewaySyncPage: ~290 µs a page against ~95 µs before pages
// were streamed; ~100 µs with both).
func TestAPageReadWholeLeavesInOneWriteFromAPooledBuffer(t *testing.T) {
	page := bytes.Repeat([]byte("x"), 100<<10)
	conn := &countedWrites{}
	conn.kept.Grow(2 * len(page)) // once: what the test keeps is no allocation of the relay's
	relayPage := func() (writes int) {
		answer := fasthttp.AcquireResponse()
		answer.SetBodyStream(bytes.NewReader(page), len(page))
		var resp fasthttp.Response
		ended := 0
		if err := relayWhole(&resp, answer, endFunc(func() { ended++ })); err != nil {
			t.Fatalf("relayWhole: %v", err)
		}
		conn.kept.Reset()
		conn.writes = 0
		w := bufio.NewWriterSize(conn, 4096) // fasthttp's default write buffer
		if err := resp.Write(w); err != nil || w.Flush() != nil {
			t.Fatalf("writing the answer: %v", err)
		}
		if !bytes.HasSuffix(conn.kept.Bytes(), page) || ended != 1 {
			t.Fatalf("the page did not leave whole (%d bytes written), or the call ended %d times", conn.kept.Len(), ended)
		}
		return conn.writes
	}
	if writes := relayPage(); writes > 3 {
		t.Errorf("a 100 KiB page left in %d writes, want at most 3 (headers, the rest of the buffer, the page)", writes)
	}
	if racedetector.Enabled {
		return // under the race detector sync.Pool drops a share of what it is given back: allocations mean nothing
	}
	if perPage := allocatedPerRun(50, func() { relayPage() }); perPage > 32<<10 {
		t.Errorf("relaying a 100 KiB page allocated %d bytes, want a pooled buffer", perPage)
	}
}

// A page of large items (about 5 MB) read whole is not pooled once it has
// left: its buffer would be held for the ordinary pages after it, outside
// heldAnswersLimit's count.
func TestAPageOfLargeItemsLeavesNoBufferPooled(t *testing.T) {
	page := bytes.Repeat([]byte("x"), 5<<20)
	answer := fasthttp.AcquireResponse()
	answer.SetBodyStream(bytes.NewReader(page), len(page))
	var resp fasthttp.Response
	if err := relayWhole(&resp, answer, endFunc(func() {})); err != nil {
		t.Fatalf("relayWhole: %v", err)
	}
	resp.Reset() // closes the stream, as fasthttp once it has written it
	next := pages.Get()
	defer releasePage(next)
	if cap(next.B) > maxPooledPage {
		t.Errorf("the next page's buffer holds %d bytes, want at most %d pooled", cap(next.B), maxPooledPage)
	}
}

// A list page held whole counts, against heldAnswersLimit, the buffer it
// is read into: a pooled one may have been grown by a page of up to
// maxPooledPage, and a smaller page held in it holds all of it. Counted
// by the pages' lengths, 33 pages of 1 KB in buffers of 1 MiB were counted
// 33 KB of the 32 MiB.
func TestAHeldPageCountsTheBufferItIsReadInto(t *testing.T) {
	budget := &byteBudget{limit: 32 << 20}
	grown := func() *bytebufferpool.ByteBuffer {
		return &bytebufferpool.ByteBuffer{B: make([]byte, 0, maxPooledPage)}
	}
	held := 0
	for range 32 {
		page := &heldPageEnd{budget: budget}
		if !page.growTo(grown(), 1000) {
			t.Fatalf("a 1 KB page in a buffer of %d bytes refused with %d held, want it held", maxPooledPage, held)
		}
		held += page.held
	}
	if (&heldPageEnd{budget: budget}).growTo(grown(), 1000) {
		t.Errorf("a 33rd page of 1 KB, each in a buffer of %d bytes, was held: the budget counts %d bytes of %d held",
			maxPooledPage, budget.held, 33*maxPooledPage)
	}
	budget.give(held)
}

// A page larger than its buffer counts what the buffer grows to: its
// length and what the allocation rounds it up to (its size class, or 8 KiB
// pages past 32 KiB). Counted by its length, a page of 100,001 bytes held
// 106,496 and was counted 100,001.
func TestAHeldPageCountsItsBufferOnceGrown(t *testing.T) {
	for _, length := range []int{20_001, 100_001, 5 << 20} {
		budget := &byteBudget{limit: 32 << 20}
		page, held := &bytebufferpool.ByteBuffer{}, &heldPageEnd{budget: budget}
		if !held.growTo(page, length) {
			t.Fatalf("a page of %d bytes in an empty buffer was refused", length)
		}
		if cap(page.B) < length || held.held != cap(page.B) || budget.held != cap(page.B) {
			t.Errorf("a page of %d bytes grew its buffer to %d bytes and counted %d (budget %d), want the buffer's bytes counted",
				length, cap(page.B), held.held, budget.held)
		}
	}
}

// An answer without a length (relayWithoutLength) counts its buffer
// against heldAnswersLimit while it is held, as a list page does, and gives
// it back once it has left: read outside the budget, up to 64 MiB each,
// such answers were bounded by nothing together. While other answers hold
// the budget it is the 503 errAnswersHeldFull, not the service's failure;
// one larger than the whole budget, the 502 of an answer too large.
func TestAnAnswerWithoutALengthIsHeldWithinTheBudget(t *testing.T) {
	const size = 100_000
	g := &Gateway{heldAnswers: &byteBudget{limit: 3 * size}}
	var resp fasthttp.Response
	ended := 0
	if err := g.relayWithoutLength(&resp, lengthless(size), endFunc(func() { ended++ })); err != nil {
		t.Fatalf("an answer of %d bytes without a length: %v, want it relayed", size, err)
	}
	if held := heldBytes(g); held < size || resp.Header.ContentLength() != size {
		t.Errorf("while relayed: %d bytes held, Content-Length %d; want at least %d held, and its length", held, resp.Header.ContentLength(), size)
	}
	var other fasthttp.Response
	err := g.relayWithoutLength(&other, lengthless(2*size), endFunc(func() { ended++ }))
	if ae, _ := toAPIError(err); ae != errAnswersHeldFull || ended != 1 {
		t.Errorf("another while the budget is held: %v, call ended %d times; want errAnswersHeldFull, the call ended", err, ended)
	}
	resp.Reset() // closes the stream, as fasthttp once it has written it
	if ended != 2 || heldBytes(g) != 0 {
		t.Errorf("once both ended: calls ended %d times and %d bytes held; want 2 and none", ended, heldBytes(g))
	}
	err = g.relayWithoutLength(&other, lengthless(3*size), endFunc(func() {}))
	if ae, _ := toAPIError(err); ae != errBadGateway || heldBytes(g) != 0 {
		t.Errorf("an answer as large as the whole budget: %v, %d bytes held; want the 502 bad_gateway, none held", err, heldBytes(g))
	}
	if err := g.relayWithoutLength(&other, lengthless(2*size), endFunc(func() {})); err != nil {
		t.Errorf("an answer of %d bytes with nothing else held: %v, want it relayed", 2*size, err)
	}
	other.Reset()
}

// lengthless is an answer of size bytes without a length, as
// relayWithoutLength reads.
func lengthless(size int) *fasthttp.Response {
	answer := fasthttp.AcquireResponse()
	answer.SetBodyStream(io.LimitReader(zeros{}, int64(size)), -1)
	return answer
}

// An answer without a length read into a pooled buffer that already holds
// more than the answer (a page's, up to maxPooledPage) counts that buffer
// while it is held, as a page with its length does (growTo): counted only
// once it had to grow, a 500 KB answer held in a buffer of 1 MiB was
// counted nothing, and was relayed while other answers held the budget.
func TestAnAnswerWithoutALengthCountsItsPooledBuffer(t *testing.T) {
	budget := &byteBudget{limit: 32 << 20}
	pooled := func() *bytebufferpool.ByteBuffer {
		return &bytebufferpool.ByteBuffer{B: make([]byte, 0, maxPooledPage)}
	}
	var resp fasthttp.Response
	if err := relayWholeInto(&resp, lengthless(500_000), pooled(), &heldPageEnd{budget: budget, then: endFunc(func() {})}); err != nil {
		t.Fatalf("an answer of 500,000 bytes without a length: %v, want it relayed", err)
	}
	if budget.held < maxPooledPage {
		t.Errorf("an answer of 500,000 bytes held in a buffer of %d bytes counted %d, want the buffer counted", maxPooledPage, budget.held)
	}
	resp.Reset() // closes the stream, as fasthttp once it has written it
	if budget.held != 0 {
		t.Errorf("once it has left, %d bytes held, want none", budget.held)
	}
	budget.take(budget.limit - maxPooledPage/2) // other answers'
	err := relayWholeInto(&resp, lengthless(1000), pooled(), &heldPageEnd{budget: budget, then: endFunc(func() {})})
	if ae, _ := toAPIError(err); ae != errAnswersHeldFull {
		t.Errorf("an answer of 1,000 bytes in a buffer of %d bytes with %d of %d bytes held: %v, want errAnswersHeldFull",
			maxPooledPage, budget.held, budget.limit, err)
	}
	resp.Reset()
}

// A pooled buffer larger than the whole budget allows an answer without a
// length (with a budget under maxPooledPage) is not read into: the answer
// is read into a buffer of its own, within the budget.
func TestAnAnswerWithoutALengthLeavesAPooledBufferLargerThanTheBudget(t *testing.T) {
	budget := &byteBudget{limit: 64 << 10}
	page := &bytebufferpool.ByteBuffer{B: make([]byte, 0, maxPooledPage)}
	var resp fasthttp.Response
	if err := relayWholeInto(&resp, lengthless(10_000), page, &heldPageEnd{budget: budget, then: endFunc(func() {})}); err != nil {
		t.Fatalf("an answer of 10,000 bytes without a length within a budget of %d: %v, want it relayed", budget.limit, err)
	}
	if budget.held > budget.limit || budget.held < 10_000 {
		t.Errorf("%d bytes counted for an answer of 10,000 bytes within a budget of %d", budget.held, budget.limit)
	}
	resp.Reset()
}

// readWithoutLength keeps a byte of the budget to tell an answer too large
// from one that fits: within a budget of limit bytes, with nothing else
// held, an answer of limit-1 bytes is relayed with its length, and one of
// limit bytes or more is the 502 of an answer too large, not the 503 of a
// budget others hold; with a budget nearly full, an answer that fits in
// what is left is relayed and a larger one is the 503. None counts more
// than the budget, but for what an allocation rounds up, and every one
// gives back what it held.
func TestAnAnswerWithoutALengthAtTheBudgetsEdges(t *testing.T) {
	const limit = 1 << 20
	for _, c := range []struct {
		name         string
		limit, other int
		size         int
		want         *apiError // nil: relayed
	}{
		{"a byte under the budget", limit, 0, limit - 1, nil},
		{"as large as the budget", limit, 0, limit, errBadGateway},
		{"a byte over the budget", limit, 0, limit + 1, errBadGateway},
		{"far over the budget", limit, 0, 3 * limit, errBadGateway},
		{"empty within a budget of 1", 1, 0, 0, nil},
		{"a byte within a budget of 1", 1, 0, 1, errBadGateway},
		{"within what is left of a budget nearly full", limit, limit - firstReadWithoutLength, firstReadWithoutLength - 1, nil},
		{"past what is left of a budget nearly full", limit, limit - firstReadWithoutLength, firstReadWithoutLength + 1, errAnswersHeldFull},
	} {
		budget := &byteBudget{limit: c.limit, held: c.other}
		ended := 0
		var resp fasthttp.Response
		err := relayWholeInto(&resp, lengthless(c.size), &bytebufferpool.ByteBuffer{}, &heldPageEnd{budget: budget, then: endFunc(func() { ended++ })})
		switch ae, _ := toAPIError(err); {
		case c.want == nil && (err != nil || resp.Header.ContentLength() != c.size):
			t.Errorf("%s: %v, Content-Length %d; want it relayed with %d", c.name, err, resp.Header.ContentLength(), c.size)
		case c.want != nil && ae != c.want:
			t.Errorf("%s: %v, want %s %s", c.name, err, c.want.Code, c.want.Message)
		case budget.held > c.limit+8<<10:
			t.Errorf("%s: %d bytes counted of a budget of %d, want at most what the allocation rounds up past it", c.name, budget.held, c.limit)
		}
		resp.Reset()
		if ended != 1 || budget.held != c.other {
			t.Errorf("%s: once it has ended, the call ended %d times and %d bytes held; want once and the others' %d", c.name, ended, budget.held, c.other)
		}
	}
}

// An answer without a length that breaks off, or whose read panics, after
// its buffer has grown a few times, in a pooled buffer or a new one, gives
// back every byte it counted and ends its call once.
func TestAnAnswerWithoutALengthCutShortGivesBackWhatItHeld(t *testing.T) {
	for name, body := range map[string]func() io.Reader{
		"broken off": func() io.Reader {
			return io.MultiReader(io.LimitReader(zeros{}, 300_000), iotest.ErrReader(io.ErrUnexpectedEOF))
		},
		"panicking": func() io.Reader { return io.MultiReader(io.LimitReader(zeros{}, 300_000), panicking{}) },
	} {
		for _, pooled := range []int{0, 100_000} {
			budget := &byteBudget{limit: 32 << 20, held: 1000}
			answer := fasthttp.AcquireResponse()
			answer.SetBodyStream(body(), -1)
			ended := 0
			var resp fasthttp.Response
			func() {
				defer func() { _ = recover() }()
				page := &bytebufferpool.ByteBuffer{B: make([]byte, 0, pooled)}
				err := relayWholeInto(&resp, answer, page, &heldPageEnd{budget: budget, then: endFunc(func() { ended++ })})
				if ae, _ := toAPIError(err); ae != errBadGateway {
					t.Errorf("%s in a buffer of %d: %v, want the 502 bad_gateway", name, pooled, err)
				}
			}()
			if ended != 1 || budget.held != 1000 {
				t.Errorf("%s in a buffer of %d: the call ended %d times, %d bytes held; want once and the others' 1000", name, pooled, ended, budget.held)
			}
		}
	}
}

// A buffer grown from one that holds something (a pooled page's, or the
// one an answer without a length doubles as it fills) grows to what it
// must hold, rounded up to its size class alone (at most 8 KiB past 32
// KiB), not by append's steps of a quarter past 256 bytes: grown so, a
// buffer of 20 MiB asked to hold 32 MiB became 39 MiB, 7 MiB counted past
// a budget of 32 MiB, and one of 100,000 bytes asked to hold 150,000 became
// 163,840.
func TestAHeldBufferGrowsToWhatItMustHold(t *testing.T) {
	for _, c := range []struct{ from, to int }{{4 << 10, 8 << 10}, {100_000, 150_000}, {1 << 20, 2 << 20}, {20 << 20, 32 << 20}} {
		budget := &byteBudget{limit: 32 << 20}
		page, held := &bytebufferpool.ByteBuffer{B: make([]byte, c.from)}, &heldPageEnd{budget: budget}
		if !held.growTo(page, c.to) {
			t.Fatalf("a buffer of %d bytes grown to %d refused", c.from, c.to)
		}
		if cap(page.B) < c.to || cap(page.B) >= c.to+8<<10 || budget.held != cap(page.B) || len(page.B) != c.from {
			t.Errorf("a buffer of %d bytes grown to hold %d: %d bytes (%d of them kept), %d counted; want at most 8 KiB more, counted, its bytes kept",
				c.from, c.to, cap(page.B), len(page.B), budget.held)
		}
	}
}

// relayWhole relays answer read whole, as relayAnswer does a list page,
// within a budget that holds anything.
func relayWhole(resp, answer *fasthttp.Response, done callEnd) error {
	return relayWholeInto(resp, answer, pages.Get(), &heldPageEnd{budget: &byteBudget{limit: math.MaxInt}, then: done})
}

// countedWrites is a connection that keeps what is written and counts the
// writes. It has no ReadFrom (bytes.Buffer's is not promoted), through
// which bufio would hand it the rest of a stream uncounted.
type countedWrites struct {
	kept   bytes.Buffer
	writes int
}

func (c *countedWrites) Write(p []byte) (int, error) {
	c.writes++
	return c.kept.Write(p)
}

// Every way relayAnswer relays an answer ends its call exactly once, on the
// list and item routes (StreamsLargeAnswers) and shop-schema's, for a
// client of HTTP/1.1 and of 1.0: at once for one read into the client's
// answer or one that failed, once fasthttp closes the stream for one
// handed to it (after its write, or at the response's reset), and the
// bytes of a page held whole come back. A call ended twice gives back a
// slot of another call of the same owner (inFlightSlots.release forgets a
// count at 0), which the end-to-end tests, looking at the slots left
// (TestEveryEndingOfAnItemGivesBackItsConnection), do not see.
func TestEveryRelayOfAnAnswerEndsItsCallOnce(t *testing.T) {
	const held = 100_000 // past smallAnswerBytes
	stream := func(size, length int) func() *fasthttp.Response {
		return func() *fasthttp.Response {
			answer := fasthttp.AcquireResponse()
			answer.SetBodyStream(io.LimitReader(zeros{}, int64(size)), length)
			return answer
		}
	}
	whole := func() *fasthttp.Response {
		answer := fasthttp.AcquireResponse()
		answer.SetBody([]byte(`{"data":[]}`))
		return answer
	}
	for _, c := range []struct {
		name         string
		streams      bool // the route StreamsLargeAnswers
		http11       bool
		budget       int
		answer       func() *fasthttp.Response
		failed       bool // the read fails: the error to answer
		endedAtFirst int  // before fasthttp closes the client's stream
	}{
		{"item read whole by Do (a HEAD's)", true, true, heldAnswersLimit, whole, false, 1},
		{"small item", true, true, heldAnswersLimit, stream(2000, 2000), false, 1},
		{"small item broken off", true, true, heldAnswersLimit, stream(1000, 2000), true, 1},
		{"page held whole", true, true, heldAnswersLimit, stream(held, held), false, 0},
		{"page held whole broken off", true, true, heldAnswersLimit, stream(held-1, held), true, 1},
		{"page past the budget", true, true, held - 1, stream(held, held), false, 0},
		{"page without a length", true, true, heldAnswersLimit, stream(held, -1), false, 0},
		{"page without a length, HTTP/1.0", true, false, heldAnswersLimit, stream(held, -1), false, 0},
		{"page without a length past the budget", true, true, held, stream(held, -1), true, 1},
		{"shop schema", false, true, heldAnswersLimit, stream(held, held), false, 0},
		{"shop schema without a length", false, true, heldAnswersLimit, stream(held, -1), false, 0},
		{"shop schema without a length, HTTP/1.0", false, false, heldAnswersLimit, stream(held, -1), false, 0},
		{"shop schema without a length, HTTP/1.0, past the budget", false, false, held, stream(held, -1), true, 1},
		{"shop schema read whole by Do", false, true, heldAnswersLimit, whole, false, 1},
	} {
		g := &Gateway{heldAnswers: &byteBudget{limit: c.budget}}
		var resp fasthttp.Response
		ended := 0
		err := g.relayAnswer(&resp, route{StreamsLargeAnswers: c.streams}, "", c.http11, c.answer(), endFunc(func() { ended++ }))
		if (err != nil) != c.failed || ended != c.endedAtFirst {
			t.Errorf("%s: error %v, call ended %d times; want failed %v, ended %d times", c.name, err, ended, c.failed, c.endedAtFirst)
			continue
		}
		if err == nil {
			_ = resp.BodyWriteTo(io.Discard) // fasthttp writes it to the client
		}
		resp.Reset() // closes the stream, as fasthttp once it has written it
		if ended != 1 || heldBytes(g) != 0 {
			t.Errorf("%s: once relayed, call ended %d times and %d bytes held; want once and none", c.name, ended, heldBytes(g))
		}
	}
}

// The relay of every answer that is not a failure costs no allocation of
// its own: the check that keeps the gateway's own errAnswersHeldFull off
// the instance's count, with errors.As's target declared for every answer,
// cost each GET by id and list page one (BenchmarkGateway: 15 allocs/op,
// 14 without).
func TestARelayThatDidNotFailAllocatesNothing(t *testing.T) {
	g, span := &Gateway{}, trace.SpanFromContext(context.Background())
	if n := testing.AllocsPerRun(100, func() { _ = g.countRelayFailure(upstreamExportReader, "i", span, nil) }); n != 0 {
		t.Errorf("a relay that did not fail: %v allocations, want none", n)
	}
}

// An answer whose Content-Length no budget holds, up to the largest an
// int takes (fasthttp reads any that fits), is relayed as it comes while
// other answers are held: the budget's sum of what is held and what it
// asks overflowed, take counted it held, and growing the buffer to it
// panicked, leaving the call never ended (the owner's slot and the
// upstream connection held for good) and the budget negative, bounding
// nothing from then on.
func TestAnAnswerOfAnyLengthLeavesTheBudgetBounded(t *testing.T) {
	for _, length := range []int{math.MaxInt, math.MaxInt - 1<<20, math.MaxInt/2 + 1} {
		g := &Gateway{heldAnswers: &byteBudget{limit: 32 << 20}}
		other := &heldPageEnd{budget: g.heldAnswers, then: endFunc(func() {})}
		if !other.growTo(&bytebufferpool.ByteBuffer{}, 1<<20) {
			t.Fatal("a page of 1 MiB refused by an empty budget")
		}
		answer := fasthttp.AcquireResponse()
		answer.SetBodyStream(io.LimitReader(zeros{}, 1000), length)
		var resp fasthttp.Response
		ended := 0
		err := g.relayAnswer(&resp, route{StreamsLargeAnswers: true}, "", true, answer, endFunc(func() { ended++ }))
		if err != nil || !resp.IsBodyStream() || heldBytes(g) != other.held {
			t.Errorf("an answer of %d bytes with %d held = %v, streamed %v, %d bytes held; want it streamed, the budget unchanged",
				length, other.held, err, resp.IsBodyStream(), heldBytes(g))
		}
		resp.Reset() // closes the stream, as fasthttp once it has written it (or failed to)
		other.endCall()
		if ended != 1 || heldBytes(g) != 0 {
			t.Errorf("an answer of %d bytes, once relayed: call ended %d times, %d bytes held; want once, none", length, ended, heldBytes(g))
		}
	}
}

// closeCounted is a body stream that counts its closes (fasthttp closes a
// response's stream when the response is released).
type closeCounted struct {
	io.Reader
	closes *int
}

func (s closeCounted) Close() error {
	*s.closes++
	return nil
}

// A panic in relayAnswer releases the answer and ends the call exactly
// once, gives back what the budget counted for it, and is still a panic
// for guardedServe to answer, wherever it comes: before a way of
// relaying has taken the answer (the panic 8af2e97 removed, a budget
// that takes an answer's length near the largest int, here one of that
// limit, whose buffer cannot be made), or in a way of relaying, which
// cleans up after itself (a read that panics). proxyUntilRelayed hands
// both over as it calls relayAnswer; before, nothing cleaned up after the
// first kind, and the owner's slot and the upstream connection were held
// for the process's life.
func TestAPanicInRelayAnswerEndsItsCallOnce(t *testing.T) {
	for _, tt := range []struct {
		name   string
		limit  int
		body   io.Reader
		length int
	}{
		{"growing a page's buffer", math.MaxInt, io.LimitReader(zeros{}, 1000), math.MaxInt},
		{"reading a small answer", 32 << 20, panicking{}, 100},
		{"reading a page whole", 32 << 20, panicking{}, 100_000},
		{"reading an answer without a length", 32 << 20, panicking{}, -1},
	} {
		g := &Gateway{heldAnswers: &byteBudget{limit: tt.limit}}
		answer := fasthttp.AcquireResponse()
		closes := 0
		answer.SetBodyStream(closeCounted{tt.body, &closes}, tt.length)
		var resp fasthttp.Response
		ended := 0
		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = g.relayAnswer(&resp, route{StreamsLargeAnswers: true}, "", true, answer, endFunc(func() { ended++ }))
			return nil
		}()
		if recovered == nil || ended != 1 || closes != 1 || heldBytes(g) != 0 {
			t.Errorf("%s, panicking: panic %v, call ended %d times, answer's stream closed %d times, %d bytes held; want a panic, once, once, none",
				tt.name, recovered, ended, closes, heldBytes(g))
		}
	}
}

// Through the gateway: the request that panicked while its answer was
// relayed (a 500) gives back its owner's slot, and only its own: another
// call of the owner's in flight keeps its slot.
func TestAPanicWhileRelayingGivesTheOwnersSlotBackOnce(t *testing.T) {
	upstream := testenv.ServeConns(t, func(conn net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
			return
		}
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n{}", math.MaxInt)
	})
	g, _ := startWithHook(t, map[string]string{"EXPORT_READER_URLS": "http://" + upstream,
		"RATE_LIMIT_OWNER_IN_FLIGHT": "3", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT": "1"},
		func(g *Gateway) { g.keys, g.heldAnswers = fakeKeys{}, &byteBudget{limit: math.MaxInt} })
	slots := g.ownerSlots[upstreamExportReader].slots
	slots.acquire("o1") // another call of o1's, in flight throughout
	resp, env := get(t, "http://"+g.Addr()+"/v1/export/items/a1", map[string]string{"X-API-Key": wellFormedKey(t)})
	if resp.StatusCode != 500 || env.Error == nil || env.Error.Code != "internal_error" {
		t.Fatalf("GET of an item whose relay panics = %d %+v, want 500 internal_error", resp.StatusCode, env.Error)
	}
	slots.mu.Lock()
	held := slots.held["o1"]
	slots.mu.Unlock()
	if held != 1 || heldBytes(g) != 0 {
		t.Errorf("after the call that panicked: o1 holds %d export slots, %d bytes held; want 1 (the other call's), none", held, heldBytes(g))
	}
}

// A panic in relay before it has handed the answer over (to the client's
// response as its stream, or released it) is relayAnswer's to clean up
// after, exactly once: relayAnswer marks the answer handed over only once
// relay has returned. Here the client's response is missing (relay's first
// step panics), for an answer relayed as it comes on a route that does not
// stream large answers, and for one that found the held-answers budget
// full, where relayAnswer's end is the page's (nothing held) and then the
// call's. Marked before relay's call, neither answer was released nor its
// call ended.
func TestAPanicInRelayBeforeItHandsOverEndsItsCallOnce(t *testing.T) {
	for _, tt := range []struct {
		name    string
		streams bool
	}{
		{"a route whose answers are relayed as they come", false},
		{"a page past the held-answers budget", true},
	} {
		g := &Gateway{heldAnswers: &byteBudget{limit: 1000}}
		answer := fasthttp.AcquireResponse()
		closes := 0
		answer.SetBodyStream(closeCounted{io.LimitReader(zeros{}, 100_000), &closes}, 100_000)
		ended := 0
		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = g.relayAnswer(nil, route{StreamsLargeAnswers: tt.streams}, "", true, answer, endFunc(func() { ended++ }))
			return nil
		}()
		if recovered == nil || ended != 1 || closes != 1 || heldBytes(g) != 0 {
			t.Errorf("%s, relay panicking: panic %v, call ended %d times, answer's stream closed %d times, %d bytes held; want a panic, once, once, none",
				tt.name, recovered, ended, closes, heldBytes(g))
		}
		if tt.streams && g.heldAnswers.streamed.Load() != 1 {
			t.Errorf("%s: %d answers found the budget full, want 1", tt.name, g.heldAnswers.streamed.Load())
		}
	}
}
