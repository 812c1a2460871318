package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

// minRange is the shortest literal range a rate or an increase may read:
// four scrapes at Prometheus's default scrape_interval (1m). rate() needs
// two samples in its window, and a window of one interval most often holds
// one: on a live Prometheus scraping a stack at the default interval, every
// panel reading [1m] showed "No data" while the rest drew. Grafana's
// $__rate_interval (four scrape intervals at least) fits any interval.
const minRange = 4 * time.Minute

// rangeSelector matches a range or a subquery's range, [5m] or [5m:1m],
// group 1 the range; [[name]] (a template variable) is no range.
var rangeSelector = regexp.MustCompile(`\[([^\[\]:]+)(?::[^\[\]]*)?\]`)

// shortRanges returns the literal ranges in expr shorter than minRange, and
// those that are neither a duration nor $__rate_interval.
func shortRanges(expr string) []string {
	var bad []string
	for _, m := range rangeSelector.FindAllStringSubmatch(expr, -1) {
		r := strings.TrimSpace(m[1])
		if r == "$__rate_interval" || r == "${__rate_interval}" {
			continue
		}
		d, err := model.ParseDuration(r)
		if err != nil || time.Duration(d) < minRange {
			bad = append(bad, m[0])
		}
	}
	return bad
}

// Every range the dashboard and the rules read holds four scrapes at the
// default interval (or is $__rate_interval), so that neither shows "No
// data" nor stays silent on a Prometheus scraping every minute.
func TestOpsRangesHoldFourScrapes(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var queries []opsQuery
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			for _, tg := range p.Targets {
				queries = append(queries, opsQuery{where: fmt.Sprintf("%s: panel %q, target %s", dashboardFile, p.Title, tg.RefID), expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	queries = append(queries, alertQueries(t, alertsFile)...)
	for _, q := range queries {
		if bad := shortRanges(q.expr); len(bad) > 0 {
			t.Errorf("%s reads %s: under %s, a Prometheus scraping every minute has fewer than two samples there (No data); use [$__rate_interval] in a panel, a longer range in a rule\n\t%s",
				q.where, strings.Join(bad, ", "), minRange, q.expr)
		}
	}
}

func TestShortRanges(t *testing.T) {
	for expr, want := range map[string]int{
		`rate(x[1m])`:                     1,
		`rate(x[5m]) / rate(y[30s])`:      1,
		`rate(x[$__rate_interval])`:       0,
		`rate(x[${__rate_interval}])`:     0,
		`increase(x[10m])`:                0,
		`max_over_time(rate(x[5m])[1m:])`: 1,
		`rate(x[[[interval]]])`:           1, // neither a duration nor $__rate_interval
		`rate(x[$__interval])`:            1,
	} {
		if got := shortRanges(expr); len(got) != want {
			t.Errorf("shortRanges(%s) = %q, want %d", expr, got, want)
		}
	}
}
