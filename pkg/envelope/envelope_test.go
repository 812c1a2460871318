package envelope

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// WriteDataJSON answers byte for byte what WriteData answers for the same
// data, status, headers and meta.
func TestWriteDataJSONMatchesWriteData(t *testing.T) {
	cursor := "eyJrIjoxfQ"
	data := map[string]any{"item_id": "a\"b", "stock_quantity": 1}
	encoded, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, meta := range []Meta{{RequestID: "4bf92f3577b34da6a3ce929d0e0e4736"}, {RequestID: "r\u2028", NextCursor: &cursor}} {
		want, got := httptest.NewRecorder(), httptest.NewRecorder()
		WriteData(want, http.StatusCreated, data, meta)
		WriteDataJSON(got, http.StatusCreated, encoded, meta)
		if got.Code != want.Code || got.Body.String() != want.Body.String() {
			t.Errorf("meta %+v: WriteDataJSON = %d %s, WriteData = %d %s", meta, got.Code, got.Body, want.Code, want.Body)
		}
		for _, h := range []string{"Content-Type", RequestIDHeader} {
			if got.Header().Get(h) != want.Header().Get(h) {
				t.Errorf("meta %+v: %s = %q, WriteData sets %q", meta, h, got.Header().Get(h), want.Header().Get(h))
			}
		}
	}
}
