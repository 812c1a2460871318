package api

import (
	"net/http"
	"sync"

	"github.com/coinexport/export/pkg/contentcoding"
	"github.com/coinexport/export/pkg/envelope"
)

// buffer is a pooled response body; a full page of 100 items is about 100 KB.
type buffer struct{ b []byte }

var buffers = sync.Pool{New: func() any { return &buffer{b: make([]byte, 0, 128<<10)} }}

func getBuffer() *buffer { b := buffers.Get().(*buffer); b.b = b.b[:0]; return b }

func putBuffer(b *buffer) {
	if cap(b.b) <= 4<<20 { // let a rare huge body go instead of pinning it
		buffers.Put(b)
	}
}

// writeJSON sends a complete 200 body, gzipped when the client accepts it
// (contentcoding.WriteWhole). The body is whole before the first byte is
// written, so a failure half-way through a page can still become a clean
// error envelope.
func writeJSON(w http.ResponseWriter, r *http.Request, requestID string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", envelope.ContentType)
	h.Set(envelope.RequestIDHeader, requestID)
	// One owner's catalog: no shared cache may keep it.
	h.Set("Cache-Control", envelope.PrivateCacheControl)
	contentcoding.WriteWhole(w, r, body)
}
