package e2e

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A legend or an alert's annotation printing a label the result lacks
// prints nothing there.
func TestCheckOpsQueryPrintedLabels(t *testing.T) {
	for _, tc := range []struct {
		q    opsQuery
		want int // problems
	}{
		{opsQuery{expr: `sum by (route) (rate(req_total[1m]))`, shows: `{{route}}`}, 0},
		{opsQuery{expr: `sum by (route) (rate(req_total[1m]))`, shows: `{{ code }} on {{route}}`}, 1},
		{opsQuery{expr: `max by (upstream) (instances) > 0`, shows: `{{ $labels.upstream }} {{ $labels.severity }}`, own: setOf("severity")}, 0},
		{opsQuery{expr: `max(instances) > 0`, shows: `{{ $labels.upstream }}, {{ index $labels "state" }}, {{ $value }}`}, 2},
		// Go template keywords are no labels; the labels in the branches are.
		{opsQuery{expr: `max by (app) (instances) > 0`, shows: `{{ with $labels.app }}{{ . }}{{ else }}{{ $labels.job }}{{ end }}`}, 1},
		{opsQuery{expr: `max by (app, job) (instances) > 0`, shows: `{{ with $labels.app }}{{ . }}{{ else }}{{ $labels.job }}{{ end }}`}, 0},
		// A misspelt value: the alert never fires, whatever it prints.
		{opsQuery{expr: `max by (upstream) (instances{state="ot"}) > 0`, shows: `{{ $labels.upstream }}`}, 1},
	} {
		if got := checkOpsQuery(testExposure(), tc.q); len(got) != tc.want {
			t.Errorf("checkOpsQuery(%s, shows %q) = %q, want %d problem(s)", tc.q.expr, tc.q.shows, got, tc.want)
		}
	}
}

func TestExpandTemplate(t *testing.T) {
	vars := map[string][]string{"service_label": {"job", "app"}, "__rate_interval": {"5m"}}
	q := opsQuery{where: "p", expr: `sum by (${service_label}) (rate(x[$__rate_interval]))`, shows: `{{${service_label}}}`}
	got := expandTemplate(q, vars)
	want := []opsQuery{
		{where: "p (service_label=job) (__rate_interval=5m)", expr: `sum by (job) (rate(x[5m]))`, shows: `{{job}}`},
		{where: "p (service_label=app) (__rate_interval=5m)", expr: `sum by (app) (rate(x[5m]))`, shows: `{{app}}`},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(opsQuery{})); diff != "" {
		t.Errorf("expandTemplate(%s) (-want +got):\n%s", q.expr, diff)
	}
	// What names no variable stays, and a misspelt one fails the parse.
	for _, expr := range []string{`label_replace(x, "a", "$1", "b", "(.*)")`, `rate(x[$__rate_intreval])`} {
		if got := expandTemplate(opsQuery{expr: expr}, vars); len(got) != 1 || got[0].expr != expr {
			t.Errorf("expandTemplate(%s) = %+v, want it unchanged", expr, got)
		}
	}
	if _, problems := checkQuery(testExposure(), `rate(req_total[$__rate_intreval])`); len(problems) == 0 {
		t.Errorf("checkQuery with a misspelt variable left in = no problem, want one")
	}
}

func TestWordsIn(t *testing.T) {
	var got []string
	for _, w := range wordsIn("histogram_quantile(0.99, sum by (le, route) (rate(d_bucket{route!=\"x y\", code=~'5..'}[5m] offset 1h))) > 2e3 and on (job) up # `a b` \"c\"\n or nan") {
		got = append(got, w.text)
	}
	want := []string{"histogram_quantile", "sum", "by", "le", "route", "rate", "d_bucket", "route", "code", "offset", "and", "on", "job", "up", "or", "nan"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("wordsIn = %q (-want +got):\n%s", got, diff)
	}
}
