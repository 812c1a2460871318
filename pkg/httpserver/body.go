package httpserver

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// ErrBodyTooLarge is ReadBody's error for a body over its limit; services
// answer it 413 payload_too_large in their own error envelope.
var ErrBodyTooLarge = errors.New("httpserver: request body too large")

// ReadBody reads the whole request body, at most limit bytes. A longer body
// is ErrBodyTooLarge (errors.Is), told apart from a body that could not be
// read, such as a broken-off chunked one, which is the client's fault of
// another kind. The body is read through http.MaxBytesReader so that the
// server stops reading an over-size body instead of draining it.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("httpserver: read body: %w", err)
	}
	return body, nil
}
