package api

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"strconv"

	"github.com/coinexport/export/pkg/contentcoding"
	"github.com/coinexport/export/pkg/envelope"

	"github.com/coinexport/export/services/shop-schema/internal/shopschema"
)

// minGzip is the smallest answer worth compressing, as export-reader's: a
// shop of a few categories fits in a packet anyway.
const minGzip = 1024

// writeSchema sends the schema's envelope, gzipped when the client accepts
// it (Accept-Encoding, read as export-reader reads it): a shop's schema is
// repetitive JSON, a few MB for a large shop (2,999 categories in three
// languages: 513,514 bytes, 37,110 gzipped), which a merchant's module
// asking for gzip was sent whole. Either is sent with its length, which
// it has whole: without one, the gateway read the answer whole for an
// HTTP/1.0 client (which must get a length, not chunks), and so this
// process's slot was free again while the gateway held the schema for a
// client that read it slowly, or never, bounded by no count of slots.
func writeSchema(w http.ResponseWriter, r *http.Request, result *shopschema.Result, requestID string) {
	body, err := envelope.DataBytes(result, envelope.Meta{RequestID: requestID})
	if err != nil {
		envelope.WriteError(w, http.StatusInternalServerError, "internal_error", "internal error", requestID)
		return
	}
	h := w.Header()
	h.Set("Content-Type", envelope.ContentType)
	h.Set(envelope.RequestIDHeader, requestID)
	h.Add("Vary", "Accept-Encoding")
	if len(body) >= minGzip && contentcoding.AcceptsGzip(r.Header.Values("Accept-Encoding")) {
		body = gzipped(body)
		h.Set("Content-Encoding", "gzip")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// gzipped is body compressed at gzip's best speed.
func gzipped(body []byte) []byte {
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestSpeed) // a valid level: no error
	_, _ = zw.Write(body)                              // a bytes.Buffer: no error
	_ = zw.Close()
	return out.Bytes()
}
