package httpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReadBody(t *testing.T) {
	t.Parallel()
	const limit = 16
	for _, tt := range []struct {
		name     string
		size     int
		tooLarge bool
	}{
		{"empty", 0, false},
		{"under the limit", limit - 1, false},
		{"exactly at the limit", limit, false},
		{"one byte over", limit + 1, true},
		{"far over", 10 * limit, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sent := strings.Repeat("x", tt.size)
			r := httptest.NewRequest("POST", "/", strings.NewReader(sent))
			body, err := ReadBody(httptest.NewRecorder(), r, limit)
			if tt.tooLarge {
				if !errors.Is(err, ErrBodyTooLarge) || body != nil {
					t.Errorf("ReadBody(%d bytes) = %d bytes, %v, want ErrBodyTooLarge", tt.size, len(body), err)
				}
				return
			}
			if err != nil || string(body) != sent {
				t.Errorf("ReadBody(%d bytes) = %d bytes, %v, want the body", tt.size, len(body), err)
			}
		})
	}
}

// A body that breaks off is an error, but not ErrBodyTooLarge.
func TestReadBodyUnreadable(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest("POST", "/", io.MultiReader(strings.NewReader("{"), errReader{}))
	_, err := ReadBody(httptest.NewRecorder(), r, 16)
	if err == nil || errors.Is(err, ErrBodyTooLarge) {
		t.Errorf("ReadBody(broken body) error = %v, want a read error other than ErrBodyTooLarge", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// Only a cancellation after the caller left is the caller's doing; any
// other error stays a failure of the service, hang-up or not.
func TestCallerGone(t *testing.T) {
	gone, hangUp := context.WithCancel(context.Background())
	hangUp()
	cutOff, cut := context.WithCancelCause(context.Background())
	cut(ErrCutOff)
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"hung up, cancelled", gone, context.Canceled, true},
		{"cut off by the drain", cutOff, context.Canceled, false},
		{"hung up, cancellation wrapped", gone, fmt.Errorf("query: %w", context.Canceled), true},
		{"hung up, another failure", gone, errors.New("scan: wrong number of columns"), false},
		{"still waiting, cancelled by something else", context.Background(), context.Canceled, false},
		{"still waiting, a deadline", context.Background(), context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(tt.ctx)
		if got := CallerGone(r, tt.err); got != tt.want {
			t.Errorf("%s: CallerGone = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A body its caller stops sending, closing the connection, is
// ErrBodyAbandoned, through a real net/http server (which cancels the
// request's context when its connection fails to read); a body that breaks
// off with the caller still there is not.
func TestReadBodyAbandonedByItsCaller(t *testing.T) {
	got := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := ReadBody(w, r, 1<<10)
		got <- err
	}))
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "POST /v1/x HTTP/1.1\r\nHost: svc\r\nContent-Length: 100\r\n\r\n{\"external"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := <-got; !errors.Is(err, ErrBodyAbandoned) {
		t.Errorf("ReadBody of a body its caller abandoned = %v, want ErrBodyAbandoned", err)
	}

	r := httptest.NewRequest("POST", "/", io.MultiReader(strings.NewReader("{"), errReader{}))
	if _, err := ReadBody(httptest.NewRecorder(), r, 16); err == nil || errors.Is(err, ErrBodyAbandoned) {
		t.Errorf("ReadBody(broken body, caller there) = %v, want a read error other than ErrBodyAbandoned", err)
	}
}
