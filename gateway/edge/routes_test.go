package edge

import (
	"bufio"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// servicePatterns are the services' routes (their ServeMux patterns), which
// the gateway forwards to.
var servicePatterns = []string{
	"GET /v1/export/items", "GET /v1/export/items/{item_id}", // export-reader
	"POST /v1/export/items/{item_id}/sales/confirm", "POST /v1/export/items/{item_id}/sales/cancel", // sales-writer
	"POST /v1/sync/prestashop/schema", // shop-schema
}

// Every request-target is routed alike by Fiber, which serves the routing
// table, by matchPath, which names what Fiber leaves unmatched (404, 405),
// and by the services' ServeMux behind: what the gateway forwards after
// checkPath reaches the service route it checked the key's scope for, or
// an envelope of the service's (404 for an unclean path or no route),
// never another route nor the bare 400 of Go's server. The seeds are TestRouteNameOf's
// and TestForwardedPathIsTheRoutedPath's.
func FuzzRouting(f *testing.F) {
	for _, target := range []string{
		"/v1/export/items/coin-1", "/v1/export/items", "/v1/export/items/coin-1/sales/confirm", "/v1/health",
		"/v1/nothing", "/v1/export/items//sales/confirm", "/v1/export/items/a%2F..%2F..%2Fitems?limit=1",
		"/v1/export/items/..%2F..%2F..%2Fhealthz", "/v1/export/items/coin%2D1?lang=%ZZ&limit=%2B5", "/v1/export/items/..",
		"/v1/export/items/.", "/v1/export/items/..?limit=1", "/v1/export/items/%ZZ", "/v1/export/items/coin%2",
		"/v1/export/items/", "/v1/export/items/a/sales/cancel?x=1", "/v1/sync/prestashop/schema", "/v1/export/%69tems",
		"/v1/export/items/a#b", "/v1/export/items/a;b", "/v1/export/items/%2E%2E", "//v1/export/items", `/v1/export/items/0%2F"`,
	} {
		for m := range len(routingMethods) {
			f.Add(uint8(m), target)
		}
	}
	var served string
	app := fiber.New(fiber.Config{CaseSensitive: true, StrictRouting: true})
	for _, rt := range servedRoutes {
		app.Add(rt.Method, rt.Path, func(*fiber.Ctx) error { served = rt.Name(); return nil })
	}
	app.Use(func(*fiber.Ctx) error { served = unmatchedName; return nil })
	handler := app.Handler()
	mux := http.NewServeMux()
	for _, p := range servicePatterns {
		mux.HandleFunc(p, func(http.ResponseWriter, *http.Request) {})
	}
	f.Fuzz(func(t *testing.T, m uint8, target string) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n") {
			t.Skip() // no request line of an origin-form target
		}
		method := routingMethods[int(m)%len(routingMethods)]
		var rctx fasthttp.RequestCtx
		rctx.Request.Header.SetMethod(method)
		rctx.Request.SetRequestURI(target)
		served = ""
		handler(&rctx)
		raw := string(rctx.Request.URI().PathOriginal())

		named := routeNameOf(method, raw)
		if served != unmatchedName && named != served || served == unmatchedName && slices.ContainsFunc(servedRoutes,
			func(rt route) bool { return rt.Name() == named }) {
			t.Fatalf("%s %q (path %q): Fiber serves %q, routeNameOf says %q", method, target, raw, served, named)
		}
		i := slices.IndexFunc(servedRoutes, func(rt route) bool { return rt.Name() == served })
		if i < 0 || servedRoutes[i].Upstream == "" || checkPath([]byte(raw)) != nil {
			return // answered by the gateway itself
		}
		rt := servedRoutes[i]
		uri := receivedRequestURI(rctx.Request.URI())
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(method + " " + uri + " HTTP/1.1\r\nHost: service\r\n\r\n")))
		if err != nil {
			t.Fatalf("%s %q: the gateway forwards %s %q to %s, whose server refuses it bare: %v", method, target, rt.Name(), uri, rt.Upstream, err)
		}
		if path.Clean(r.URL.Path) != r.URL.Path {
			return // the service's 404 envelope (pkg/httpserver)
		}
		// No pattern is the service's own 404 or 405 envelope: ServeMux
		// splits an escaped path it cannot keep as sent (a '"' in it) at
		// a decoded "%2F".
		_, pattern := mux.Handler(r)
		if want := strings.Replace(rt.Name(), "HEAD ", "GET ", 1); pattern != "" && pattern != want {
			t.Fatalf("%s %q: the gateway routes it to %s, the service to %q", method, target, rt.Name(), pattern)
		}
	})
}

// routingMethods are the methods Fiber routes (the gateway answers others
// itself, as a 405 or 404).
var routingMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}

// checkPath refuses exactly the paths with a "." or ".." segment (404)
// and, of the others, those url.PathUnescape, as Go's server behind reads
// them, finds a broken escape in (400 invalid_path).
func FuzzCheckPath(f *testing.F) {
	for _, p := range []string{"/v1/export/items/coin-1", "/v1/export/items/..", "/v1/export/items/.", "/v1/export/items/%ZZ",
		"/v1/export/items/coin%2", "/v1/export/items/a%2F..%2F..%2Fitems", "/v1/export/items/%", "/..", ".", "", "/a/%2e%2E/b", "/a/.../b"} {
		f.Add([]byte(p))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var want error
		_, escapeErr := url.PathUnescape(string(p))
		switch {
		case slices.ContainsFunc(strings.Split(string(p), "/"), func(s string) bool { return s == "." || s == ".." }):
			want = errNotFound
		case escapeErr != nil:
			want = errBadPathEscape
		}
		if got := checkPath(p); got != want {
			t.Fatalf("checkPath(%q) = %v, want %v", p, got, want)
		}
	})
}
