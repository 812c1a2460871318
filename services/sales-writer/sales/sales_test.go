package sales

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func TestResultMarshalJSON(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.FixedZone("X", 3600))
	tests := []struct {
		name string
		in   Result
		want string
	}{
		{"confirmed", Result{ItemID: "i", Status: "inactive", PlatformID: "p", ExternalOrderID: "o", ConfirmedAt: at},
			`{"item_id":"i","status":"inactive","stock_quantity":0,"platform_id":"p","external_order_id":"o","idempotent_replay":false,"confirmed_at":"2026-11-21T09:00:00.123456Z"}`},
		{"canceled replay", Result{ItemID: "i", Status: "active", StockQuantity: 1, PlatformID: "p", ExternalOrderID: "o", ConfirmedAt: at, CanceledAt: at.Add(time.Second), IdempotentReplay: true},
			`{"item_id":"i","status":"active","stock_quantity":1,"platform_id":"p","external_order_id":"o","idempotent_replay":true,"confirmed_at":"2026-11-21T09:00:00.123456Z","canceled_at":"2026-11-21T09:00:01.123456Z"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.in)
			if err != nil || string(got) != tt.want {
				t.Errorf("json.Marshal(%+v) = %s, %v, want %s", tt.in, got, err, tt.want)
			}
		})
	}
}

// Whatever the ids hold, the answer is JSON that decodes to the same result.
func TestResultJSONRoundTrips(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 123456000, time.UTC)
	in := Result{ItemID: "coin \"42\" \\ Талер", Status: "active", StockQuantity: 1, PlatformID: "p.1",
		ExternalOrderID: "order\n<&>\u2028\x01", ConfirmedAt: at, CanceledAt: at.Add(time.Minute), IdempotentReplay: true}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Result
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("json.Unmarshal(%s): %v", b, err)
	}
	if out != in {
		t.Errorf("round trip of %+v via %s gave %+v", in, b, out)
	}
}

func TestFingerprint(t *testing.T) {
	base := Request{Operation: Confirm, OwnerID: "o", PlatformID: "p", IdempotencyKey: "k", ItemID: "item", ExternalOrderID: "order"}
	same := []Request{
		base,
		func() Request { r := base; r.Quantity = 1; return r }(),
		func() Request { r := base; r.IdempotencyKey = "other"; r.PlatformID = "q"; return r }(),
	}
	for _, r := range same {
		if !bytes.Equal(Fingerprint(r), Fingerprint(base)) {
			t.Errorf("Fingerprint(%+v) differs from Fingerprint(%+v), want equal", r, base)
		}
	}
	different := []Request{
		func() Request { r := base; r.Operation = Cancel; return r }(),
		func() Request { r := base; r.ItemID = "item2"; return r }(),
		func() Request { r := base; r.ExternalOrderID = "order2"; return r }(),
		// Fields that run into each other must not collide.
		func() Request { r := base; r.ItemID = "ite"; r.ExternalOrderID = "morder"; return r }(),
	}
	for _, r := range different {
		if bytes.Equal(Fingerprint(r), Fingerprint(base)) {
			t.Errorf("Fingerprint(%+v) equals Fingerprint(%+v), want different", r, base)
		}
	}
}
