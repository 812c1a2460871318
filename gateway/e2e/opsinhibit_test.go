package e2e

import (
	"fmt"
	"os"
	"regexp"
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
// inhibited), or an equal label an alert's result lacks (Alertmanager then
// compares the label's absence, so the rule inhibits across every
// upstream, or never).
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
		for _, matcher := range append(rule.SourceMatchers, rule.TargetMatchers...) {
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
				labels := labelsOf(q)
				for _, label := range rule.Equal {
					if !labels[label] {
						problems = append(problems, fmt.Sprintf("inhibit rule %d: equal label %s is not on alert %s (its labels: %s)", i, label, name, labels))
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
