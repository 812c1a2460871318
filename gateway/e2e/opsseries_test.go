package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The dashboard and the alert rules read only series and labels the four
// binaries expose. A panel on a series no binary exports shows "No data",
// an alert on it never fires, and a sum by (...) a label the series lack
// folds them into one; a label value no series has (a misspelt code, one
// branch of a route regex) selects nothing, or excludes nothing. promtool's
// rule tests (alerts_test.yml) run on series they make up, so they cannot
// tell. The binaries are scraped as Prometheus scrapes them: what a
// labelled series is called, which labels it has and their values show
// once it exists, so the test first makes a request of each kind.
func TestOpsQueriesReadExposedSeries(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))
	before := s.requestCounts(t)
	s.serveOneOfEach(t, fx)
	checkRequestCountersMoved(t, before, s.requestCounts(t))
	exposed := s.scrape(t)

	queries := append(dashboardQueries(t, dashboardFile), alertQueries(t, alertsFile)...)
	for _, q := range queries {
		problems := checkOpsQuery(exposed, q)
		if len(problems) == 0 {
			// Two deployments (namespaces) show and alert apart, and each
			// service is named as on a Kubernetes scrape and a static one.
			problems = checkDeploymentsApart(exposed, q)
		}
		for _, p := range problems {
			t.Errorf("%s: %s\n\t%s", q.where, p, q.expr)
		}
	}
	// The inhibit rules ops copy into Alertmanager name alerts that exist
	// and join them on labels both carry.
	alerts := map[string]opsQuery{}
	for _, q := range alertQueries(t, alertsFile) {
		alerts[strings.TrimPrefix(q.where, alertsFile+": alert ")] = q
	}
	labelsOf := func(q opsQuery) labelSet {
		labels, _ := checkQuery(exposed, q.expr)
		return labels.union(q.own)
	}
	for _, p := range checkInhibitRules(t, alertmanagerFile, alerts, labelsOf) {
		t.Errorf("%s: %s", alertmanagerFile, p)
	}
	// Each metric and label name of each query, misspelt, fails the check:
	// the check reads every name the files use, none passes unread. So does
	// any other word of the query, a function or a keyword: metricsql
	// refuses it.
	for _, q := range queries {
		for _, w := range wordsIn(q.expr) {
			bad := q
			bad.expr = q.expr[:w.pos] + w.text + "_misspelt" + q.expr[w.pos+len(w.text):]
			if len(checkOpsQuery(exposed, bad)) == 0 {
				t.Errorf("%s: the check passes %s misspelt:\n\t%s", q.where, w.text, bad.expr)
			}
		}
	}
}

// checkOpsQuery returns what q reads or prints that the binaries do not
// expose. What it prints is checked once what it reads passes.
func checkOpsQuery(exposed exposure, q opsQuery) []string {
	labels, problems := checkQuery(exposed, q.expr)
	if len(problems) > 0 {
		return problems
	}
	for _, name := range q.shownLabels() {
		if !labels[name] && !q.own[name] {
			problems = append(problems, fmt.Sprintf("prints label %s, which its result lacks (its labels: %s)", name, labels))
		}
	}
	return problems
}

// word is a word of a query, at pos.
type word struct {
	text string
	pos  int
}

// queryWord matches, in turn, what holds no name (a string, a # comment, a
// number or a duration) and a word, the identifier of group 1.
var queryWord = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`" + `|#.*|[0-9.][0-9a-zA-Z_.]*|([a-zA-Z_:][a-zA-Z0-9_:]*)`)

// wordsIn returns the words of query: metric and label names, functions,
// keywords. It reads the text apart from the parse, so that a name the
// parse would drop is still one the check must fail on.
func wordsIn(query string) []word {
	var words []word
	for _, m := range queryWord.FindAllStringSubmatchIndex(query, -1) {
		if m[2] >= 0 {
			words = append(words, word{query[m[2]:m[3]], m[2]})
		}
	}
	return words
}

// serveOneOfEach makes the requests that create each binary's labelled
// series and the values the queries match (code="invalid_cursor"): a page
// of items, a cursor refused, a sale, a shop schema refused.
func (s *stack) serveOneOfEach(t *testing.T, fx fixture) {
	t.Helper()
	status, list, _ := call(t, "GET", s.baseURL+"/export/items?limit=3", fx.readKey, "", nil)
	if status != 200 {
		t.Fatalf("GET /export/items = %d %+v, want 200", status, list.Error)
	}
	status, refused, _ := call(t, "GET", s.baseURL+"/export/items?cursor=not-a-cursor", fx.readKey, "", nil)
	if status != 400 || refused.Error == nil || refused.Error.Code != "invalid_cursor" {
		t.Fatalf("GET /export/items with a forged cursor = %d %+v, want 400 invalid_cursor", status, refused.Error)
	}
	var items []struct{ ID string }
	if err := json.Unmarshal(list.Data, &items); err != nil || len(items) == 0 {
		t.Fatalf("list data = %s, want items", list.Data)
	}
	status, sale, _ := call(t, "POST", s.baseURL+"/export/items/"+items[0].ID+"/sales/confirm", fx.writeKey,
		`{"external_order_id":"e2e-ops-1"}`, map[string]string{"Idempotency-Key": "e2e-ops-confirm-1"})
	if status != 200 {
		t.Fatalf("confirm = %d %+v, want 200", status, sale.Error)
	}
	status, shop, _ := call(t, "POST", s.baseURL+"/sync/prestashop/schema", "",
		`{"base_url":"https://127.0.0.1/shop","ws_key":"WSKEY-e2e-0123456789ABCDEFGHIJKLMN"}`, nil)
	if status != 400 || shop.Error == nil || shop.Error.Code != "base_url_not_allowed" {
		t.Fatalf("shop schema with a loopback address = %d %+v, want 400 base_url_not_allowed", status, shop.Error)
	}
}

// requestCounts reads each binary's request counter from its /metrics
// (the gateway's gateway_http_requests_total, a service's
// http_requests_total), summed by route over the status classes:
// binary -> route -> requests.
func (s *stack) requestCounts(t *testing.T) map[string]map[string]float64 {
	t.Helper()
	counts := map[string]map[string]float64{}
	for name, families := range s.metricFamilies(t) {
		counter := map[bool]string{true: "gateway_http_requests_total", false: "http_requests_total"}[name == "gateway"]
		counts[name] = map[string]float64{}
		for _, m := range families[counter].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" {
					counts[name][l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return counts
}

// checkRequestCountersMoved: each binary's request counter moved by the
// requests serveOneOfEach sent it, route by route (issue 7: curl on each
// binary's /metrics shows the request counters moving).
func checkRequestCountersMoved(t *testing.T, before, after map[string]map[string]float64) {
	t.Helper()
	const list, confirm, shop = "GET /v1/export/items", "POST /v1/export/items/{item_id}/sales/confirm", "POST /v1/sync/prestashop/schema"
	want := map[string]map[string]float64{ // a page and a refused cursor, a sale, a shop schema refused
		"gateway":       {list: 2, confirm: 1, shop: 1},
		"export-reader": {list: 2},
		"sales-writer":  {confirm: 1},
		"shop-schema":   {shop: 1},
	}
	for name, routes := range want {
		for route, n := range routes {
			if got := after[name][route] - before[name][route]; got != n {
				t.Errorf("%s's request counter for %s moved by %v, want %v", name, route, got, n)
			}
		}
	}
}

// scrape reads every binary's /metrics, as Prometheus does.
func (s *stack) scrape(t *testing.T) exposure {
	t.Helper()
	exposed := exposure{}
	for _, families := range s.metricFamilies(t) {
		for _, f := range families {
			exposed.add(f)
		}
	}
	return exposed
}

// metricFamilies reads every binary's /metrics, as Prometheus does:
// binary -> metric name -> family.
func (s *stack) metricFamilies(t *testing.T) map[string]map[string]*dto.MetricFamily {
	t.Helper()
	all := map[string]map[string]*dto.MetricFamily{}
	for name, admin := range s.admin {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			t.Fatalf("scrape %s: %v", name, err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("scrape %s = %d, %v", name, resp.StatusCode, err)
		}
		all[name] = families
	}
	return all
}
