package edge

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/coinexport/export/gateway/upstream"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
)

// upstreamReadError names the kind of a failure to read an answer's body
// as upstream.Do names those of an answer read whole: a timeout is a 504,
// anything else a broken answer, a 502.
func upstreamReadError(err error) error {
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Errorf("%w: reading the answer: %w", upstream.ErrTimeout, err)
	}
	return fmt.Errorf("%w: reading the answer: %w", upstream.ErrBadResponse, err)
}

// relay moves answer into resp and releases answer, then calls done; for a
// streamed answer, both once the stream is closed (written, or failed),
// and readFailed with the failure to read it from the service, if it
// failed so (a 200 its client got cut short).
func relay(resp, answer *fasthttp.Response, done callEnd, readFailed func(error)) {
	answer.Header.CopyTo(&resp.Header)
	if !answer.IsBodyStream() {
		resp.SetBody(answer.Body())
		fasthttp.ReleaseResponse(answer)
		done.endCall()
		return
	}
	resp.SetBodyStream(&relayedStream{Reader: answer.BodyStream(), answer: answer, done: done, readFailed: readFailed},
		answer.Header.ContentLength())
}

// relayedStream is an upstream answer's body stream as the client's
// response holds it: fasthttp closes it once it has written it (or failed
// to), and that is when the call ends.
type relayedStream struct {
	io.Reader
	// page holds the answer relayWholeInto read whole (Reader reads it),
	// nil for one relayed as it comes.
	page   *bytebufferpool.ByteBuffer
	answer *fasthttp.Response
	done   callEnd
	once   sync.Once
	// readFailed, when set, is told of readErr, the first failure to read
	// the stream from the service (not a write's to the client), once the
	// stream is closed: the client got a 200 cut short, which its access
	// line cannot tell, so gateway_upstream_errors_total counts it. Not a
	// timeout: the stream is read from the service as fast as its client
	// takes it, so UPSTREAM_READ_TIMEOUT passing mid-stream is as likely a
	// slow client's (a 5 MB page at under 170 KB/s) as a stalled
	// instance's, and counted under the instance it would set off its
	// alerts for clients' slowness.
	readFailed func(error)
	readErr    error
	// client is the client's connection, told of the answer it writes
	// (noteAnswer): nil for a connection that is no answerConn.
	client *answerConn
}

// Read reads the answer, keeping its first failure (readErr).
func (s *relayedStream) Read(p []byte) (int, error) {
	n, err := s.Reader.Read(p)
	if err != nil && err != io.EOF && s.readErr == nil {
		s.readErr = err
	}
	return n, err
}

// WriteTo writes the rest of the answer to w. fasthttp copies a body
// stream through WriteTo when it has one; without, it copied a page read
// whole (a bytes.Reader) through the connection's write buffer and the
// connection's ReadFrom, in chunks, not in the one write it takes, and
// relaying a ~100 KB sync page (with a buffer made afresh for each) cost
// the gateway 3 times the CPU of a page read into the answer's body,
// 1.6 times with WriteTo alone (BenchmarkGatewaySyncPage,
// TestAPageReadWholeLeavesInOneWriteFromAPooledBuffer). A stream that is
// no WriterTo is copied as before.
//
// A page written so goes through fasthttp's write buffer in one Write,
// which flushes the buffer full (the answer's head and the page's first
// bytes) and, when what is left cannot fit in the buffer, writes that
// directly: the client's connection holds the first of those writes to
// send it with the second in one writev (answerConn.holdNextWrite), a
// syscall and a wake-up of the client less per page. What is left always
// is too much for the buffer from two buffers' worth of page on; a smaller
// page is not held, which would only copy the flush.
func (s *relayedStream) WriteTo(w io.Writer) (n int64, err error) {
	page, ok := s.Reader.(io.WriterTo)
	if !ok {
		return io.Copy(w, struct{ io.Reader }{s}) // through Read, not back into WriteTo
	}
	if s.client != nil && s.page != nil && len(s.page.B) >= 2*clientWriteBufferSize {
		s.client.holdNextWrite()
		defer func() {
			if sendErr := s.client.sendHeld(); err == nil {
				err = sendErr
			}
		}()
	}
	return page.WriteTo(w)
}

// CloseWithError closes the upstream stream, passing on the write's error
// (with one, fasthttp drops the upstream connection instead of reusing it),
// then releases the answer and calls done.
func (s *relayedStream) CloseWithError(err error) error {
	s.once.Do(func() {
		if stream, ok := s.Reader.(fasthttp.ReadCloserWithError); ok {
			_ = stream.CloseWithError(err)
		}
		if s.page != nil {
			releasePage(s.page)
		}
		fasthttp.ReleaseResponse(s.answer)
		s.done.endCall()
		if s.readErr != nil && s.readFailed != nil {
			if err := upstreamReadError(s.readErr); !errors.Is(err, upstream.ErrTimeout) {
				s.readFailed(err)
			}
		}
	})
	return nil
}
