package catalog_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/google/go-cmp/cmp"
)

func TestRenderAndCompose(t *testing.T) {
	t.Parallel()
	line := `{"id":"c\"1","status":"active","price":7,"currency":"EUR","category":{"id":"x"},` +
		`"images":[{"id":"i","url":"https://x.test/a.jpg","position":3,"type":"edge"}],` +
		`"texts":{"ENG":{"title":"Eng <b> \"q\"","description":"Eng desc\u2028"},"RUS":{"title":"Рус"}}}`
	items, err := catalog.ParseJSONL(strings.NewReader(line))
	if err != nil {
		t.Fatalf("ParseJSONL() error = %v", err)
	}
	updated := time.Date(2026, 10, 15, 12, 0, 1, 5000, time.FixedZone("EET", 2*3600))
	tests := []struct {
		lang, status string
		want         map[string]any
	}{
		{"ENG", "active", map[string]any{"title": "Eng <b> \"q\"", "description": "Eng desc\u2028", "status": "active", "stock_quantity": 1.0}},
		// RUS has its own title and no description: the description falls back to ENG.
		{"RUS", "inactive", map[string]any{"title": "Рус", "description": "Eng desc\u2028", "status": "inactive", "stock_quantity": 0.0}},
		// UKR is missing: everything falls back to ENG.
		{"UKR", "active", map[string]any{"title": "Eng <b> \"q\"", "description": "Eng desc\u2028", "status": "active", "stock_quantity": 1.0}},
	}
	for _, tt := range tests {
		doc := catalog.Compose(nil, tt.status, updated, catalog.Render(&items[0], tt.lang))
		var got map[string]any
		if err := json.Unmarshal(doc, &got); err != nil {
			t.Fatalf("Compose(%s) = %s, not JSON: %v", tt.lang, doc, err)
		}
		want := map[string]any{
			"id": `c"1`, "coin_id": nil, "price": 7.0, "currency": "EUR", "category": map[string]any{"id": "x"},
			"characteristics": map[string]any{}, "updated_at": "2026-10-15T10:00:01.000005Z",
			"images": []any{map[string]any{"id": "i", "url": "https://x.test/a.jpg", "position": 3.0, "type": "edge"}},
		}
		for k, v := range tt.want {
			want[k] = v
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Compose(Render(item, %s)) (-want +got):\n%s", tt.lang, diff)
		}
	}
}

func TestComposeTimestampAlwaysSixDigits(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   time.Time
		want string
	}{
		{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "2026-01-02T03:04:05.000000Z"},
		{time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC), "2026-01-02T03:04:05.123456Z"},
	} {
		doc := string(catalog.Compose(nil, "active", tt.in, []byte(`"id":"x"`)))
		if !strings.Contains(doc, `"updated_at":"`+tt.want+`"`) {
			t.Errorf("Compose(%v) = %s, want updated_at %s", tt.in, doc, tt.want)
		}
	}
}
