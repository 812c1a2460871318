package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// acrossNamespaces are the alerts that cannot keep namespace: absent()
// sees no series to take it from.
var acrossNamespaces = setOf("ExportGatewayMetricsAbsent")

// checkDeploymentsApart returns what q does that would merge two
// deployments or misname a service, once its names pass checkOpsQuery:
// a result without namespace (the usual kubernetes-pods job's label of the
// pod's namespace: staging's outage hidden in a sum with production's
// traffic, or an alert that cannot say which one), or a service named by
// app alone or job alone (kubernetes-pods gives all four services
// job=kubernetes-pods, a scrape job per service gives no app): name it by
// app, else job, as {{ with $labels.app }}…{{ else }}{{ $labels.job }} or
// label_replace's service do.
func checkDeploymentsApart(exposed exposure, q opsQuery) []string {
	var problems []string
	labels, _ := checkQuery(exposed, q.expr)
	if alert, ok := strings.CutPrefix(q.where, alertsFile+": alert "); !labels["namespace"] && !(ok && acrossNamespaces[alert]) {
		problems = append(problems, fmt.Sprintf("its result keeps no namespace (its labels: %s): two deployments scraped by one Prometheus merge there", labels))
	}
	shown := setOf(q.shownLabels()...)
	for _, pair := range [][2]string{{"app", "job"}, {"job", "app"}} {
		if shown[pair[0]] && !shown[pair[1]] {
			problems = append(problems, fmt.Sprintf("names services by %s alone: print app, else job", pair[0]))
		}
	}
	return problems
}

func TestCheckDeploymentsApart(t *testing.T) {
	for _, tc := range []struct {
		q    opsQuery
		want int // problems
	}{
		{opsQuery{expr: `sum by (namespace, route) (rate(req_total[5m]))`, shows: `{{route}} {{namespace}}`}, 0},
		{opsQuery{expr: `sum by (route) (rate(req_total[5m]))`, shows: `{{route}}`}, 1},
		{opsQuery{expr: `max(instances) > 0`}, 1},
		{opsQuery{where: alertsFile + ": alert ExportGatewayMetricsAbsent", expr: `absent(instances)`}, 0},
		{opsQuery{where: alertsFile + ": alert Other", expr: `absent(instances)`}, 1},
		{opsQuery{expr: `sum by (namespace, job) (rate(req_total[5m]))`, shows: `{{job}}`}, 1},
		{opsQuery{expr: `sum by (namespace, app) (rate(req_total[5m]))`, shows: `{{ $labels.app }}`}, 1},
		{opsQuery{expr: `sum by (namespace, job, app) (rate(req_total[5m]))`, shows: `{{ with $labels.app }}{{ . }}{{ else }}{{ $labels.job }}{{ end }}`}, 0},
		{opsQuery{expr: `sum by (namespace, service) (label_replace(label_replace(rate(req_total[5m]), "service", "$1", "job", "(.*)"), "service", "$1", "app", "(.+)"))`, shows: `{{service}}`}, 0},
	} {
		if got := checkDeploymentsApart(testExposure(), tc.q); len(got) != tc.want {
			t.Errorf("checkDeploymentsApart(%s, shows %q) = %q, want %d problem(s)", tc.q.expr, tc.q.shows, got, tc.want)
		}
	}
}
