package shopschema

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/services/shop-schema/internal/guard"
	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
)

// stuckResolver answers no lookup before its context ends.
type stuckResolver struct{}

func (stuckResolver) LookupNetIP(ctx context.Context, _, _ string) ([]netip.Addr, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A lookup that the caller abandons ends as the caller's cancellation, which
// the service answers 499; one that outlasts the read's own timeout is the
// shop's (its DNS) being slow.
func TestStuckLookupIsTheCallersOrTheShops(t *testing.T) {
	g, err := guard.New([]uint16{443}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := Request{BaseURL: "https://shop.example/", WSKey: "KEY"}

	ctx, hangUp := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer hangUp()
	ctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := New(g, stuckResolver{}, nil, time.Minute).Read(ctx, req); !errors.Is(err, context.Canceled) {
		t.Errorf("lookup abandoned by the caller: error %v, want the cancellation", err)
	}

	var shopErr *prestashop.Error
	_, err = New(g, stuckResolver{}, nil, 20*time.Millisecond).Read(context.Background(), req)
	if !errors.As(err, &shopErr) || shopErr.Kind != prestashop.KindTimeout {
		t.Errorf("lookup past the read's timeout: error %v, want a shop timeout", err)
	}
}

// The log line of a refused call names the host it aimed at, so that an
// operator sees which address was refused; never a host parsed around user
// info, which may hold a key.
func TestHostNamesTheHostOfARefusedURL(t *testing.T) {
	g, err := guard.New([]uint16{443}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := New(g, stuckResolver{}, nil, time.Minute)
	for _, tc := range []struct{ baseURL, want string }{
		{"https://shop.example/", "shop.example"},
		{"https://10.0.0.1/", "10.0.0.1"},                  // a private address: refused
		{"http://shop.example", "shop.example"},            // not https: refused
		{"https://[fd00::1]:8443/", "fd00::1"},             // private, port not allowed
		{"https://shop.example/?ws_key=x", "shop.example"}, // a query: refused
		{"https://user:KEY@10.0.0.1/", ""},
		{"https://KEY@shop.example/", ""},
		{"::not a url", ""},
		{"https://" + strings.Repeat("a", 300) + ".example/", ""},
		{"https://shop.example&ws_key=KEY", ""}, // & written for ?: the host holds the key
		{"https://shop.example;ws_key=KEY/", ""},
		{"https://[fe80::1%25KEY]/", ""},                     // a zone
		{"https://bücher.example/", "xn--bcher-kva.example"}, // accepted: its ASCII form
		{"http://bücher.example/", ""},                       // refused: not a plain name
		{"https://SHOP.example:8443/", "SHOP.example"},
	} {
		if got := svc.Host(Request{BaseURL: tc.baseURL}); got != tc.want {
			t.Errorf("Host(%q) = %q, want %q", tc.baseURL, got, tc.want)
		}
	}
	// A host that holds the key, accepted or refused, in any letter case.
	const key = "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"
	for _, baseURL := range []string{"https://" + key + ".example/", "https://" + key + ".example:22/", "https://shop-abcdefghijklmnopqrstuvwxyz123456.example/"} {
		if got := svc.Host(Request{BaseURL: baseURL, WSKey: " " + key + " "}); got != "" {
			t.Errorf("Host(%q) with that key = %q, want \"\"", baseURL, got)
		}
	}
}
