package e2e

import (
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// alertmanagerFile holds the inhibit rules ops copy into their Alertmanager.
const alertmanagerFile = "../../deploy/prometheus/alertmanager.yml"

// inhibitRule is one of alertmanagerFile's inhibit_rules: while an alert
// the source matchers select fires, the alerts the target matchers select
// are held back if they carry the same values of the equal labels.
type inhibitRule struct {
	SourceMatchers []string `yaml:"source_matchers"`
	TargetMatchers []string `yaml:"target_matchers"`
	Equal          []string
}

// checkInhibitRules returns what the inhibit rules of path get wrong
// about the alert rules, given each alert's queries: an alert name no
// rule of alerts.yml has (the rule would never inhibit, or never be
// inhibited), an equal label an alert's result lacks (Alertmanager then
// compares the label's absence, so the rule inhibits across every
// upstream, or never), or a label both a source and a target alert carry
// that equal leaves out (one namespace's upstream down would hold back
// another namespace's warnings of that upstream).
func checkInhibitRules(t *testing.T, path string, alerts map[string]opsQuery, labelsOf func(opsQuery) labelSet) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		InhibitRules []inhibitRule `yaml:"inhibit_rules"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(file.InhibitRules) == 0 {
		t.Fatalf("%s holds no inhibit_rules", path)
	}
	var problems []string
	for i, rule := range file.InhibitRules {
		named := func(matchers []string) []string {
			var known []string
			for _, matcher := range matchers {
				names, err := alertNames(matcher)
				if err != nil {
					problems = append(problems, fmt.Sprintf("inhibit rule %d: %v", i, err))
				}
				for _, name := range names {
					q, ok := alerts[name]
					if !ok {
						problems = append(problems, fmt.Sprintf("inhibit rule %d names alert %s, which alerts.yml has not", i, name))
						continue
					}
					known = append(known, name)
					labels := labelsOf(q)
					for _, label := range rule.Equal {
						if !labels[label] {
							problems = append(problems, fmt.Sprintf("inhibit rule %d: equal label %s is not on alert %s (its labels: %s)", i, label, name, labels))
						}
					}
				}
			}
			return known
		}
		sources, targets := named(rule.SourceMatchers), named(rule.TargetMatchers)
		for _, source := range sources {
			for _, target := range targets {
				shared := labelsOf(alerts[source]).intersect(labelsOf(alerts[target]))
				for _, label := range slices.Sorted(maps.Keys(shared.minus(rule.Equal...))) {
					if !alerts[source].own[label] && !alerts[target].own[label] { // severity differs by design
						problems = append(problems, fmt.Sprintf("inhibit rule %d: alerts %s and %s both carry %s, which equal leaves out: an alert of one %s holds back those of every other", i, source, target, label, label))
					}
				}
			}
		}
	}
	return problems
}

// alertMatcher is the one form of matcher the inhibit rules use: on the
// alert's name, equal to one or matching an alternation of names.
var alertMatcher = regexp.MustCompile(`^alertname(=~?)"([A-Za-z0-9_|]+)"$`)

// alertNames returns the alert names matcher selects.
func alertNames(matcher string) ([]string, error) {
	m := alertMatcher.FindStringSubmatch(strings.TrimSpace(matcher))
	if m == nil {
		return nil, fmt.Errorf("matcher %q is not alertname=\"A\" or alertname=~\"A|B\": the check reads no other", matcher)
	}
	if m[1] == "=" {
		return []string{m[2]}, nil
	}
	return strings.Split(m[2], "|"), nil
}
