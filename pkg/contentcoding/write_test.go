package contentcoding

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// WriteWhole sends a body of MinGzip bytes or more gzipped to a client
// that takes gzip, a shorter one or one to a client that does not as it
// is, each with its length and Vary: Accept-Encoding; a HEAD gets its GET's
// headers.
func TestWriteWhole(t *testing.T) {
	t.Parallel()
	long := []byte(strings.Repeat("a page of items, ", MinGzip/16+1))
	for _, tt := range []struct {
		name, method, accept string
		body                 []byte
		wantGzip             bool
	}{
		{"long, gzip taken", http.MethodGet, "gzip", long, true},
		{"long, gzip refused", http.MethodGet, "gzip;q=0, *", long, false},
		{"long, nothing said", http.MethodGet, "", long, false},
		{"short, gzip taken", http.MethodGet, "gzip", long[:MinGzip-1], false},
		{"HEAD, gzip taken", http.MethodHead, "gzip", long, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				WriteWhole(w, r, tt.body)
			}))
			defer srv.Close()
			req, _ := http.NewRequest(tt.method, srv.URL, nil)
			if tt.accept != "" {
				req.Header.Set("Accept-Encoding", tt.accept)
			}
			// The transport neither asks for gzip itself nor undoes it.
			client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
			defer client.CloseIdleConnections()
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Vary") != "Accept-Encoding" {
				t.Errorf("status %d, Vary %q, want 200 and Accept-Encoding", resp.StatusCode, resp.Header.Get("Vary"))
			}
			if gzipped := resp.Header.Get("Content-Encoding") == "gzip"; gzipped != tt.wantGzip {
				t.Fatalf("Content-Encoding %q, want gzip %v", resp.Header.Get("Content-Encoding"), tt.wantGzip)
			}
			length, err := strconv.Atoi(resp.Header.Get("Content-Length"))
			if err != nil {
				t.Fatalf("Content-Length %q: %v", resp.Header.Get("Content-Length"), err)
			}
			if tt.method == http.MethodHead {
				if len(raw) != 0 || length == 0 || length >= len(tt.body) {
					t.Errorf("HEAD: %d bytes, Content-Length %d, want none and the compressed length", len(raw), length)
				}
				return
			}
			if length != len(raw) {
				t.Errorf("Content-Length %d, body %d bytes", length, len(raw))
			}
			if tt.wantGzip {
				zr, err := gzip.NewReader(bytes.NewReader(raw))
				if err != nil {
					t.Fatal(err)
				}
				if raw, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(raw, tt.body) {
				t.Errorf("body read back = %d bytes, want the %d sent", len(raw), len(tt.body))
			}
		})
	}
}
