package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// labelSet is a set of label names.
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
// x_count) and the label names its series carry.
type exposure map[string]labelSet

// add records a scraped metric family.
func (e exposure) add(f *dto.MetricFamily) {
	labels := labelSet{}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = true
		}
	}
	name := f.GetName()
	put := func(series string, l labelSet) { e[series] = l.union(e[series]) }
	switch f.GetType() {
	case dto.MetricType_HISTOGRAM:
		put(name+"_bucket", labels.union(setOf("le")))
		put(name+"_sum", labels)
		put(name+"_count", labels)
	case dto.MetricType_SUMMARY:
		put(name, labels.union(setOf("quantile")))
		put(name+"_sum", labels)
		put(name+"_count", labels)
	default:
		put(name, labels)
	}
}

// targetLabels are added by Prometheus at the scrape, not by a binary: job
// and instance always, app where Kubernetes pod discovery maps the pod
// labels (deploy/k8s labels every pod app=<service>; the dashboard's
// "Service label" variable and the alerts name it).
var targetLabels = setOf("job", "instance", "app")

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

// checkQuery parses and evaluates query; it returns the labels of its
// result and what it reads that the binaries do not expose.
func checkQuery(exposed exposure, query string) (labelSet, []string) {
	n, err := parseQuery(query)
	if err != nil {
		return nil, []string{"cannot parse: " + err.Error()}
	}
	c := &queryCheck{exposed: exposed}
	return c.eval(n).labels, c.problems
}

func (c *queryCheck) eval(n node) value {
	switch n := n.(type) {
	case *numberNode:
		return value{scalar: true}
	case *stringNode:
		c.problem("a string (%q) where series or a number go", n.value)
		return value{scalar: true}
	case *selectorNode:
		return c.selector(n)
	case *rangeNode:
		return c.eval(n.expr)
	case *callNode:
		return c.call(n)
	case *aggregateNode:
		return c.aggregate(n)
	case *binaryNode:
		return c.binary(n)
	}
	panic(fmt.Sprintf("queryCheck: unknown node %T", n))
}

func (c *queryCheck) selector(s *selectorNode) value {
	if s.metric == "" || slices.Contains(s.matchers, "__name__") {
		c.problem("a selector must name its metric before { } to be checked")
		return value{labels: labelSet{}}
	}
	labels, ok := c.exposed[s.metric]
	if !ok {
		c.problem("no binary exposes %s", s.metric)
		return value{labels: labelSet{}, unexposed: true}
	}
	labels = labels.union(targetLabels)
	for _, l := range s.matchers {
		if !labels[l] {
			c.problem("%s has no label %s (its labels: %s)", s.metric, l, labels)
		}
	}
	return value{labels: labels}
}

// aggregate checks that every label of the grouping is one of the
// aggregated series': grouping by a label they lack gives one series
// without it.
func (c *queryCheck) aggregate(a *aggregateNode) value {
	arity := 1
	if aggregationParams[a.op] {
		arity = 2
	}
	if len(a.args) != arity {
		c.problem("%s takes %d argument(s), has %d", a.op, arity, len(a.args))
		return value{labels: labelSet{}}
	}
	if _, isString := a.args[0].(*stringNode); arity == 2 && !isString {
		c.eval(a.args[0])
	}
	in := c.eval(a.args[arity-1])
	clause := "by"
	if a.without {
		clause = "without"
	}
	for _, l := range a.grouping {
		if in.lacks(l) {
			c.problem("%s %s (%s): %s is no label of the series it aggregates (theirs: %s)",
				a.op, clause, strings.Join(a.grouping, ", "), l, in.labels)
		}
	}
	out := value{unexposed: in.unexposed}
	switch {
	case a.op == "topk" || a.op == "bottomk" || a.op == "limitk" || a.op == "limit_ratio":
		return in // they select series, and keep their labels
	case a.without:
		out.labels = in.labels.minus(a.grouping...)
	default:
		out.labels = setOf(a.grouping...).intersect(in.labels)
	}
	if s, ok := a.args[0].(*stringNode); ok && a.op == "count_values" {
		out.labels[s.value] = true
	}
	return out
}

// aggregationParams are the aggregations taking a parameter first.
var aggregationParams = map[string]bool{
	"topk": true, "bottomk": true, "quantile": true, "count_values": true, "limitk": true, "limit_ratio": true,
}

// binary checks the labels of on (...), ignoring (...) and group_x (...),
// and returns the labels PromQL gives the result.
func (c *queryCheck) binary(b *binaryNode) value {
	l, r := c.eval(b.lhs), c.eval(b.rhs)
	switch {
	case l.scalar && r.scalar:
		return value{scalar: true}
	case l.scalar:
		return r
	case r.scalar:
		return l
	}
	out := value{unexposed: l.unexposed || r.unexposed}
	m := b.matching
	if m != nil {
		c.matchingLabels(b.op, m, l, r)
	}
	switch {
	case b.op == "and" || b.op == "unless":
		out.labels = l.labels
	case b.op == "or" || m == nil:
		out.labels = l.labels.intersect(r.labels)
	case m.group == "left":
		out.labels = l.labels.union(setOf(m.include...))
	case m.group == "right":
		out.labels = r.labels.union(setOf(m.include...))
	case m.on: // one-to-one on (...) keeps only those labels
		out.labels = setOf(m.labels...).intersect(l.labels)
	default:
		out.labels = l.labels.intersect(r.labels).minus(m.labels...)
	}
	return out
}

// matchingLabels checks that on (...) names labels of both sides, ignoring
// (...) labels of one side at least, and group_x (...) labels of the other
// side, which it copies.
func (c *queryCheck) matchingLabels(op string, m *matching, l, r value) {
	for _, name := range m.labels {
		switch {
		case m.on && (l.lacks(name) || r.lacks(name)):
			c.problem("%s on (%s): %s is not a label of both sides (left: %s, right: %s)", op, name, name, l.labels, r.labels)
		case !m.on && l.lacks(name) && r.lacks(name):
			c.problem("%s ignoring (%s): neither side has %s", op, name, name)
		}
	}
	one := r
	if m.group == "right" {
		one = l
	}
	for _, name := range m.include {
		if one.lacks(name) {
			c.problem("%s group_%s (%s): the other side has no label %s (%s)", op, m.group, name, name, one.labels)
		}
	}
}

func (c *queryCheck) call(f *callNode) value {
	switch {
	case f.fn == "histogram_quantile":
		return c.histogramQuantile(f)
	case f.fn == "absent" || f.fn == "absent_over_time":
		// Its one series has the labels of the selector's = matchers:
		// counted as none, which no query here needs.
		c.vectorArg(f)
		return value{labels: labelSet{}}
	case f.fn == "scalar":
		c.vectorArg(f)
		return value{scalar: true}
	case f.fn == "vector":
		c.args(f)
		return value{labels: labelSet{}}
	case f.fn == "time" || f.fn == "pi":
		return value{scalar: true}
	case f.fn == "label_replace" || f.fn == "label_join":
		return c.relabel(f)
	case labelKeepingFunctions[f.fn]:
		return c.vectorArg(f)
	}
	c.problem("the check does not know the function %s: teach it how its result's labels follow from its arguments", f.fn)
	return value{labels: labelSet{}}
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

// args evaluates every argument.
func (c *queryCheck) args(f *callNode) []value {
	vs := make([]value, len(f.args))
	for i, a := range f.args {
		vs[i] = c.eval(a)
	}
	return vs
}

// vectorArg returns the one series argument among f's arguments.
func (c *queryCheck) vectorArg(f *callNode) value {
	var series []value
	for _, v := range c.args(f) {
		if !v.scalar {
			series = append(series, v)
		}
	}
	if len(series) != 1 {
		c.problem("%s takes one series argument, has %d", f.fn, len(series))
		return value{labels: labelSet{}}
	}
	return series[0]
}

// histogramQuantile checks that the buckets still carry le, which a sum
// that does not keep it drops (the quantile is then empty).
func (c *queryCheck) histogramQuantile(f *callNode) value {
	in := c.vectorArg(f)
	if len(f.args) == 2 && in.lacks("le") {
		c.problem("histogram_quantile over series without le (theirs: %s): keep le in the sum's by (...)", in.labels)
	}
	return value{labels: in.labels.minus("le"), unexposed: in.unexposed}
}

// relabel evaluates label_replace(v, dst, replacement, src, regex) and
// label_join(v, dst, separator, src...): the result has dst besides v's
// labels, and the sources must be labels of v.
func (c *queryCheck) relabel(f *callNode) value {
	if f.fn == "label_replace" && len(f.args) != 5 || len(f.args) < 3 {
		c.problem("%s: wrong number of arguments (%d)", f.fn, len(f.args))
		return value{labels: labelSet{}}
	}
	strs := []string{}
	for _, a := range f.args[1:] {
		s, ok := a.(*stringNode)
		if !ok {
			c.problem("%s takes strings after its series", f.fn)
			return value{labels: labelSet{}}
		}
		strs = append(strs, s.value)
	}
	in := c.eval(f.args[0])
	sources := strs[2:] // label_join's
	if f.fn == "label_replace" {
		sources = strs[2:3]
	}
	for _, src := range sources {
		if in.lacks(src) {
			c.problem("%s reads %s, which its series lack (theirs: %s)", f.fn, src, in.labels)
		}
	}
	return value{labels: in.labels.union(setOf(strs[0])), unexposed: in.unexposed}
}
