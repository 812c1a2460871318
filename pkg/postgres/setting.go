package postgres

import (
	"strings"

	"github.com/coinexport/export/pkg/envconfig"
)

// ReadURL reads a binary's database URL, the value of the first of
// settings that is set (export-reader's READ_DATABASE_URL, a replica,
// before DATABASE_URL; the others' DATABASE_URL alone), and records on r
// a problem unless one is set and DSNProblem finds nothing wrong with it,
// named by the setting it came from. Every one of settings is read, so
// that r.Names holds them all (run's misspelling hint). The gateway and
// both services wrote this check each, word for word.
func ReadURL(r *envconfig.Reader, settings ...string) string {
	dsn, from := "", ""
	for _, name := range settings {
		if v := r.String(name, ""); v != "" && dsn == "" {
			dsn, from = v, name
		}
	}
	if dsn == "" {
		r.Failf("%s is required", strings.Join(settings, " or "))
		return ""
	}
	problem := DSNProblem(dsn)
	r.Check(problem == "", from+" "+problem)
	return dsn
}
