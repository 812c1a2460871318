package edge

import (
	"regexp"
	"slices"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/coinexport/export/pkg/identity"
)

// Upstream names.
const (
	upstreamExportReader = "export-reader"
	upstreamSalesWriter  = "sales-writer"
	upstreamShopSchema   = "shop-schema"
)

// Rate-limit classes: each of the first five has its own limit and its own
// Redis keys; the caps on what is in flight below count in the process.
const (
	classExportRead   = "export_read"
	classSalesWrite   = "sales_write"
	classAnonymous    = "anonymous"
	classShopSchema   = "shop_schema"
	classAuthFailures = "auth_failures"
	// classShopSchemaInFlight is the cap on an address's shop schema calls
	// in flight (inFlightSlots): no window and no Redis keys, but a limit
	// whose 429 is named like the others'.
	classShopSchemaInFlight = "shop_schema_in_flight"
	// classOwnerExportInFlight and classOwnerSaleInFlight are the caps on
	// an owner's requests in flight on the keyed routes of one service,
	// its share of the owner's slots, all of its keys together
	// (takeOwnerSlot): each share is named apart, so that a 429's access
	// line, span and decisions metric say which service's share was full
	// (calls hung on sales-writer fill the sale share alone).
	classOwnerExportInFlight = "owner_in_flight_export"
	classOwnerSaleInFlight   = "owner_in_flight_sale"
	// classGuessesInLookup is the bound on an address's uncached keys in
	// lookup at once, by what its guess budget has left (authBudgetLeft):
	// counted in the process, as the caps on calls in flight are.
	classGuessesInLookup = "auth_guesses_in_lookup"
)

// route is one line of the routing table.
type route struct {
	Method string
	Path   string // Fiber pattern; :name matches one non-empty segment
	// Upstream serves the route; empty means the gateway answers itself.
	Upstream string
	// Scope the key needs; empty means no key (limited per client IP).
	Scope string
	// NeedsPlatform: the key must be bound to a platform (spec 5).
	NeedsPlatform bool
	// Class names the rate limit that applies.
	Class string
	// RepeatWithIdempotencyKey: a request carrying an Idempotency-Key may
	// be sent again after a failure that happened once it may have arrived.
	RepeatWithIdempotencyKey bool
	// ReadOnly: the route changes nothing, whatever its method (the shop
	// schema POST reads a shop), so it is repeated as a GET is.
	ReadOnly bool
	// StickyByKey: the instance is chosen by the caller's key id
	// (rendezvous hashing) instead of round-robin, so every page of one
	// key's sync reaches the instance that read ahead the next page.
	StickyByKey bool
	// HealthCheck: the route is what load balancers and Kubernetes'
	// readiness probe poll, every few seconds for each gateway; its
	// requests record no span (begin), as the services' /healthz records
	// none, or each probe would be a trace of its own in the trace store.
	HealthCheck bool
	// StreamsLargeAnswers: the answers are asked for as streams; one up
	// to smallAnswerBytes is read whole at once, a larger one read whole
	// within the gateway's heldAnswersLimit and relayed as it comes past
	// it, with the owner's slot held until it has left (proxyUntilRelayed).
	// A list page may hold MaxPageBytes (4 MiB) of items and the item that
	// passed it, an item about 2 MiB; read whole, each was held in the
	// gateway while its client read it, and nothing bounded how many:
	// gateway README, "Answers of large items".
	StreamsLargeAnswers bool
}

// Name labels metrics, spans and log lines. A parameter is written
// {item_id}, as the services' routes (Go's ServeMux patterns) and
// OpenTelemetry's http.route write it, not Fiber's :item_id, so one query
// matches a route in every process's metrics.
func (r route) Name() string {
	return r.Method + " " + fiberParam.ReplaceAllString(r.Path, "{$1}")
}

var fiberParam = regexp.MustCompile(`:([a-z_]+)`)

// pathName labels a request to the route's path with a method no route
// of that path serves (405): the path's pattern alone, without a method,
// so that such requests name the path they were sent to without mixing
// into the series of a route that serves it.
func (r route) pathName() string {
	return fiberParam.ReplaceAllString(r.Path, "{$1}")
}

// unmatchedName labels a request to a path no route has (404).
const unmatchedName = "unmatched"

// routeNameOf names a request to method and path as the routing table
// would: the name of the route that serves it, the path's name if only
// other methods are served there (405), or unmatchedName (404). For the
// requests no route's handler serves; never on the hot path.
func routeNameOf(method, path string) string {
	name := unmatchedName
	for _, r := range servedRoutes {
		if !matchPath(r.Path, path) {
			continue
		}
		if r.Method == method {
			return r.Name()
		}
		name = r.pathName()
	}
	return name
}

// saleItemOf is the item_id segment of a request to a sale route, escaped
// as Fiber's c.Params gives it, for a request refused before routing (a
// body over BodyLimit); ok is false for a request to any other route.
func saleItemOf(method, path string) (item string, ok bool) {
	for _, r := range routes {
		if r.RepeatWithIdempotencyKey && r.Method == method && matchPath(r.Path, path) {
			at := slices.Index(strings.Split(r.Path, "/"), ":item_id")
			return strings.Split(path, "/")[at], true
		}
	}
	return "", false
}

// routeNames are every name routeNameOf returns, for the metric series
// made at start.
func routeNames() []string {
	names := []string{unmatchedName}
	for _, r := range servedRoutes {
		if !slices.Contains(names, r.Name()) {
			names = append(names, r.Name())
		}
		if !slices.Contains(names, r.pathName()) {
			names = append(names, r.pathName())
		}
	}
	return names
}

// routes is the whole public surface of the API (spec 4).
var routes = []route{
	{Method: "GET", Path: "/v1/health", Class: classAnonymous, HealthCheck: true},
	{Method: "POST", Path: "/v1/sync/prestashop/schema", Upstream: upstreamShopSchema, Class: classShopSchema, ReadOnly: true},
	{Method: "GET", Path: "/v1/export/items", Upstream: upstreamExportReader,
		Scope: identity.ScopeExportRead, Class: classExportRead, StickyByKey: true, StreamsLargeAnswers: true},
	{Method: "GET", Path: "/v1/export/items/:item_id", Upstream: upstreamExportReader,
		Scope: identity.ScopeExportRead, Class: classExportRead, StreamsLargeAnswers: true},
	{Method: "POST", Path: "/v1/export/items/:item_id/sales/confirm", Upstream: upstreamSalesWriter,
		Scope: identity.ScopeSalesWrite, NeedsPlatform: true, Class: classSalesWrite, RepeatWithIdempotencyKey: true},
	{Method: "POST", Path: "/v1/export/items/:item_id/sales/cancel", Upstream: upstreamSalesWriter,
		Scope: identity.ScopeSalesWrite, NeedsPlatform: true, Class: classSalesWrite, RepeatWithIdempotencyKey: true},
}

// servedRoutes are the routes plus a HEAD route for every GET one: HTTP
// servers answer HEAD wherever they answer GET (RFC 9110, 9.1), and uptime
// probes use it. A HEAD request is served like the GET (key, scope, rate
// limit), and its answer has the GET's headers without the body.
var servedRoutes = withHead(routes)

func withHead(rs []route) []route {
	out := slices.Clone(rs)
	for _, r := range rs {
		if r.Method == fiber.MethodGet {
			r.Method = fiber.MethodHead
			out = append(out, r)
		}
	}
	return out
}

// safe reports whether the route may be repeated without harm: its
// method is GET or HEAD, or it changes nothing (ReadOnly).
func (r route) safe() bool {
	return r.Method == fiber.MethodGet || r.Method == fiber.MethodHead || r.ReadOnly
}

// allowedMethods lists the methods of the routes whose pattern matches path;
// none means the path is unknown (404), some means 405 with Allow.
func allowedMethods(path string) []string {
	var out []string
	for _, r := range servedRoutes {
		if matchPath(r.Path, path) {
			out = append(out, r.Method)
		}
	}
	return out
}

// matchPath reports whether path fits pattern segment by segment.
func matchPath(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(ps) != len(xs) {
		return false
	}
	for i, p := range ps {
		if strings.HasPrefix(p, ":") {
			if xs[i] == "" {
				return false
			}
			continue
		}
		if p != xs[i] {
			return false
		}
	}
	return true
}
