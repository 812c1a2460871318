package e2e

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"testing"

	"github.com/VictoriaMetrics/metricsql"
)

// ownTargetsLabel=ownTargetsValue is the matcher every selector of the files carries: deploy/k8s's
// pod label app.kubernetes.io/part-of, as the usual kubernetes-pods job's
// labelmap names it. Another team's pods share that job, the app names
// (app=gateway) and the series names of every Go program
// (process_open_fds): a selector without it alerted this product's
// on-call for them.
const ownTargetsLabel, ownTargetsValue = "app_kubernetes_io_part_of", "export-service"

// checkDeploymentsApart returns what q does that would merge two
// deployments, misname a service or read other products' targets, once
// its names pass checkOpsQuery: a result without namespace (the usual
// kubernetes-pods job's label of the pod's namespace: staging's outage
// hidden in a sum with production's traffic, or an alert that cannot say
// which one; "X or on () absent(...)" keeps it when X does, absent()'s
// one series standing for no deployment at all), a service named by app
// alone or job alone (kubernetes-pods gives all four services
// job=kubernetes-pods, a scrape job per service gives no app): name it by
// app, else job, as {{ with $labels.app }}…{{ else }}{{ $labels.job }} or
// label_replace's service do; or a selector without ownTargetsLabel.
func checkDeploymentsApart(exposed exposure, q opsQuery) []string {
	var problems []string
	if labels, _ := checkQuery(exposed, apartOfAbsent(q.expr)); !labels["namespace"] {
		problems = append(problems, fmt.Sprintf("its result keeps no namespace (its labels: %s): two deployments scraped by one Prometheus merge there", labels))
	}
	shown := setOf(q.shownLabels()...)
	for _, pair := range [][2]string{{"app", "job"}, {"job", "app"}} {
		if shown[pair[0]] && !shown[pair[1]] {
			problems = append(problems, fmt.Sprintf("names services by %s alone: print app, else job", pair[0]))
		}
	}
	problems = append(problems, checkOwnTargets(q.expr)...)
	return append(problems, checkServiceLabel(q.expr)...)
}

// apartOfAbsent returns X of expr "X or absent(...)" (on () or not), and
// expr otherwise.
func apartOfAbsent(expr string) string {
	e, err := metricsql.Parse(expr)
	if err != nil {
		return expr // checkOpsQuery reports it
	}
	if b, ok := e.(*metricsql.BinaryOpExpr); ok && b.Op == "or" {
		if f, ok := b.Right.(*metricsql.FuncExpr); ok && f.Name == "absent" {
			return string(b.Left.AppendString(nil))
		}
	}
	return expr
}

// checkOwnTargets returns each selector of expr that lacks
// ownTargetsLabel="ownTargetsValue".
func checkOwnTargets(expr string) []string {
	e, err := metricsql.Parse(expr)
	if err != nil {
		return nil // checkOpsQuery reports it
	}
	var problems []string
	metricsql.VisitAll(e, func(x metricsql.Expr) {
		s, ok := x.(*metricsql.MetricExpr)
		if !ok {
			return
		}
		for _, filters := range s.LabelFilterss {
			if !slices.ContainsFunc(filters, isOwnTargets) {
				problems = append(problems, fmt.Sprintf("%s reads every product's targets: select %s=%q, this product's alone", s.AppendString(nil), ownTargetsLabel, ownTargetsValue))
			}
		}
	})
	return problems
}

func isOwnTargets(f metricsql.LabelFilter) bool {
	return f.Label == ownTargetsLabel && f.Value == ownTargetsValue && !f.IsRegexp && !f.IsNegative
}

// serviceForms are the labels a service's series carry on the two scrapes
// the files are written for: the usual kubernetes-pods job (app the
// manifest's, job the job's, the same for all four) and a scrape job per
// service (job alone).
var serviceForms = []map[string]string{{"job": "kubernetes-pods", "app": "gateway"}, {"job": "gateway"}}

// checkServiceLabel returns how the service label that expr's
// label_replace calls make misnames a service on either form: made from
// job after app, or from one of them alone, it said kubernetes-pods for
// all four, or nothing on a scrape job per service, and the label's name
// alone passed every other check.
func checkServiceLabel(expr string) []string {
	e, err := metricsql.Parse(expr)
	if err != nil {
		return nil // checkOpsQuery reports it
	}
	var made []*metricsql.FuncExpr
	inner := map[metricsql.Expr]bool{}
	metricsql.VisitAll(e, func(x metricsql.Expr) {
		if f, ok := x.(*metricsql.FuncExpr); ok && f.Name == "label_replace" && len(f.Args) == 5 && stringArg(f, 1) == "service" {
			made = append(made, f)
			inner[f.Args[0]] = true
		}
	})
	var problems []string
	for _, f := range made {
		if inner[f] {
			continue // an outer label_replace says the last word
		}
		for _, form := range serviceForms {
			if got := relabelled(f, form)["service"]; got != "gateway" {
				problems = append(problems, fmt.Sprintf("its label_replace names the service %q on a series of %v: make service app, else job", got, form))
			}
		}
	}
	return problems
}

// relabelled is labels after the label_replace calls of e, innermost
// first, as Prometheus applies them: a regex matching the source label's
// whole value sets the destination to the expanded replacement (none
// when empty); another leaves the labels as they were.
func relabelled(e metricsql.Expr, labels map[string]string) map[string]string {
	f, ok := e.(*metricsql.FuncExpr)
	if !ok || f.Name != "label_replace" || len(f.Args) != 5 {
		return maps.Clone(labels)
	}
	out := relabelled(f.Args[0], labels)
	re, err := regexp.Compile("^(?:" + stringArg(f, 4) + ")$")
	if err != nil {
		return out
	}
	src := out[stringArg(f, 3)]
	if m := re.FindStringSubmatchIndex(src); m != nil {
		if v := string(re.ExpandString(nil, stringArg(f, 2), src, m)); v != "" {
			out[stringArg(f, 1)] = v
		} else {
			delete(out, stringArg(f, 1))
		}
	}
	return out
}

// stringArg is f's argument i when it is a string, else "".
func stringArg(f *metricsql.FuncExpr, i int) string {
	if s, ok := f.Args[i].(*metricsql.StringExpr); ok {
		return s.S
	}
	return ""
}

func TestCheckDeploymentsApart(t *testing.T) {
	for _, tc := range []struct {
		q    opsQuery
		want int // problems
	}{
		{opsQuery{expr: `sum by (namespace, route) (rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]))`, shows: `{{route}} {{namespace}}`}, 0},
		{opsQuery{expr: `sum by (route) (rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]))`, shows: `{{route}}`}, 1},
		{opsQuery{expr: `max(instances{app_kubernetes_io_part_of="export-service"}) > 0`}, 1},
		// absent() alone says nothing of which deployment; after a query
		// that keeps namespace, it stands for none at all.
		{opsQuery{expr: `absent(instances{app_kubernetes_io_part_of="export-service"})`}, 1},
		{opsQuery{expr: `count by (namespace) (up{app_kubernetes_io_part_of="export-service"}) unless count by (namespace) (instances{app_kubernetes_io_part_of="export-service"}) or on () absent(instances{app_kubernetes_io_part_of="export-service"})`}, 0},
		{opsQuery{expr: `count(up{app_kubernetes_io_part_of="export-service"}) unless count(instances{app_kubernetes_io_part_of="export-service"}) or on () absent(instances{app_kubernetes_io_part_of="export-service"})`}, 1},
		// Every selector reads this product's targets alone: by app or
		// job, another team's pod labelled app=gateway was read too.
		{opsQuery{expr: `sum by (namespace) (rate(req_total[5m]))`}, 1},
		{opsQuery{expr: `up{app=~"gateway|export-reader"} == 0`}, 1},
		{opsQuery{expr: `max by (namespace) (instances{app_kubernetes_io_part_of="export-service"} / instances)`}, 1},
		{opsQuery{expr: `max by (namespace) (instances{app_kubernetes_io_part_of=~"export-service"})`}, 1},
		{opsQuery{expr: `max by (namespace) (instances{app_kubernetes_io_part_of!="export-service"})`}, 1},
		{opsQuery{expr: `max by (namespace) (instances{app_kubernetes_io_part_of="other"})`}, 1},
		{opsQuery{expr: `sum by (namespace, job) (rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]))`, shows: `{{job}}`}, 1},
		{opsQuery{expr: `sum by (namespace, app) (rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]))`, shows: `{{ $labels.app }}`}, 1},
		{opsQuery{expr: `sum by (namespace, job, app) (rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]))`, shows: `{{ with $labels.app }}{{ . }}{{ else }}{{ $labels.job }}{{ end }}`}, 0},
		{opsQuery{expr: `sum by (namespace, service) (label_replace(label_replace(rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]), "service", "$1", "job", "(.*)"), "service", "$1", "app", "(.+)"))`, shows: `{{service}}`}, 0},
		// job after app: kubernetes-pods for every service of the usual pod scrape.
		{opsQuery{expr: `sum by (namespace, service) (label_replace(label_replace(rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]), "service", "$1", "app", "(.+)"), "service", "$1", "job", "(.*)"))`, shows: `{{service}}`}, 1},
		// job alone, app alone: one form each misnamed.
		{opsQuery{expr: `sum by (namespace, service) (label_replace(rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]), "service", "$1", "job", "(.*)"))`, shows: `{{service}}`}, 1},
		{opsQuery{expr: `sum by (namespace, service) (label_replace(rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]), "service", "$1", "app", "(.*)"))`, shows: `{{service}}`}, 1},
		// app matching empty overwrites job with nothing where app is not set.
		{opsQuery{expr: `sum by (namespace, service) (label_replace(label_replace(rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]), "service", "$1", "job", "(.*)"), "service", "$1", "app", "(.*)"))`, shows: `{{service}}`}, 1},
		// Two made apart in one query, each checked.
		{opsQuery{expr: `max by (namespace, service) (label_replace(label_replace(rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]), "service", "$1", "job", "(.*)"), "service", "$1", "app", "(.+)")) / max by (namespace, service) (label_replace(rate(req_total{app_kubernetes_io_part_of="export-service"}[5m]), "service", "$1", "job", "(.*)"))`}, 1},
	} {
		if got := checkDeploymentsApart(testExposure(), tc.q); len(got) != tc.want {
			t.Errorf("checkDeploymentsApart(%s, shows %q) = %q, want %d problem(s)", tc.q.expr, tc.q.shows, got, tc.want)
		}
	}
}
