package shopschema

import (
	"context"
	"errors"
	"net/netip"
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
