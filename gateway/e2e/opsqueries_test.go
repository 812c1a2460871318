package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The files ops run the stack with, from this package's folder.
const (
	dashboardFile = "../../deploy/grafana/export-service.json"
	alertsFile    = "../../deploy/prometheus/alerts.yml"
)

// opsQuery is a PromQL query of the dashboard or of the alert rules.
type opsQuery struct {
	where string // which panel or rule, for the failure message
	expr  string
	// shows is the text that prints the result's labels: a legend
	// ({{route}}), or an alert's labels and annotations ({{ $labels.route }}).
	shows string
	// own are labels the rule itself adds to its alerts.
	own labelSet
}

// shownLabels are the label names q.shows prints.
func (q opsQuery) shownLabels() []string {
	var names []string
	for _, re := range []*regexp.Regexp{legendLabel, templateLabel} {
		for _, m := range re.FindAllStringSubmatch(q.shows, -1) {
			name := strings.Join(m[1:], "") // the one group that matched
			if re == legendLabel && templateKeywords[name] {
				continue // an annotation's {{ else }}, {{ end }}: Go template, no label
			}
			names = append(names, name)
		}
	}
	return names
}

var (
	legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	// templateKeywords are the words of Go's text/template that stand
	// alone between braces, as an alert's annotation may hold them.
	templateKeywords = map[string]bool{"else": true, "end": true, "break": true, "continue": true, "nil": true}
	templateLabel    = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)|index\s+\$labels\s+"([a-zA-Z_][a-zA-Z0-9_]*)"`)
)

// dashboard is the part of a Grafana dashboard that holds queries.
type dashboard struct {
	Templating struct {
		List []struct {
			Name, Type, Query string
			Options           []struct{ Value string }
		}
	}
	Panels []panel
}

type panel struct {
	Title   string
	Targets []struct {
		Expr, LegendFormat string
		RefID              string `json:"refId"`
	}
	Panels []panel // a row's
}

// dashboardQueries returns every target of the dashboard at path, once per
// value of each template variable it uses.
func dashboardQueries(t *testing.T, path string) []opsQuery {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	vars := templateValues(t, d)
	var queries []opsQuery
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			for _, tg := range p.Targets {
				q := opsQuery{where: fmt.Sprintf("%s: panel %q, target %s", path, p.Title, tg.RefID), expr: tg.Expr, shows: tg.LegendFormat}
				queries = append(queries, expandTemplate(q, vars)...)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	// An expr somewhere the walk does not look would go unchecked.
	if n, seen := bytes.Count(raw, []byte(`"expr"`)), countTargets(d.Panels); n != seen {
		t.Fatalf("%s has %d \"expr\" fields, but its panels' targets hold %d: the check must read them all", path, n, seen)
	}
	return queries
}

func countTargets(panels []panel) int {
	n := 0
	for _, p := range panels {
		n += len(p.Targets) + countTargets(p.Panels)
	}
	return n
}

// templateValues returns the values of the dashboard's variables. A query
// variable (label_values(...)) would read series too, which the check does
// not do yet: it fails rather than let one pass unread.
func templateValues(t *testing.T, d dashboard) map[string][]string {
	t.Helper()
	vars := map[string][]string{
		// Grafana's own; a range is all they can stand for.
		"__rate_interval": {"5m"}, "__interval": {"1m"}, "__range": {"1h"},
	}
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
		case "custom":
			for _, o := range v.Options {
				vars[v.Name] = append(vars[v.Name], o.Value)
			}
			if len(v.Options) == 0 {
				vars[v.Name] = strings.Split(v.Query, ",")
			}
		default:
			t.Fatalf("dashboard variable %s is of type %s, which the check does not read", v.Name, v.Type)
		}
	}
	return vars
}

// templateVar is a variable in a query or a legend: $name, ${name},
// ${name:format} or [[name]].
var templateVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// expandTemplate returns q once per combination of the values of the
// variables it uses, each replaced in its query and its legend alike. As
// in Grafana, what names no variable stays (label_replace's "$1"): left in
// the query by a misspelt variable, a $ fails the parse.
func expandTemplate(q opsQuery, vars map[string][]string) []opsQuery {
	name := ""
	for _, m := range templateVar.FindAllStringSubmatch(q.expr+"\n"+q.shows, -1) {
		if _, ok := vars[m[1]+m[2]+m[3]]; ok {
			name = m[1] + m[2] + m[3]
			break
		}
	}
	if name == "" {
		return []opsQuery{q}
	}
	var out []opsQuery
	for _, v := range vars[name] {
		replace := func(s string) string {
			return templateVar.ReplaceAllStringFunc(s, func(ref string) string {
				if m := templateVar.FindStringSubmatch(ref); m[1]+m[2]+m[3] == name {
					return v
				}
				return ref
			})
		}
		e := q
		e.where, e.expr, e.shows = fmt.Sprintf("%s (%s=%s)", q.where, name, v), replace(q.expr), replace(q.shows)
		out = append(out, expandTemplate(e, vars)...)
	}
	return out
}

// alertQueries returns the expression of every alert rule in path.
func alertQueries(t *testing.T, path string) []opsQuery {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Record, Expr string
				Labels, Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var queries []opsQuery
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Record != "" || r.Alert == "" || r.Expr == "" {
				// A recorded series would have to join the exposure first.
				t.Fatalf("%s, group %s: a rule that is not an alert with an expr (record %q, alert %q) is not checked yet", path, g.Name, r.Record, r.Alert)
			}
			own := labelSet{}
			var shows []string
			for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
				own[k] = true
				shows = append(shows, r.Labels[k])
			}
			for _, k := range slices.Sorted(maps.Keys(r.Annotations)) {
				shows = append(shows, r.Annotations[k])
			}
			queries = append(queries, opsQuery{where: path + ": alert " + r.Alert, expr: r.Expr, shows: strings.Join(shows, "\n"), own: own})
		}
	}
	// A rule somewhere the decoding does not look would go unchecked.
	if n := bytes.Count(raw, []byte("expr:")); n != len(queries) {
		t.Fatalf("%s has %d \"expr:\" keys, but its groups' rules hold %d: the check must read them all", path, n, len(queries))
	}
	return queries
}
