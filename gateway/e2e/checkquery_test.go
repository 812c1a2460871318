package e2e

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// testExposure is a scrape of a counter by route and code, a histogram by
// route, a gauge by upstream and state, and a plain counter. Each series
// is given as label=value pairs.
func testExposure() exposure {
	family := func(name string, typ dto.MetricType, series ...[]string) *dto.MetricFamily {
		f := &dto.MetricFamily{Name: &name, Type: &typ}
		for _, pairs := range series {
			m := &dto.Metric{}
			for _, pair := range pairs {
				l, v, _ := strings.Cut(pair, "=")
				m.Label = append(m.Label, &dto.LabelPair{Name: &l, Value: &v})
			}
			f.Metric = append(f.Metric, m)
		}
		return f
	}
	e := exposure{}
	e.add(family("req_total", dto.MetricType_COUNTER,
		[]string{"route=GET /health", "code=2xx"}, []string{"route=HEAD /health", "code=2xx"}, []string{"route=x", "code=5xx"}))
	e.add(family("dur_seconds", dto.MetricType_HISTOGRAM, []string{"route=a"}, []string{"route=b"}))
	e.add(family("instances", dto.MetricType_GAUGE, []string{"upstream=reader", "state=up"}, []string{"upstream=reader", "state=out"}))
	e.add(family("panics_total", dto.MetricType_COUNTER, nil))
	return e
}

func TestCheckQuery(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  string // a problem contains it; "" for none
	}{
		{`sum by (route, code) (rate(req_total[1m]))`, ""},
		{`sum(rate(req_total{code="5xx",route!="x"}[5m])) / sum(rate(req_total[5m])) > 0.01`, ""},
		{`histogram_quantile(0.99, sum by (le, route) (rate(dur_seconds_bucket{route!~"a|b"}[5m]))) > 2`, ""},
		{`sum by (job, app) (increase(panics_total[10m])) > 0`, ""},
		{`max by (upstream) (instances{state="out"}) > 0`, ""},
		{`absent(instances)`, ""},
		{`sum(rate(req_total[5m])) by (route) / on (route) group_left (upstream) max by (route, upstream) (label_replace(instances, "route", "$1", "upstream", "(.*)"))`, ""},
		{`-sum(rate(req_total[5m] offset 1h)) * 2 ^ 3`, ""},
		{`avg_over_time(max(instances)[30m:1m])`, ""},
		{`req_total{route=~"(GET|HEAD) /health|x", code!~"[0-9]xx"}`, ""},
		{`req_total{route=~".*", job="any", app=~"any|other"}`, ""}, // the scrape's labels: any value
		{`sum by (namespace, route) (rate(req_total{namespace="prod"}[5m]))`, ""},
		{`up{app=~"reader|writer"} == 0 or up{job="reader"} == 0`, ""}, // the scrape's own series
		{`up{route="x"} == 0`, "up has no label route"},

		{`rate(req_totl[1m])`, "no binary exposes req_totl"},
		{`rate(dur_seconds[1m])`, "no binary exposes dur_seconds"}, // a histogram is its _bucket, _sum, _count
		{`rate(dur_seconds_sum{le="1"}[1m])`, "has no label le"},
		{`rate(req_total{status="5xx"}[1m])`, "has no label status"},
		{`sum by (route, status) (rate(req_total[1m]))`, "status is no label"},
		{`sum by (route) (rate(req_total[1m])) by (code)`, "cannot parse"},
		{`sum without (status) (rate(req_total[1m]))`, "status is no label"},
		{`sum by (route) (sum by (code) (rate(req_total[1m])))`, "route is no label"},
		{`histogram_quantile(0.99, sum by (route) (rate(dur_seconds_bucket[5m])))`, "without le"},
		{`sum(rate(req_total[1m])) / on (upstream) sum by (upstream) (instances)`, "not a label of both sides"},
		{`req_total / ignoring (nothing) req_total`, "neither side has nothing"},
		{`req_total * on (route) group_left (state) dur_seconds_count`, "no label state"},
		// and binds less than /: on (route) matches req_total / instances,
		// which has no route.
		{`req_total > 0 and on (route) req_total / instances`, "not a label of both sides"},
		{`sum by (route) (req_total / on (code) req_total)`, "route is no label"},
		{`label_replace(instances, "x", "$1", "route", "(.*)")`, "reads route"},
		{`topk(3, rate(req_totl[1m]))`, "no binary exposes req_totl"},
		{`made_up_function(req_total)`, "unsupported function"},
		{`sort_by_label(req_total, "route")`, "does not know the function \"sort_by_label\""},
		{`median(req_total)`, "does not know the aggregation median"},
		{`{__name__="req_total", code="5xx"}`, ""},

		// A value no series has selects nothing, or excludes nothing.
		{`instances{state="ot"}`, `no series has state "ot" (its values: {out, up})`},
		{`req_total{code!="5xxx"}`, `no series has code "5xxx"`},
		{`req_total{code=~"5"}`, `no series has a code that 5 matches`}, // anchored
		{`req_total{route!~"GET /helth"}`, `no series has a route that GET /helth matches`},
		// Each branch of a regex must match: the others do not hide it.
		{`dur_seconds_bucket{route!~"a|x y|b"}`, `that x y matches`},
		{`req_total{route!~"x|(GET|HAED) /health"}`, `that (HAED) /health matches`},
		{`req_total{route!~"x|(GET|HEAD) /helth"}`, `that (GET) /helth matches`},
		{`req_total{route=~"(GET|HEAD) /health|x(y)?"}`, ""},
		{`dur_seconds_bucket{le="1"}`, "does not read the values of le"},
		{`req_total{route=~"a(b"}`, "missing closing )"},
		{`{__name__="req_totl"}`, "no binary exposes req_totl"},
		{`{__name__=~"req_.*"}`, "names its metric"},
		{`req_total{code="5xx" or route="x"}`, "must be one {...} that names its metric"},
		{`sum(rate(req_total[5m] @ end()))`, ""},
		{`sum(rate(req_total[1m])`, "cannot parse"},
		{`rate(req_total[1x])`, "cannot parse"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			_, problems := checkQuery(testExposure(), tc.query)
			found := tc.want == "" && len(problems) == 0
			for _, p := range problems {
				found = found || tc.want != "" && strings.Contains(p, tc.want)
			}
			if !found {
				t.Errorf("checkQuery(%s) = %q, want a problem with %q (none if empty)", tc.query, problems, tc.want)
			}
		})
	}
}

// A series no binary exposes is one problem, not one more per label the
// query then reads of it.
func TestUnexposedSeriesIsOneProblem(t *testing.T) {
	query := `histogram_quantile(0.9, sum by (le, route) (rate(dur_secs_bucket[5m]))) / on (route) sum by (route) (rate(req_total[5m]))`
	if _, problems := checkQuery(testExposure(), query); len(problems) != 1 {
		t.Errorf("checkQuery(%s) = %q, want one problem", query, problems)
	}
}
