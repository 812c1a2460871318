package salescheck

import (
	"net/http"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/saleclaim"
)

// An answer is read as the model needs it: a 200's data as the sale or the
// read it answers, a 404 or 409 by its code, and everything else unknown;
// a sale's 5xx that says nothing was applied (and the gateway's 503
// upstream_unavailable) marked so, a read's never (it applies nothing
// anyway); a body that is no envelope unknown, saying so. The history
// tests plant their claims by hand: only this holds the writer's own
// words to the mark the check then holds to the database.
func TestAnAnswerIsReadAsTheModelNeedsIt(t *testing.T) {
	confirm := Input{Op: Confirm, Platform: "a", Key: "k", Item: "coin-1", Order: "o"}
	read := Input{Op: Read, Item: "coin-1"}
	sold := `{"data":{"status":"inactive","stock_quantity":0,"item_id":"coin-1","platform_id":"a","external_order_id":"o",` +
		`"confirmed_at":"2026-11-30T16:00:00Z","idempotent_replay":true},"meta":{"request_id":"r1"}}`
	refusal := func(code, message string) string {
		return `{"error":{"code":"` + code + `","message":"` + message + `"},"meta":{"request_id":"r1"}}`
	}
	nothing := refusal("unavailable", "the database is unavailable; "+saleclaim.NothingApplied+": retry")
	for _, tt := range []struct {
		name   string
		in     Input
		status int
		body   string
		want   Output
	}{
		{"a sale", confirm, http.StatusOK, sold, Output{Status: 200, RequestID: "r1", Result: Result{Status: "inactive", Item: "coin-1",
			Platform: "a", Order: "o", ConfirmedAt: "2026-11-30T16:00:00Z", Replay: true}}},
		{"a read", read, http.StatusOK, `{"data":{"status":"active","stock_quantity":1},"meta":{"request_id":"r1"}}`,
			Output{Status: 200, RequestID: "r1", View: View{Status: "active", Stock: 1}}},
		{"a sale's data unreadable", confirm, http.StatusOK, `{"data":[],"meta":{"request_id":"r1"}}`, Output{Unknown: true, Status: 200, RequestID: "r1"}},
		{"a conflict", confirm, http.StatusConflict, refusal("item_unavailable", "sold"), Output{Status: 409, Code: "item_unavailable", RequestID: "r1"}},
		{"not found", confirm, http.StatusNotFound, refusal("not_found", "no such item"), Output{Status: 404, Code: "not_found", RequestID: "r1"}},
		{"a sale's 5xx, nothing applied", confirm, http.StatusServiceUnavailable, nothing,
			Output{Unknown: true, NothingApplied: true, Status: 503, Code: "unavailable", RequestID: "r1"}},
		{"a read's 5xx, the same words", read, http.StatusServiceUnavailable, nothing, Output{Unknown: true, Status: 503, Code: "unavailable", RequestID: "r1"}},
		{"the gateway sent it nowhere", confirm, http.StatusServiceUnavailable, refusal("upstream_unavailable", "retry later"),
			Output{Unknown: true, NothingApplied: true, Status: 503, Code: "upstream_unavailable", RequestID: "r1"}},
		{"a sale's 5xx, may be applied", confirm, http.StatusBadGateway, refusal("bad_gateway", "the sale may have been applied"),
			Output{Unknown: true, Status: 502, Code: "bad_gateway", RequestID: "r1"}},
		{"a 429", confirm, http.StatusTooManyRequests, refusal("rate_limited", "slow down"), Output{Unknown: true, Status: 429, Code: "rate_limited", RequestID: "r1"}},
	} {
		if got := parseAnswer(tt.in, tt.status, []byte(tt.body)); got != tt.want {
			t.Errorf("%s: parseAnswer = %#v, want %#v", tt.name, got, tt.want)
		}
	}
	if got := parseAnswer(confirm, http.StatusBadGateway, []byte("<html>502</html>")); !got.Unknown || got.Status != 502 ||
		!strings.HasPrefix(got.RequestID, "not an envelope") {
		t.Errorf("an ingress's HTML page: parseAnswer = %#v, want unknown, saying it is not an envelope", got)
	}
}
