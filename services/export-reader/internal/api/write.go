package api

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/coinexport/export/pkg/contentcoding"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/klauspost/compress/gzip"
)

// minGzip is the smallest body worth compressing; an error or a one-item
// page fits in a packet anyway.
const minGzip = 1024

// buffer is a pooled response body; a full page of 100 items is about 100 KB.
type buffer struct{ b []byte }

var buffers = sync.Pool{New: func() any { return &buffer{b: make([]byte, 0, 128<<10)} }}

func getBuffer() *buffer { b := buffers.Get().(*buffer); b.b = b.b[:0]; return b }

func putBuffer(b *buffer) {
	if cap(b.b) <= 4<<20 { // let a rare huge body go instead of pinning it
		buffers.Put(b)
	}
}

var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return w
}}

// writeJSON sends a complete 200 body, gzipped when the client accepts it.
// The body is whole before the first byte is written, so a failure half-way
// through a page can still become a clean error envelope.
func writeJSON(w http.ResponseWriter, r *http.Request, requestID string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", envelope.ContentType)
	h.Set(envelope.RequestIDHeader, requestID)
	h.Add("Vary", "Accept-Encoding")
	// One owner's catalog: no shared cache may keep it.
	h.Set("Cache-Control", "private, no-store")
	if len(body) < minGzip || !contentcoding.AcceptsGzip(r.Header.Values("Accept-Encoding")) {
		writeWhole(w, body)
		return
	}
	// Compressed whole before it is sent, so that it goes with its
	// Content-Length like any other answer, and a HEAD gets the same
	// headers as its GET (RFC 9110 9.3.2): the compressed length, without
	// the body. (Left to net/http, a compressed HEAD answer had no length
	// at all, and the gateway's client then read "until close".)
	h.Set("Content-Encoding", "gzip")
	compressed := getBuffer()
	defer putBuffer(compressed)
	gz := gzipWriters.Get().(*gzip.Writer)
	gz.Reset(compressed)
	_, _ = gz.Write(body)
	_ = gz.Close()
	gzipWriters.Put(gz)
	writeWhole(w, compressed.b)
}

// writeWhole sends a 200 with body and its length; net/http leaves the
// body out of a HEAD answer.
func writeWhole(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// Write appends p, so that a buffer is gzip's destination.
func (b *buffer) Write(p []byte) (int, error) {
	b.b = append(b.b, p...)
	return len(p), nil
}
