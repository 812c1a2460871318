package envelope

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// WriteDataJSON answers what WriteData answers for the same data, status,
// headers and meta: byte for byte, except that it writes <, > and & as they
// are where encoding/json escapes them, so then the decoded bodies agree.
func TestWriteDataJSONMatchesWriteData(t *testing.T) {
	cursor := "eyJrIjoxfQ"
	data := map[string]any{"item_id": "a\"b", "stock_quantity": 1}
	encoded, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		meta      Meta
		sameBytes bool
	}{
		{Meta{RequestID: "4bf92f3577b34da6a3ce929d0e0e4736"}, true},
		{Meta{RequestID: "r\u2028", NextCursor: &cursor}, true},
		{Meta{RequestID: "a<b&c>"}, false},
	} {
		meta := tc.meta
		want, got := httptest.NewRecorder(), httptest.NewRecorder()
		WriteData(want, http.StatusCreated, data, meta)
		WriteDataJSON(got, http.StatusCreated, func(dst []byte) []byte { return append(dst, encoded...) }, meta)
		if got.Code != want.Code || tc.sameBytes && got.Body.String() != want.Body.String() {
			t.Errorf("meta %+v: WriteDataJSON = %d %s, WriteData = %d %s", meta, got.Code, got.Body, want.Code, want.Body)
		}
		var gotValue, wantValue any
		if err := json.Unmarshal(got.Body.Bytes(), &gotValue); err != nil {
			t.Fatalf("meta %+v: WriteDataJSON wrote invalid JSON %s: %v", meta, got.Body, err)
		}
		_ = json.Unmarshal(want.Body.Bytes(), &wantValue)
		if !reflect.DeepEqual(gotValue, wantValue) {
			t.Errorf("meta %+v: WriteDataJSON decodes to %v, WriteData to %v", meta, gotValue, wantValue)
		}
		for _, h := range []string{"Content-Type", RequestIDHeader} {
			if got.Header().Get(h) != want.Header().Get(h) {
				t.Errorf("meta %+v: %s = %q, WriteData sets %q", meta, h, got.Header().Get(h), want.Header().Get(h))
			}
		}
	}
}

// An error envelope is never kept by a cache: a 404 is cacheable by default,
// and the item may exist a moment later.
func TestWriteErrorIsNotStored(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, http.StatusNotFound, "not_found", "export item not found", "r1")
	if got := w.Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("WriteError: Cache-Control = %q, want no-store", got)
	}
	if got := w.Header().Get("X-Error-Code"); got != "not_found" {
		t.Errorf("WriteError: X-Error-Code = %q, want the error's code", got)
	}
	var p Parsed
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != 404 || p.Error == nil || p.Error.Code != "not_found" || p.Meta.RequestID != "r1" {
		t.Errorf("WriteError = %d %s (%v), want 404 not_found with request id r1", w.Code, w.Body, err)
	}
}

// A 503 says when a retry is first worth it; a Retry-After the caller set
// stays, and other errors get none.
func TestWriteErrorSaysWhenToRetryAnOutage(t *testing.T) {
	tests := []struct {
		name   string
		status int
		preset string
		want   string
	}{
		{"503", http.StatusServiceUnavailable, "", "1"},
		{"503 with its own Retry-After", http.StatusServiceUnavailable, "30", "30"},
		{"500", http.StatusInternalServerError, "", ""},
		{"404", http.StatusNotFound, "", ""},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		if tt.preset != "" {
			w.Header().Set("Retry-After", tt.preset)
		}
		WriteError(w, tt.status, "code", "message", "r1")
		if got := w.Header().Get("Retry-After"); got != tt.want {
			t.Errorf("%s: Retry-After = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestWellFormedCode(t *testing.T) {
	for code, want := range map[string]bool{
		"":                           false,
		"rate_limited":               true,
		"shop_401":                   true,
		"Rate_Limited":               false,
		"bad code":                   false,
		"code\n":                     false,
		`x"y`:                        false,
		strings.Repeat("a", 64):      true,
		strings.Repeat("a", 65):      false,
		"cxr_ABCDEFGHIJKLMNOPQRSTUV": false,
	} {
		if got := WellFormedCode([]byte(code)); got != want {
			t.Errorf("WellFormedCode(%q) = %v, want %v", code, got, want)
		}
	}
}
