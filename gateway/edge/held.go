package edge

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/coinexport/export/gateway/upstream"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
)

// heldAnswersLimit bounds the bytes of list pages and items (past
// smallAnswerBytes) a gateway holds whole at once, each from its read
// until its client has taken it: 320 ordinary pages of 100 items, or 6
// pages of large items, or 32 items of 1 MiB. Without it nothing did: with
// 160 items of 1 MB (pages of 5.2 MB), 48 syncs at once held 302 MB in the
// gateway, and one key's connections reading slowly 853 MB, past the 256
// Mi of deploy/k8s's gateway pod, which serves every tenant; 400
// connections reading 1 MB items slowly, 820 MB (93 MB with items held to
// it). A var for the tests.
var heldAnswersLimit = 32 << 20

// byteBudget counts bytes held against a limit.
type byteBudget struct {
	mu    sync.Mutex
	held  int
	limit int
	// streamed and refused count the answers that found the budget full:
	// relayed as they come (with their length), or refused 503 (without
	// one). /metrics reads them (watchHeld): how often the bound bites.
	streamed, refused atomic.Uint64
}

// bytesHeld is the bytes counted held now.
func (b *byteBudget) bytesHeld() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// take counts n bytes held, or reports that they would pass the limit.
// n is compared with what is left, not added to what is held: it comes
// from an answer's Content-Length, which fasthttp reads up to the largest
// int, and the sum of such a length and the bytes held overflowed, was
// taken for within the limit, and left the budget negative, bounding
// nothing.
func (b *byteBudget) take(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit-b.held {
		return false
	}
	b.held += n
	return true
}

// add counts n bytes held, past the limit if need be.
func (b *byteBudget) add(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held += n
}

// give counts n bytes take counted as no longer held.
func (b *byteBudget) give(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
}

// callEnd ends a call once its answer has left the gateway
// (proxyUntilRelayed): it gives back what the call held, its owner's slot
// (request.endCall) or its address's shop schema slot (endFunc), and the
// bytes of a page held whole (heldPageEnd). An interface, not a func: the
// request ends its owner's call itself, where a closure over it cost every
// GET by id and list page an allocation of 128 bytes (BenchmarkGateway).
type callEnd interface{ endCall() }

// endFunc is a func that ends a call.
type endFunc func()

func (f endFunc) endCall() { f() }

// heldPageEnd ends a call whose answer was held whole within budget: the
// bytes its buffer held (held) are given back, then the call ends as then
// says.
type heldPageEnd struct {
	budget *byteBudget
	held   int
	then   callEnd
}

func (e *heldPageEnd) endCall() {
	e.budget.give(e.held)
	e.then.endCall()
}

// growTo grows page, a pooled buffer, to hold at least n bytes, and counts
// held the buffer's whole capacity, which may be far more than n (up to
// maxPooledPage, a buffer last grown by a larger page): counted by the
// answers' lengths, a page held in a buffer of 1 MiB counted only its own
// bytes, and the budget no longer bounded the memory its pages held. It
// reports false, the buffer not grown, when that would pass the budget.
// What an allocation rounds up past n (its size class: at most 8 KiB past
// 32 KiB) is counted once made, past the budget if need be: counted by n
// alone, a buffer's first growth went uncounted by up to 25 % (32 KiB and
// a byte held in 40 KiB; 100,001 bytes in 106,496).
// The buffer is grown to n alone (grownTo), not by append's steps.
func (e *heldPageEnd) growTo(page *bytebufferpool.ByteBuffer, n int) bool {
	if want := max(cap(page.B), n); want > e.held {
		if !e.budget.take(want - e.held) {
			return false
		}
		e.held = want
	}
	page.B = grownTo(page.B, n)
	if rounded := cap(page.B) - e.held; rounded > 0 {
		e.budget.add(rounded)
		e.held += rounded
	}
	return true
}

// refuse counts an answer without a length refused for the budget, read
// bytes of it read, and is its error: errAnswersHeldFull, with the figures
// that say why for the cause's log line (the access line names only the
// instance the answer came from).
func (e *heldPageEnd) refuse(read int) error {
	e.budget.refused.Add(1)
	return fmt.Errorf("%w: %d bytes of an answer without a length read, %d bytes of other answers held whole, of at most %d",
		errAnswersHeldFull, read, e.budget.bytesHeld()-e.held, e.budget.limit)
}

// grownTo is b with room for n bytes, its bytes kept: a slice made for n
// alone, whose capacity is n rounded up to its size class. Grown by
// append (slices.Grow on b), a buffer that held something grew by steps
// of a quarter past what it was asked for: a buffer of 20 MiB asked to
// hold 32 MiB held 39 MiB, counted past the budget.
func grownTo(b []byte, n int) []byte {
	if cap(b) >= n {
		return b
	}
	return append(slices.Grow([]byte(nil), n), b...) // from nothing, append grows to n exactly
}

// readWholeWithoutLength bounds a streamed answer without a length read
// whole (relayWithoutLength), with heldAnswersLimit: export-reader's bound
// (readWholeUpTo), far above a large shop's full schema (a few MB) or a
// list page (about 5 MB).
const readWholeWithoutLength = 64 << 20

// errTooLargeWithoutLength is a streamed answer without a length larger
// than the gateway reads whole: a 502, the answer being one the gateway
// does not frame.
var errTooLargeWithoutLength = fmt.Errorf("%w: a streamed answer without a length larger than the gateway holds whole is not relayed",
	upstream.ErrBadResponse)

// firstReadWithoutLength is the buffer an answer without a length is first
// read into, doubled as it fills.
const firstReadWithoutLength = 4 << 10

// relayWithoutLength is relay for a streamed answer read whole first
// (proxyUntilRelayed): one of unknown length on the export routes, or to a
// client of HTTP/1.0.
// On the export routes it comes from no export-reader (each of its
// answers has its length), but from something in front of it or broken:
// read whole, one broken off is the 502 envelope, not a 200 cut short, as
// when every answer of theirs was read whole.
// To a client of HTTP/1.0 it comes only from a shop-schema of a build
// before its answer carried its length (mid-upgrade), to a client that
// fasthttp does not read as HTTP/1.1 (1.0, or 1.2 and up, served by 1.0's
// rules): the answer read here is held in the gateway, the service's slot
// free again, for as long as the client takes to read it. fasthttp frames
// such a stream chunked, whatever the client, and RFC 9112 7.1 forbids
// chunked towards HTTP/1.0 (a client that implements 1.0 alone reads the
// chunk sizes as part of the body).
// The answer is read whole, its buffer counted against heldAnswersLimit as
// it grows, as a list page's is (read outside it, up to 64 MiB each, such
// answers were not bounded together), and sent with its Content-Length,
// still as a stream, so that done runs once it has left, as relay's. A
// read that fails is the error to answer (nothing was written yet): a 502
// past readWholeWithoutLength or of the whole budget or more, and a 503
// with Retry-After while other answers hold the budget
// (errAnswersHeldFull); done has run.
func (g *Gateway) relayWithoutLength(resp, answer *fasthttp.Response, done callEnd) error {
	return relayWholeInto(resp, answer, pages.Get(), &heldPageEnd{budget: g.heldAnswers, then: done})
}

// relayWholeInto reads the answer whole into page, a buffer of pages
// counted held (held, which ends the call) and given back once the answer
// has left, and hands it to fasthttp as a stream: a page of a sync made
// afresh each time cost the gateway 110 KB of garbage per ~100 KB page
// (BenchmarkGatewaySyncPage).
func relayWholeInto(resp, answer *fasthttp.Response, page *bytebufferpool.ByteBuffer, held *heldPageEnd) error {
	done := callEnd(held)
	handedOver := false
	defer func() { // after a read that failed, or panicked: proxyUntilRelayed no longer ends the call
		if !handedOver {
			releasePage(page)
			fasthttp.ReleaseResponse(answer)
			done.endCall()
		}
	}()
	if err := readWhole(answer, page, held); err != nil {
		return err
	}
	answer.Header.CopyTo(&resp.Header)
	resp.SetBodyStream(&relayedStream{Reader: bytes.NewReader(page.B), page: page, answer: answer, done: done}, page.Len())
	handedOver = true
	return nil
}

// smallAnswerBytes is the size up to which an answer asked for as a
// stream (StreamsLargeAnswers) is read into the client's response at once
// and its call ended (relaySmall), as the other routes' answers are: 8 of
// make bench's items (~2 KB each), and the last short page of a sync. Such
// answers weigh no more than a sale's answer or an error, and counting
// them against heldAnswersLimit, or holding the owner's slot while a slow
// client reads them, would bound nothing that matters.
const smallAnswerBytes = 16 << 10

// relaySmall is relay for a streamed answer of at most smallAnswerBytes
// (by its Content-Length): it is read into resp's body, the upstream connection
// given back and done run before the client reads it. Read into resp
// (pooled, as every response's body) through a pooled buffer (smallAnswers), a GET by id
// asked for as a stream costs the gateway about what one read whole does
// (BenchmarkGateway). A read that fails is the error to answer (502, or
// 504 on a timeout); done has run.
func relaySmall(resp, answer *fasthttp.Response, done callEnd) error {
	defer done.endCall()
	defer fasthttp.ReleaseResponse(answer)
	page := smallAnswers.Get()
	defer smallAnswers.Put(page)
	if err := readWhole(answer, page, nil); err != nil {
		return err
	}
	answer.Header.CopyTo(&resp.Header)
	resp.SetBody(page.B)
	return nil
}

// readWhole reads answer's body stream into page, its Content-Length's
// bytes (within heldAnswersLimit or smallAnswerBytes: proxyUntilRelayed)
// or, without one, as readWithoutLength does, counted in held, and closes
// the stream: the upstream connection is reused only after a read that
// did not fail.
func readWhole(answer *fasthttp.Response, page *bytebufferpool.ByteBuffer, held *heldPageEnd) error {
	stream := answer.BodyStream()
	var err error
	if length := answer.Header.ContentLength(); length >= 0 {
		page.B = slices.Grow(page.B[:0], length)[:length]
		_, err = io.ReadFull(stream, page.B)
		if err != nil {
			err = upstreamReadError(err)
		}
	} else {
		err = readWithoutLength(stream, page, held)
	}
	if closer, ok := stream.(fasthttp.ReadCloserWithError); ok {
		_ = closer.CloseWithError(err) // with an error, the connection is not reused
	}
	return err
}

// readWithoutLength reads stream, an answer without a length, into page
// up to its end, growing page as it fills, its buffer and each growth
// counted in held first: past readWholeWithoutLength, or of the budget's
// whole limit or more (one of exactly the limit too: a byte is kept to
// tell it from a larger one), it is errTooLargeWithoutLength, and while
// other answers hold the budget errAnswersHeldFull.
func readWithoutLength(stream io.Reader, page *bytebufferpool.ByteBuffer, held *heldPageEnd) error {
	// A byte under the budget's limit, so that the buffer that finds an
	// answer one byte too large is within it: a growth refused is then
	// other answers' doing.
	limit := min(readWholeWithoutLength, held.budget.limit-1)
	page.B = page.B[:0]
	if cap(page.B) > limit+1 { // pooled, larger than the whole budget (a budget under maxPooledPage): left to the collector
		page.B = nil
	}
	// The pooled buffer is counted before it is read into, as a page's
	// with its length is: counted only once it had to grow, an answer that
	// fit in a buffer of up to maxPooledPage was counted nothing, and
	// relayed while other answers held the budget.
	if !held.growTo(page, cap(page.B)) {
		return held.refuse(0)
	}
	for {
		if len(page.B) == cap(page.B) {
			if len(page.B) > limit {
				return errTooLargeWithoutLength
			}
			next := min(max(2*cap(page.B), firstReadWithoutLength), limit+1)
			if !held.growTo(page, next) {
				return held.refuse(len(page.B))
			}
		}
		n, err := stream.Read(page.B[len(page.B):cap(page.B)])
		page.B = page.B[:len(page.B)+n]
		switch {
		case err == io.EOF && len(page.B) > limit:
			return errTooLargeWithoutLength
		case err == io.EOF:
			return nil
		case err != nil:
			return upstreamReadError(err)
		}
	}
}

// pages pools the buffers of answers read whole (relayWholeInto). One over
// maxPooledPage (a page of large items, up to about 5 MB) is left to the
// collector, as export-reader does with its own: pooled, a few such pages
// would pin their buffers for the ordinary pages after them, outside
// heldAnswersLimit's count.
var pages bytebufferpool.Pool

// smallAnswers pools the buffers of answers relaySmall reads, apart from
// pages: bytebufferpool keeps only buffers up to the size of 95 % of those
// put back (it calibrates every 42,000 of a size), and items of ~2 KB,
// far more numerous than a sync's pages, had every page's buffer dropped
// when put back, each page read into one made afresh
// (TestItemsLeaveThePagesBuffersPooled).
var smallAnswers bytebufferpool.Pool

// maxPooledPage is the largest buffer pages keeps: 10 ordinary pages.
const maxPooledPage = 1 << 20

func releasePage(page *bytebufferpool.ByteBuffer) {
	if cap(page.B) <= maxPooledPage {
		pages.Put(page)
	}
}
