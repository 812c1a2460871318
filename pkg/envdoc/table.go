// Package envdoc reads what operators are told and given about each
// binary's environment: the configuration tables of the READMEs, the
// Kubernetes manifest, the Compose file and make run's script. Each
// binary's tests hold them against the variables the binary really reads
// (Recorder) and the Config its loader makes of them (Check), so that a
// setting documented, deployed or spelt wrong fails a test instead of being
// ignored without a word.
package envdoc

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Binaries are the project's binaries, as the tables and manifests name them.
var Binaries = []string{"gateway", "export-reader", "sales-writer", "shop-schema"}

// Setting is one variable of a configuration table.
type Setting struct {
	Name string // a variable, or a family such as OTEL_*
	// Default is the value the table gives as the default, "" when it
	// gives none (required, empty or unset).
	Default  string
	Required bool
	// Binaries are the binaries the table says read it (the root README's
	// table only; nil in a binary's own). MakeRunOnly: read by make run's
	// script, no binary.
	Binaries    []string
	MakeRunOnly bool
	Line        int // in the README, for messages
}

// ReadTable reads the first table under the "## Configuration" heading of
// a README. A row may name several variables (`A`, `B` or `A` / `_B`: a
// name starting with _ replaces the last word of the one before it); its
// defaults, and its binaries when separated by "/", then go one to each,
// in order, when there are as many as names, else each default applies to
// every name and every binary reads every name.
func ReadTable(path string) ([]Setting, error) {
	rows, err := configurationRows(path)
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%s: no table under ## Configuration", path)
	}
	cols := columns(rows[0].cells)
	if cols.name < 0 || cols.def < 0 {
		return nil, fmt.Errorf("%s:%d: the table has no variable or default column", path, rows[0].line)
	}
	var out []Setting
	for _, r := range rows[2:] { // after the header and its |---| line
		settings, err := cols.settings(r)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, r.line, err)
		}
		out = append(out, settings...)
	}
	return out, nil
}

type row struct {
	line  int
	cells []string
}

// configurationRows are the lines of the first table after the heading.
func configurationRows(path string) ([]row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []row
	inSection := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			if len(rows) > 0 {
				return rows, nil
			}
			inSection = strings.TrimSpace(line) == "## Configuration"
		case inSection && strings.HasPrefix(line, "|"):
			rows = append(rows, row{line: n, cells: splitRow(line)})
		case len(rows) > 0: // the table ended
			return rows, sc.Err()
		}
	}
	return rows, sc.Err()
}

// splitRow splits a Markdown table row into its trimmed cells; \| is a
// literal bar inside a cell.
func splitRow(line string) []string {
	line = strings.ReplaceAll(strings.TrimSpace(line), `\|`, "\x00")
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	cells := strings.Split(line, "|")
	for i, c := range cells {
		cells[i] = strings.TrimSpace(strings.ReplaceAll(c, "\x00", "|"))
	}
	return cells
}

type tableColumns struct{ name, def, binaries int }

func columns(header []string) tableColumns {
	c := tableColumns{-1, -1, -1}
	for i, h := range header {
		switch strings.ToLower(h) {
		case "variable", "env var":
			c.name = i
		case "default":
			c.def = i
		case "binaries":
			c.binaries = i
		}
	}
	return c
}

var (
	quoted      = regexp.MustCompile("`([^`]*)`")
	variable    = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	abbreviated = regexp.MustCompile(`^_[A-Z0-9_]+$`)
	familyEntry = regexp.MustCompile(`^[A-Z][A-Z0-9_]*\*$`)
)

func (c tableColumns) settings(r row) ([]Setting, error) {
	if len(r.cells) <= max(c.name, c.def, c.binaries) {
		return nil, fmt.Errorf("a row with %d cells", len(r.cells))
	}
	names, err := rowNames(r.cells[c.name])
	if err != nil {
		return nil, err
	}
	defaults, required := rowDefaults(r.cells[c.def])
	if len(defaults) > 1 && len(defaults) != len(names) {
		defaults = defaults[:1] // the first value, then notes (`0s` (`5s` in deploy/k8s))
	}
	var binaries [][]string
	makeRunOnly := false
	if c.binaries >= 0 {
		if binaries, makeRunOnly, err = rowBinaries(r.cells[c.binaries], len(names)); err != nil {
			return nil, err
		}
	}
	out := make([]Setting, len(names))
	for i, name := range names {
		out[i] = Setting{Name: name, Required: required, MakeRunOnly: makeRunOnly, Line: r.line}
		if len(defaults) > 0 {
			out[i].Default = defaults[min(i, len(defaults)-1)]
		}
		if len(binaries) > 0 {
			out[i].Binaries = binaries[min(i, len(binaries)-1)]
		}
	}
	return out, nil
}

// rowNames are the variables of a row's first cell.
func rowNames(cell string) ([]string, error) {
	var names []string
	for _, m := range quoted.FindAllStringSubmatch(cell, -1) {
		token := m[1]
		switch {
		case variable.MatchString(token), familyEntry.MatchString(token):
			names = append(names, token)
		case abbreviated.MatchString(token) && len(names) > 0:
			last := names[len(names)-1]
			names = append(names, last[:strings.LastIndex(last, "_")]+token)
		default:
			return nil, fmt.Errorf("`%s` is not a variable name", token)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no variable in %q", cell)
	}
	return names, nil
}

// rowDefaults are the quoted values of a default cell, none when it says
// there is none (—, empty, unset).
func rowDefaults(cell string) (values []string, required bool) {
	required = strings.Contains(cell, "required")
	lower := strings.ToLower(cell)
	if strings.HasPrefix(cell, "—") || strings.HasPrefix(lower, "empty") || strings.HasPrefix(lower, "unset") {
		return nil, required
	}
	for _, m := range quoted.FindAllStringSubmatch(cell, -1) {
		values = append(values, m[1])
	}
	return values, required
}

// rowBinaries reads a binaries cell: "all", "all four", "all but X", "X, Y"
// (each reads every name of the row), "X / Y" (one to each name) or
// "`make run` only".
func rowBinaries(cell string, names int) (each [][]string, makeRunOnly bool, err error) {
	cell = strings.ToLower(strings.ReplaceAll(cell, "`", ""))
	switch {
	case cell == "make run only":
		return nil, true, nil
	case cell == "all" || cell == "all four":
		return [][]string{Binaries}, false, nil
	case strings.HasPrefix(cell, "all but "):
		but := strings.TrimPrefix(cell, "all but ")
		if !slices.Contains(Binaries, but) {
			return nil, false, fmt.Errorf("binaries %q: no binary %q", cell, but)
		}
		return [][]string{slices.DeleteFunc(slices.Clone(Binaries), func(b string) bool { return b == but })}, false, nil
	case strings.Contains(cell, "/"):
		parts := splitTrim(cell, "/")
		if len(parts) != names {
			return nil, false, fmt.Errorf("binaries %q: %d for %d variables", cell, len(parts), names)
		}
		for _, b := range parts {
			each = append(each, []string{b})
		}
	default:
		each = [][]string{splitTrim(cell, ",")}
	}
	for _, list := range each {
		for _, b := range list {
			if !slices.Contains(Binaries, b) {
				return nil, false, fmt.Errorf("binaries %q: no binary %q", cell, b)
			}
		}
	}
	return each, false, nil
}

func splitTrim(s, sep string) []string {
	parts := strings.Split(s, sep)
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}
