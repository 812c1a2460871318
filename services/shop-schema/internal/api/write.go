package api

import (
	"net/http"

	"github.com/coinexport/export/pkg/contentcoding"
	"github.com/coinexport/export/pkg/envelope"
)

// writeSchema sends the schema's envelope, gzipped when the client accepts
// it (contentcoding.WriteWhole, as export-reader's pages): a shop's schema
// is repetitive JSON, a few MB for a large shop (2,999 categories in three
// languages: 513,514 bytes, 37,110 gzipped by the standard library's gzip,
// which klauspost's, used since, is within 0.3 % of), which a merchant's module
// asking for gzip was sent whole. Either is sent with its length, which
// it has whole: without one, the gateway read the answer whole for an
// HTTP/1.0 client (which must get a length, not chunks), and so this
// process's slot was free again while the gateway held the schema for a
// client that read it slowly, or never, bounded by no count of slots.
func writeSchema(w http.ResponseWriter, r *http.Request, body []byte, requestID string) {
	h := w.Header()
	h.Set("Content-Type", envelope.ContentType)
	h.Set(envelope.RequestIDHeader, requestID)
	// A shop's schema, read with its ws_key: no cache may keep it.
	h.Set("Cache-Control", envelope.PrivateCacheControl)
	contentcoding.WriteWhole(w, r, body)
}
