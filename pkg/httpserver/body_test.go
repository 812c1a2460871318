package httpserver

import (
	"errors"
	"io"
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
