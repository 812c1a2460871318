package main

import (
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
)

// clientSpan is what a test reads of a shop request's span.
type clientSpan struct {
	url, errorType, cancelReason, cancelCause string
	status                                    codes.Code
}

func clientSpans(spans []sdktrace.ReadOnlySpan) []clientSpan {
	var out []clientSpan
	for _, s := range spans {
		cs := clientSpan{status: s.Status().Code}
		for _, a := range s.Attributes() {
			switch a.Key {
			case "url.full":
				cs.url = a.Value.AsString()
			case "error.type":
				cs.errorType = a.Value.AsString()
			case "app.cancel_reason":
				cs.cancelReason = a.Value.AsString()
			case "app.cancel_cause":
				cs.cancelCause = a.Value.AsString()
			}
		}
		out = append(out, cs)
	}
	return out
}

// checkSpanVocabulary checks that every shop request span names its
// outcome in the route's vocabulary: no error.type, or an error code with
// status Error, or canceled without it.
func checkSpanVocabulary(t *testing.T, spans []clientSpan) {
	t.Helper()
	codesOfKinds := map[string]bool{}
	for k := prestashop.Kind(1); k.Code() != ""; k++ {
		codesOfKinds[k.Code()] = true
	}
	for _, s := range spans {
		switch {
		case s.errorType == "" && s.status == codes.Error:
			t.Errorf("span of %s: status Error without error.type", s.url)
		case s.errorType == "canceled" && (s.status == codes.Error || s.cancelReason == ""):
			t.Errorf("span of %s: canceled with status %v, app.cancel_reason %q; want no Error and a reason", s.url, s.status, s.cancelReason)
		case s.errorType != "" && s.errorType != "canceled" && (!codesOfKinds[s.errorType] || s.status != codes.Error):
			t.Errorf("span of %s: error.type %q, status %v; want an error code of the route with status Error", s.url, s.errorType, s.status)
		}
	}
}

// TestSpansNameTheFailure: the request that failed carries the route's
// error code as error.type; a request cancelled because of it is canceled,
// not a failure of its own.
func TestSpansNameTheFailure(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.DeniedResources = map[string]bool{"product_feature_values": true}
	shop.Stall = map[string]bool{"categories": true} // in flight when the values fail
	shop.Start(t.Cleanup)
	svc := startService(t, shop, nil)
	status, env := svc.post(t, body(shop.URL(), fakeshop.Key))
	if status != http.StatusBadRequest || errCode(env) != "shop_401" {
		t.Fatalf("POST schema = %d %s, want 400 shop_401", status, errCode(env))
	}
	spans := clientSpans(svc.spans.Ended())
	checkSpanVocabulary(t, spans)
	var failed, cancelled int
	for _, s := range spans {
		switch {
		case strings.Contains(s.url, "/api/product_feature_values"):
			failed++
			if s.errorType != "shop_401" || s.status != codes.Error {
				t.Errorf("span of the refused request: error.type %q, status %v; want shop_401, Error", s.errorType, s.status)
			}
		case strings.Contains(s.url, "/api/categories"):
			cancelled++
			want := clientSpan{url: s.url, errorType: "canceled", cancelReason: "sibling_failed", cancelCause: "shop_401", status: codes.Unset}
			if s != want {
				t.Errorf("span of the cancelled request = %+v, want %+v", s, want)
			}
		}
	}
	if failed != 1 || cancelled != 1 {
		t.Errorf("%d spans of product_feature_values, %d of categories; want 1 each", failed, cancelled)
	}
}
