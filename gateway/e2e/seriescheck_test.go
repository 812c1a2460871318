package e2e

import (
	"fmt"
	"maps"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"

	"github.com/VictoriaMetrics/metricsql"
	dto "github.com/prometheus/client_model/go"
)

// labelSet is a set of label names, or of the values of one label.
type labelSet map[string]bool

func setOf(names ...string) labelSet {
	s := labelSet{}
	for _, n := range names {
		s[n] = true
	}
	return s
}

func (s labelSet) union(o labelSet) labelSet {
	u := labelSet{}
	maps.Copy(u, s)
	maps.Copy(u, o)
	return u
}

func (s labelSet) intersect(o labelSet) labelSet {
	i := labelSet{}
	for n := range s {
		if o[n] {
			i[n] = true
		}
	}
	return i
}

func (s labelSet) minus(names ...string) labelSet {
	d := labelSet{}
	maps.Copy(d, s)
	for _, n := range names {
		delete(d, n)
	}
	return d
}

func (s labelSet) String() string { return "{" + strings.Join(slices.Sorted(maps.Keys(s)), ", ") + "}" }

// exposure is what Prometheus stores of the binaries' scrapes: every
// series name it can be queried by (a histogram x as x_bucket, x_sum and
// x_count) and the values of each label its series carry.
type exposure map[string]labelValues

// labelValues are the values each label takes. Those of le and quantile
// are not read (nil): Prometheus writes the numbers its own way ("1" may
// be stored as "1.0").
type labelValues map[string]labelSet

func (lv labelValues) labels() labelSet { return setOf(slices.Collect(maps.Keys(lv))...) }

// add records a scraped metric family.
func (e exposure) add(f *dto.MetricFamily) {
	values := labelValues{}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			values[l.GetName()] = values[l.GetName()].union(setOf(l.GetValue()))
		}
	}
	name := f.GetName()
	put := func(series string, numbered ...string) {
		if e[series] == nil {
			e[series] = labelValues{}
		}
		for l, vs := range values {
			e[series][l] = vs.union(e[series][l])
		}
		for _, l := range numbered {
			e[series][l] = nil
		}
	}
	switch f.GetType() {
	case dto.MetricType_HISTOGRAM:
		put(name+"_bucket", "le")
		put(name + "_sum")
		put(name + "_count")
	case dto.MetricType_SUMMARY:
		put(name, "quantile")
		put(name + "_sum")
		put(name + "_count")
	default:
		put(name)
	}
}

// targetLabels are added by Prometheus at the scrape, not by a binary: job
// and instance always, app, app_kubernetes_io_part_of and namespace where
// Kubernetes pod discovery maps the pod labels and the pod's namespace, as
// the usual kubernetes-pods job does (deploy/k8s labels every pod
// app=<service> and app.kubernetes.io/part-of=export-service; the
// dashboard and the alerts read this product's targets by the latter,
// name services by app, else job, and keep namespace apart).
var targetLabels = setOf("job", "instance", "app", ownTargetsLabel, "namespace")

// scrapeSeries are the series Prometheus writes of each scrape itself, with
// the target's labels alone: up is 0 when the target did not answer.
var scrapeSeries = setOf("up")

// value is what an expression evaluates to, as far as labels go: a scalar,
// or series carrying labels. A label in doubt is left out of labels, so
// that a query relying on it fails the check instead of passing it.
type value struct {
	scalar bool
	labels labelSet
	// unexposed: computed from a series no binary exposes, a problem
	// already; its labels are not checked (nothing would have them).
	unexposed bool
}

// lacks reports whether v's series lack label.
func (v value) lacks(label string) bool { return !v.unexposed && !v.labels[label] }

// queryCheck evaluates a parsed query against an exposure, noting every
// series and label it reads that is not there.
type queryCheck struct {
	exposed  exposure
	problems []string
}

func (c *queryCheck) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// checkQuery parses query and evaluates it; it returns the labels of its
// result and what it reads that the binaries do not expose. A syntax, a
// function or an aggregation the check does not know is a problem, never
// skipped: a query it cannot read fails instead of passing unread.
//
// metricsql parses MetricsQL, a superset of PromQL: every query Prometheus
// reads, and some it would refuse (rate(x) without a range, x[5m] where
// series go, limit, keep_metric_names, WITH templates...). That is
// accepted here: the check is about names, promtool checks the alert
// rules' syntax (make test), and a dashboard query Prometheus refuses
// shows an error on its panel.
func checkQuery(exposed exposure, query string) (labelSet, []string) {
	e, err := metricsql.Parse(query)
	if err != nil {
		return nil, []string{"cannot parse: " + err.Error()}
	}
	c := &queryCheck{exposed: exposed}
	return c.eval(e).labels, c.problems
}

// eval evaluates e where PromQL wants series or a number.
func (c *queryCheck) eval(e metricsql.Expr) value {
	switch e := e.(type) {
	case *metricsql.NumberExpr:
		return value{scalar: true}
	case *metricsql.MetricExpr:
		return c.selector(e)
	case *metricsql.RollupExpr:
		return c.eval(e.Expr) // x[5m], (expr)[30m:1m], x offset 1h, x @ end()
	case *metricsql.FuncExpr:
		return c.call(e)
	case *metricsql.AggrFuncExpr:
		return c.aggregate(e)
	case *metricsql.BinaryOpExpr:
		return c.binary(e)
	}
	c.problem("%s (%T) where series or a number go", e.AppendString(nil), e)
	return value{scalar: true}
}

func (c *queryCheck) selector(s *metricsql.MetricExpr) value {
	// The parse puts the metric's name first, as a __name__ matcher; more
	// than one list of matchers is MetricsQL's {a="x" or b="y"}.
	if len(s.LabelFilterss) != 1 || len(s.LabelFilterss[0]) == 0 || s.LabelFilterss[0][0].Label != "__name__" ||
		s.LabelFilterss[0][0].IsRegexp || s.LabelFilterss[0][0].IsNegative {
		c.problem("a selector must be one {...} that names its metric to be checked: %s", s.AppendString(nil))
		return value{}
	}
	metric, matchers := s.LabelFilterss[0][0].Value, s.LabelFilterss[0][1:]
	values, ok := c.exposed[metric]
	if scrapeSeries[metric] {
		values, ok = labelValues{}, true
	}
	if !ok {
		c.problem("no binary exposes %s", metric)
		return value{unexposed: true}
	}
	labels := values.labels().union(targetLabels)
	for _, m := range matchers {
		switch {
		case !labels[m.Label]:
			c.problem("%s has no label %s (its labels: %s)", metric, m.Label, labels)
		case !targetLabels[m.Label]: // their values are the scrape's
			c.matcherValue(metric, m, values[m.Label])
		}
	}
	return value{labels: labels}
}

// matcherValue checks that m matches a value its label takes on metric,
// and so does each branch of its regex alone. A value no series has
// selects nothing with = and =~ (the panel shows "No data", the alert
// never fires) and excludes nothing with != and !~: misspelt either way.
func (c *queryCheck) matcherValue(metric string, m metricsql.LabelFilter, values labelSet) {
	where := fmt.Sprintf("%s{%s}", metric, m.AppendString(nil))
	switch {
	case values == nil:
		c.problem("%s: the check does not read the values of %s", where, m.Label)
	case !m.IsRegexp && !values[m.Value]:
		c.problem("%s: no series has %s %q (its values: %s)", where, m.Label, m.Value, values)
	case m.IsRegexp:
		branches, err := regexBranches(m.Value)
		if err != nil {
			c.problem("%s: %v", where, err)
		}
		for _, b := range branches { // anchored, as Prometheus does
			re := regexp.MustCompile("^(?:" + b.String() + ")$")
			if !slices.ContainsFunc(slices.Collect(maps.Keys(values)), re.MatchString) {
				c.problem("%s: no series has a %s that %s matches (its values: %s)", where, m.Label, b, values)
			}
		}
	}
}

// regexBranches returns pattern once for each branch of each of its
// alternations, that branch alone in the alternation's place: (a|b)c|d
// gives ac, bc and d; a pattern without one is its own branch. Go's parse
// merges branches of one character into a class first (x|y is [xy], and
// GET /a|GET /b is GET /[ab]): such a class is checked as a whole.
func regexBranches(pattern string) ([]*syntax.Regexp, error) {
	re, err := syntax.Parse(pattern, syntax.Perl|syntax.DotNL) // Prometheus's dot matches \n
	if err != nil {
		return nil, err
	}
	if b := branchesIn(re); len(b) > 0 {
		return b, nil
	}
	return []*syntax.Regexp{re}, nil
}

// branchesIn returns re once per branch of each alternation within it,
// none if it has none.
func branchesIn(re *syntax.Regexp) []*syntax.Regexp {
	var out []*syntax.Regexp
	if re.Op == syntax.OpAlternate {
		for _, sub := range re.Sub {
			if nested := branchesIn(sub); len(nested) > 0 {
				out = append(out, nested...)
			} else {
				out = append(out, sub)
			}
		}
		return out
	}
	for i, sub := range re.Sub {
		for _, b := range branchesIn(sub) {
			copied := *re
			copied.Sub = slices.Clone(re.Sub)
			copied.Sub[i] = b
			out = append(out, &copied)
		}
	}
	return out
}

// aggregations are PromQL's, with the number of parameters each takes
// before the series it aggregates.
var aggregations = map[string]int{
	"sum": 0, "avg": 0, "count": 0, "min": 0, "max": 0, "group": 0, "stddev": 0, "stdvar": 0,
	"topk": 1, "bottomk": 1, "quantile": 1, "count_values": 1, "limitk": 1, "limit_ratio": 1,
}

// aggregate checks that every label of the grouping is one of the
// aggregated series': grouping by a label they lack gives one series
// without it.
func (c *queryCheck) aggregate(a *metricsql.AggrFuncExpr) value {
	params, known := aggregations[a.Name]
	if !known {
		c.problem("the check does not know the aggregation %s", a.Name)
		return value{}
	}
	if len(a.Args) != params+1 {
		c.problem("%s takes %d argument(s), has %d", a.Name, params+1, len(a.Args))
		return value{}
	}
	label, isString := a.Args[0].(*metricsql.StringExpr) // count_values's
	if params == 1 && !isString {
		c.eval(a.Args[0])
	}
	in := c.eval(a.Args[params])
	grouping := a.Modifier.Args
	for _, l := range grouping {
		if in.lacks(l) {
			c.problem("%s %s (%s): %s is no label of the series it aggregates (theirs: %s)",
				a.Name, a.Modifier.Op, strings.Join(grouping, ", "), l, in.labels)
		}
	}
	out := value{unexposed: in.unexposed}
	switch {
	case a.Name == "topk" || a.Name == "bottomk" || a.Name == "limitk" || a.Name == "limit_ratio":
		return in // they select series, and keep their labels
	case a.Modifier.Op == "without":
		out.labels = in.labels.minus(grouping...)
	default:
		out.labels = setOf(grouping...).intersect(in.labels)
	}
	if a.Name == "count_values" && isString {
		out.labels[label.S] = true
	}
	return out
}

// binary checks the labels of on (...), ignoring (...) and group_x (...),
// and returns the labels PromQL gives the result.
func (c *queryCheck) binary(b *metricsql.BinaryOpExpr) value {
	l, r := c.eval(b.Left), c.eval(b.Right)
	switch {
	case l.scalar && r.scalar:
		return value{scalar: true}
	case l.scalar:
		return r
	case r.scalar:
		return l
	}
	out := value{unexposed: l.unexposed || r.unexposed}
	match, group := b.GroupModifier, b.JoinModifier
	if match.Op != "" {
		c.matchingLabels(b.Op, match, group, l, r)
	}
	switch {
	case b.Op == "and" || b.Op == "unless":
		out.labels = l.labels
	case b.Op == "or" || match.Op == "":
		out.labels = l.labels.intersect(r.labels)
	case group.Op == "group_left":
		out.labels = l.labels.union(setOf(group.Args...))
	case group.Op == "group_right":
		out.labels = r.labels.union(setOf(group.Args...))
	case match.Op == "on": // one-to-one on (...) keeps only those labels
		out.labels = setOf(match.Args...).intersect(l.labels)
	default:
		out.labels = l.labels.intersect(r.labels).minus(match.Args...)
	}
	return out
}

// matchingLabels checks that on (...) names labels of both sides, ignoring
// (...) labels of one side at least, and group_x (...) labels of the other
// side, which it copies.
func (c *queryCheck) matchingLabels(op string, match, group metricsql.ModifierExpr, l, r value) {
	for _, name := range match.Args {
		switch {
		case match.Op == "on" && (l.lacks(name) || r.lacks(name)):
			c.problem("%s on (%s): %s is not a label of both sides (left: %s, right: %s)", op, name, name, l.labels, r.labels)
		case match.Op == "ignoring" && l.lacks(name) && r.lacks(name):
			c.problem("%s ignoring (%s): neither side has %s", op, name, name)
		}
	}
	one := r
	if group.Op == "group_right" {
		one = l
	}
	for _, name := range group.Args {
		if one.lacks(name) {
			c.problem("%s %s (%s): the other side has no label %s (%s)", op, group.Op, name, name, one.labels)
		}
	}
}

// labelKeepingFunctions take one series argument (and maybe numbers) and
// return series with its labels.
var labelKeepingFunctions = setOf(
	"rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "resets", "changes",
	"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time",
	"present_over_time", "stddev_over_time", "stdvar_over_time", "quantile_over_time", "mad_over_time",
	"abs", "ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn", "clamp", "clamp_min", "clamp_max",
	"timestamp", "sort", "sort_desc",
)

func (c *queryCheck) call(f *metricsql.FuncExpr) value {
	switch {
	case f.Name == "histogram_quantile":
		return c.histogramQuantile(f)
	case f.Name == "absent" || f.Name == "absent_over_time":
		// Its one series has the labels of the selector's = matchers:
		// counted as none, which no query here needs.
		c.seriesArg(f)
		return value{}
	case f.Name == "scalar":
		c.seriesArg(f)
		return value{scalar: true}
	case f.Name == "vector" || f.Name == "time" || f.Name == "pi":
		for _, a := range f.Args {
			c.eval(a)
		}
		return value{scalar: f.Name != "vector"}
	case f.Name == "label_replace" || f.Name == "label_join":
		return c.relabel(f)
	case labelKeepingFunctions[f.Name]:
		return c.seriesArg(f)
	}
	c.problem("the check does not know the function %q: teach it how its result's labels follow from its arguments", f.Name)
	return value{}
}

// seriesArg evaluates f's arguments and returns its one series argument.
func (c *queryCheck) seriesArg(f *metricsql.FuncExpr) value {
	var series []value
	for _, a := range f.Args {
		if v := c.eval(a); !v.scalar {
			series = append(series, v)
		}
	}
	if len(series) != 1 {
		c.problem("%s takes one series argument, has %d", f.Name, len(series))
		return value{}
	}
	return series[0]
}

// histogramQuantile checks that the buckets still carry le, which a sum
// that does not keep it drops (the quantile is then empty).
func (c *queryCheck) histogramQuantile(f *metricsql.FuncExpr) value {
	in := c.seriesArg(f)
	if len(f.Args) == 2 && in.lacks("le") {
		c.problem("histogram_quantile over series without le (theirs: %s): keep le in the sum's by (...)", in.labels)
	}
	return value{labels: in.labels.minus("le"), unexposed: in.unexposed}
}

// relabel evaluates label_replace(v, dst, replacement, src, regex) and
// label_join(v, dst, separator, src...): the result has dst besides v's
// labels, and the sources must be labels of v.
func (c *queryCheck) relabel(f *metricsql.FuncExpr) value {
	if f.Name == "label_replace" && len(f.Args) != 5 || len(f.Args) < 3 {
		c.problem("%s: wrong number of arguments (%d)", f.Name, len(f.Args))
		return value{}
	}
	var strs []string
	for _, a := range f.Args[1:] {
		s, ok := a.(*metricsql.StringExpr)
		if !ok {
			c.problem("%s takes strings after its series", f.Name)
			return value{}
		}
		strs = append(strs, s.S)
	}
	in := c.eval(f.Args[0])
	sources := strs[2:] // label_join's
	if f.Name == "label_replace" {
		sources = strs[2:3]
	}
	for _, src := range sources {
		if in.lacks(src) {
			c.problem("%s reads %s, which its series lack (theirs: %s)", f.Name, src, in.labels)
		}
	}
	return value{labels: in.labels.union(setOf(strs[0])), unexposed: in.unexposed}
}
