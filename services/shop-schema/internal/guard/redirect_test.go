package guard

import (
	"errors"
	"net/http"
	"net/url"
	"testing"
)

// TestCheckRedirect: a shop's Location, resolved against the request as
// net/http resolves it, passes only to https, without user info, on a
// shop's port, to a host ParseBaseURL would accept, whatever spelling the
// shop uses for an internal address; a fourth hop is refused. Pure: no
// lookup, no dial.
func TestCheckRedirect(t *testing.T) {
	g := newGuard(t)
	from, _ := url.Parse("https://shop.example.com/api/categories?output_format=JSON")
	tests := []struct{ location, want string }{
		{"/shop/api/categories?output_format=JSON", "ok"},
		{"//www.shop.example.com/api/categories", "ok"},
		{"https://shop.example.net:8443/api/", "ok"},
		{"https://8.8.8.8/api/", "ok"},
		{"https://[2606:4700::1111]/api/", "ok"},
		{"http://shop.example.com/api/categories", "https"},
		{"HTTP://shop.example.com/api/categories", "https"},
		{"ftp://shop.example.com/", "https"},
		{"https://user:pass@shop.example.com/", "invalid"},
		{"https://shop.example.com:0/", "invalid"},
		// Names DNS never answers for, refused by name as base_url is.
		{"https://shop.invalid/", "invalid"},
		{"https://SHOP.ONION./", "invalid"},
		{"https://shop.alt/", "invalid"},
		{"https://127.0.0.1/", "refused"},
		{"https://127.1/", "refused"},
		{"https://2130706433/", "refused"},
		{"https://0x7f.1/", "refused"},
		{"https://0177.0.0.1/", "refused"},
		{"https://0/", "refused"},
		{"https://0.0.0.0/", "refused"},
		{"https://[::]/", "refused"},
		{"https://[::1]/", "refused"},
		{"https://[::ffff:127.0.0.1]/", "refused"},
		{"https://[::ffff:7f00:1]/", "refused"},
		{"https://[64:ff9b::a9fe:a9fe]/", "refused"}, // NAT64 of 169.254.169.254
		{"https://169.254.169.254/latest/meta-data/", "refused"},
		{"https://[fd00:ec2::254]/", "refused"},
		{"https://100.100.100.200/", "refused"},
		{"https://168.63.129.16/", "refused"},
		{"https://10.0.0.1:8443/", "refused"},
		{"https://localhost/", "refused"},
		{"https://LOCALHOST./", "refused"},
		{"https://ｌｏｃａｌｈｏｓｔ/", "refused"},
		{"https://１２７.０.０.１/", "refused"},
		{"https://metadata.google.internal/computeMetadata/v1/", "refused"},
		{"https://kubernetes.default.svc/", "refused"},
		{"https://redis/", "refused"},
		{"https://shop.example.com:6379/", "refused"},
	}
	for _, tt := range tests {
		to, err := from.Parse(tt.location)
		if err != nil {
			t.Fatalf("Location %q: %v", tt.location, err)
		}
		req := &http.Request{Method: http.MethodGet, URL: to}
		if got := outcome(g.CheckRedirect(req, []*http.Request{{URL: from}})); got != tt.want {
			t.Errorf("redirect to %q: %s, want %s", tt.location, got, tt.want)
		}
	}

	next, _ := from.Parse("/api/categories")
	for hops, want := range map[int]error{MaxRedirects: nil, MaxRedirects + 1: ErrTooManyRedirects} {
		via := make([]*http.Request, hops)
		for i := range via {
			via[i] = &http.Request{URL: from}
		}
		if err := g.CheckRedirect(&http.Request{URL: next}, via); !errors.Is(err, want) {
			t.Errorf("redirect after %d requests: %v, want %v", hops, err, want)
		}
	}
}
