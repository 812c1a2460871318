package prestashop

import (
	"context"
	"net/http/httptrace"
	"testing"

	"github.com/coinexport/export/services/shop-schema/internal/shoplimit"
)

// Without a cap per shop (the default) a shop request's context is the
// read's own: no connection trace, no cancel of its own, nothing of the
// cap on a request. With one, the request traces its connection to count
// it against the shop.
func TestOnlyAClaimedReadIsCountedPerShop(t *testing.T) {
	uncapped := withKey(context.Background(), "KEY")
	if got, _ := countedPerShop(shoplimit.With(uncapped, shoplimit.New(0).Claim())); got != uncapped {
		t.Errorf("countedPerShop without a cap returned a context of its own (trace: %v), want the read's as it is",
			httptrace.ContextClientTrace(got) != nil)
	}
	capped := shoplimit.With(context.Background(), shoplimit.New(1).Claim())
	got, stop := countedPerShop(capped)
	defer stop(nil)
	if trace := httptrace.ContextClientTrace(got); trace == nil || trace.GotConn == nil {
		t.Error("countedPerShop with a cap traces no connection: a request on a kept-alive connection would count nowhere")
	}
}
