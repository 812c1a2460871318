package envconfig

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/agnivade/levenshtein"
)

// Misspelling is a variable of the environment that no setting reads and
// whose name is close to one that is read: most likely a setting written
// wrong, which would otherwise be ignored without a word while its default
// applies (RATE_LIMIT_EXPORT_RAED=100-M leaves the limit at 6000-M).
type Misspelling struct {
	Name  string // as set
	Meant string // the setting it is close to
}

// Misspelt returns the misspellings in environ ("NAME=value" entries, as
// os.Environ) of the settings named in read: a name close to one of them,
// or, however far, a name with a project prefix that no binary of the
// project reads (Meant is then the likeliest: unknownProjectSetting). A
// name is close when it is the same but for letter case, or at most two
// edits away and at least minNameLength long (short names are that close
// to unrelated ones). No two settings of the project's binaries are within
// two edits of each other, so a setting meant for another binary that
// shares the environment (make run, a Compose env file) is not reported;
// nor are the variables of Kubernetes' Service links.
func Misspelt(environ, read []string) []Misspelling {
	known := make(map[string]bool, len(read))
	for _, name := range read {
		known[name] = true
	}
	links := serviceLinks(environ)
	var found []Misspelling
	for _, entry := range environ {
		name, _, _ := strings.Cut(entry, "=")
		if known[name] || links[name] {
			continue
		}
		if meant, ok := closest(name, read); ok {
			found = append(found, Misspelling{Name: name, Meant: meant})
		} else if meant, ok := unknownProjectSetting(name); ok {
			found = append(found, Misspelling{Name: name, Meant: meant})
		}
	}
	return found
}

// minNameLength is the shortest name compared by edits.
const minNameLength = 8

// maxEdits is how far a misspelling may be from its setting.
const maxEdits = 2

func closest(name string, read []string) (string, bool) {
	upper := normalized(name)
	best, bestEdits := "", maxEdits+1
	for _, setting := range read {
		if upper == setting {
			return setting, true
		}
		if len(name) < minNameLength || len(setting) < minNameLength {
			continue
		}
		if d := levenshtein.ComputeDistance(upper, setting); d < bestEdits {
			best, bestEdits = setting, d
		}
	}
	return best, best != ""
}

// normalized is name as a setting's would be written: in capitals, with
// '_' for '-' (RATE-LIMIT-EXPORT-READ, which Kubernetes and Compose take as
// a name, was four edits from its setting).
func normalized(name string) string {
	return strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// LogMisspelt warns of each misspelling in environ of the settings read,
// naming the variable and the setting meant, never the value (it may be a
// secret).
func LogMisspelt(log *slog.Logger, environ, read []string) {
	for _, m := range Misspelt(environ, read) {
		log.Warn("environment variable ignored: no setting has this name", "name", m.Name, "did_you_mean", m.Meant)
	}
}

// WithMisspelt adds to a config error the misspellings in environ of the
// settings read: a required setting reported missing is most often one set
// under a wrong name. Names only, never values.
func WithMisspelt(err error, environ, read []string) error {
	found := Misspelt(environ, read)
	if len(found) == 0 {
		return err
	}
	hints := make([]string, len(found))
	for i, m := range found {
		hints[i] = fmt.Sprintf("%s is set: did you mean %s?", m.Name, m.Meant)
	}
	return fmt.Errorf("%w\n%s", err, strings.Join(hints, "\n"))
}
