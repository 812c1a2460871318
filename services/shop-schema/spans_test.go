package main

import (
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

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
		out = append(out, clientSpan{
			url:          attrOf(s, "url.full").AsString(),
			errorType:    attrOf(s, "error.type").AsString(),
			cancelReason: attrOf(s, "app.cancel_reason").AsString(),
			cancelCause:  attrOf(s, "app.cancel_cause").AsString(),
			status:       s.Status().Code,
		})
	}
	return out
}

// attrOf is the span's attribute key, the empty Value if it has none.
func attrOf(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value
		}
	}
	return attribute.Value{}
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

// hopSpan is what TestHopSpans compares of a shop request's span.
type hopSpan struct {
	path, display string // of url.full
	status        int64  // http.response.status_code
	errorType     string
	code          codes.Code
}

func hopSpanOf(s sdktrace.ReadOnlySpan) hopSpan {
	u, _ := url.Parse(spanURL(s))
	return hopSpan{path: u.Path, display: u.Query().Get("display"), status: attrOf(s, "http.response.status_code").AsInt64(),
		errorType: attrOf(s, "error.type").AsString(), code: s.Status().Code}
}

// TestHopSpans: each hop of a shop request (a redirect, the dispatcher.php
// fallback, the display=full retry) is a client span of its own, which
// names the hop's outcome, ends before the next hop starts, describes the
// shop as otelhttp did, and is the parent the shop is told of in
// traceparent.
func TestHopSpans(t *testing.T) {
	const fields = "[id,id_parent,level_depth,active,position,is_root_category,name]"
	tests := []struct {
		name  string
		setup func(s *fakeshop.Shop)
		base  func(s *fakeshop.Shop) string
		want  []hopSpan // of the categories request
	}{
		{"redirect followed", moveShop, func(s *fakeshop.Shop) string { return strings.Replace(s.URL(), "/new", "/old", 1) }, []hopSpan{
			{path: "/old/api/categories", display: fields, status: 302},
			{path: "/new/api/categories", display: fields, status: 200},
		}},
		{"dispatcher.php fallback", func(s *fakeshop.Shop) { s.NoRewrite = true; s.Prefix = "/ps" }, nil, []hopSpan{
			{path: "/ps/api/categories", display: fields, status: 404, errorType: "shop_not_found", code: codes.Error},
			{path: "/ps/webservice/dispatcher.php", display: fields, status: 200},
		}},
		{"field list refused", func(s *fakeshop.Shop) { s.RejectFieldLists = true }, nil, []hopSpan{
			{path: "/api/categories", display: fields, status: 400, errorType: "shop_bad_response", code: codes.Error},
			{path: "/api/categories", display: "full", status: 200},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shop := fakeshop.Sample("8", false)
			tt.setup(shop)
			shop.HoldUntil = 4 // each fetch meets the shop's quirk itself, before another found it for the call
			shop.Start(t.Cleanup)
			svc := startService(t, shop, nil)
			base := shop.URL()
			if tt.base != nil {
				base = tt.base(shop)
			}
			if status, env := svc.post(t, body(base, fakeshop.Key)); status != http.StatusOK {
				t.Fatalf("POST schema = %d %s, want 200", status, errCode(env))
			}
			spans := svc.spans.Ended()
			sort.Slice(spans, func(i, j int) bool { return spans[i].StartTime().Before(spans[j].StartTime()) })
			var got []hopSpan
			var categories []sdktrace.ReadOnlySpan
			for _, s := range spans {
				if h := hopSpanOf(s); strings.Contains(h.path, "categories") || strings.Contains(h.path, "dispatcher") && strings.Contains(spanURL(s), "url=categories") {
					got = append(got, h)
					categories = append(categories, s)
				}
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(hopSpan{})); diff != "" {
				t.Errorf("spans of the categories request (-want +got):\n%s", diff)
			}
			for i := 1; i < len(categories); i++ {
				if prev := categories[i-1]; prev.EndTime().After(categories[i].StartTime()) {
					t.Errorf("hop %d ended at %v, after hop %d started at %v: want each span to end when its answer was read",
						i-1, prev.EndTime(), i, categories[i].StartTime())
				}
			}
			checkHopAttributes(t, shop, spans)
		})
	}
}

// checkHopAttributes checks what every hop's span says besides its outcome,
// and that the shop was sent each hop's trace context.
func checkHopAttributes(t *testing.T, shop *fakeshop.Shop, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	_, port, _ := net.SplitHostPort(shop.Addr())
	want := map[string]string{"http.request.method": "GET", "server.address": "127.0.0.1", "server.port": port}
	sent := map[string]bool{}
	for _, tp := range shop.Traceparents() {
		sent[tp] = true
	}
	for _, s := range spans {
		if s.Name() != "prestashop GET" || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("span %q of kind %v, want prestashop GET, client", s.Name(), s.SpanKind())
		}
		got := map[string]string{}
		for _, a := range s.Attributes() {
			if _, ok := want[string(a.Key)]; ok {
				got[string(a.Key)] = a.Value.String()
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("span of %s: attributes (-want +got):\n%s", spanURL(s), diff)
		}
		sc := s.SpanContext()
		if tp := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; !sent[tp] {
			t.Errorf("span of %s: the shop was not sent traceparent %s (it got %q)", spanURL(s), tp, shop.Traceparents())
		}
	}
	if len(spans) != len(shop.Requests()) {
		t.Errorf("%d client spans for %d requests the shop received, want one per request", len(spans), len(shop.Requests()))
	}
}

func spanURL(s sdktrace.ReadOnlySpan) string { return attrOf(s, "url.full").AsString() }

// TestSpanNamesAWrongShape: a failure found in the body of a 200 is named
// on the span of the request that brought it.
func TestSpanNamesAWrongShape(t *testing.T) {
	shop := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"something_else":[]}`))
	}))
	shop.Config.ErrorLog = log.New(io.Discard, "", 0) // connections the service leaves open are cut at cleanup
	shop.StartTLS()
	t.Cleanup(shop.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: shop.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := startService(t, nil, map[string]string{"SHOP_SCHEMA_CA_FILE": ca})
	if status, env := svc.post(t, body(shop.URL, fakeshop.Key)); status != http.StatusBadGateway || errCode(env) != "shop_bad_response" {
		t.Fatalf("POST schema = %d %s, want 502 shop_bad_response", status, errCode(env))
	}
	spans := svc.spans.Ended()
	checkSpanVocabulary(t, clientSpans(spans))
	named := false
	for _, s := range spans {
		h := hopSpanOf(s)
		named = named || h.status == 200 && h.errorType == "shop_bad_response"
	}
	if !named {
		t.Errorf("no span of a 200 has error.type shop_bad_response: %+v", clientSpans(spans))
	}
	// The log says what the shape lacked, which the client is not told.
	if got, _ := logLine(t, svc.logs, "shop call failed")["error"].(string); !strings.Contains(got, "answer lacks the") {
		t.Errorf("shop call failed error = %q, want it to name the missing member", got)
	}
}
