package main

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkScanPage measures the client's cost per sync page: 100 items of
// roughly the seeded size.
func BenchmarkScanPage(b *testing.B) {
	item := `{"status":"active","stock_quantity":1,"updated_at":"2026-11-21T05:00:00.123456Z","id":"item-%06d","coin_id":"c1",` +
		`"title":"Austria 1 Schilling 1925, \"Edelweiss\" [silver]","description":"` + strings.Repeat("lorem ipsum dolor sit amet ", 20) + `",` +
		`"price":12.5,"currency":"EUR","category":{"id":"7","name":"Europe"},"characteristics":{"metal":"silver","weight_g":7},` +
		`"images":[{"id":"i1","url":"https://img.example/1.jpg","position":1,"type":"obverse"},{"id":"i2","url":"https://img.example/2.jpg","position":2,"type":"reverse"}]}`
	items := make([]string, 100)
	for i := range items {
		items[i] = fmt.Sprintf(item, i)
	}
	body := []byte(`{"data":[` + strings.Join(items, ",") + `],"meta":{"request_id":"r","next_cursor":"abc"}}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if p, err := scanPage(body); err != nil || p.Items != 100 {
			b.Fatalf("scanPage() = %+v, %v", p, err)
		}
	}
}
