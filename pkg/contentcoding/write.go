package contentcoding

import (
	"bytes"
	"net/http"
	"strconv"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// MinGzip is the smallest body worth compressing: an error or a short
// answer fits in a packet anyway.
const MinGzip = 1024

// WriteWhole sends a 200 with body and its Content-Length, gzipped at
// gzip's best speed when body is at least MinGzip bytes and r's
// Accept-Encoding takes gzip (AcceptsGzip); it varies by Accept-Encoding
// either way. The caller sets the other headers first.
//
// A compressed body is compressed whole before it is sent, so that it goes
// with its Content-Length like any other answer, and a HEAD gets the same
// headers as its GET (RFC 9110 9.3.2): the compressed length, without the
// body (net/http leaves it out). Left to net/http, a compressed HEAD
// answer had no length at all, and the gateway's client then read "until
// close".
func WriteWhole(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Add("Vary", "Accept-Encoding")
	if len(body) < MinGzip || !AcceptsGzip(r.Header.Values("Accept-Encoding")) {
		writeWhole(w, body)
		return
	}
	w.Header().Set("Content-Encoding", "gzip")
	compressed := compressedBodies.Get().(*bytes.Buffer)
	compressed.Reset()
	gz := gzipWriters.Get().(*gzip.Writer)
	gz.Reset(compressed)
	_, _ = gz.Write(body) // into a bytes.Buffer: no error
	_ = gz.Close()
	gzipWriters.Put(gz)
	writeWhole(w, compressed.Bytes())
	if compressed.Cap() <= 4<<20 { // let a rare huge body go instead of pinning it
		compressedBodies.Put(compressed)
	}
}

func writeWhole(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// gzipWriters and compressedBodies recycle what a compression needs from
// one answer to the next, as export-reader's pages (a sync's, one after
// another) come.
var (
	gzipWriters = sync.Pool{New: func() any {
		w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed) // a valid level: no error
		return w
	}}
	compressedBodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}
)
