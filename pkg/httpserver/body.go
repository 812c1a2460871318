package httpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
)

// ErrBodyTooLarge is ReadBody's error for a body over its limit; services
// answer it 413 payload_too_large in their own error envelope.
var ErrBodyTooLarge = errors.New("httpserver: request body too large")

// ErrBodyAbandoned is ReadBody's error for a body whose caller closed the
// connection before sending it whole: services answer it as a caller that
// hung up (StatusClientClosed), so that their logs, metrics and spans do
// not count a client's 400 for a request nobody is left to read an answer.
var ErrBodyAbandoned = errors.New("httpserver: the caller closed the connection before its body was read whole")

// ReadBody reads the whole request body, at most limit bytes. A longer body
// is ErrBodyTooLarge (errors.Is), told apart from a body that could not be
// read, such as a broken-off chunked one, which is the client's fault of
// another kind, and from one its caller abandoned (ErrBodyAbandoned). The
// body is read through http.MaxBytesReader so that the server stops
// reading an over-size body instead of draining it.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, limit)
	}
	if err != nil && abandoned(r, err) {
		return nil, fmt.Errorf("%w: %w", ErrBodyAbandoned, err)
	}
	if err != nil {
		return nil, fmt.Errorf("httpserver: read body: %w", err)
	}
	return body, nil
}

// abandoned reports whether err, a failed read of r's body, is its caller
// gone: net/http cancels a request's context when its connection fails to
// read (closed or reset by the caller), but also when the read deadline
// passes (a body too slow, the caller still there) and when the drain cuts
// the request off (CutOff), neither of which is the caller leaving.
func abandoned(r *http.Request, err error) bool {
	return r.Context().Err() != nil && !errors.Is(err, os.ErrDeadlineExceeded) &&
		!errors.Is(context.Cause(r.Context()), ErrCutOff)
}
