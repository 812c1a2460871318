package postgres

import (
	"slices"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/envconfig"
)

// ReadURL takes the first setting set, and names the one a problem is
// with: a replica's READ_DATABASE_URL is not the primary's DATABASE_URL.
func TestReadURLNamesTheSettingItRead(t *testing.T) {
	settings := []string{"READ_DATABASE_URL", "DATABASE_URL"}
	for _, c := range []struct {
		env           map[string]string
		want, problem string
	}{
		{map[string]string{}, "", "READ_DATABASE_URL or DATABASE_URL is required"},
		{map[string]string{"DATABASE_URL": "  "}, "", "READ_DATABASE_URL or DATABASE_URL is required"},
		{map[string]string{"DATABASE_URL": "postgres://primary/x"}, "postgres://primary/x", ""},
		{map[string]string{"READ_DATABASE_URL": "postgres://replica/x", "DATABASE_URL": "x"}, "postgres://replica/x", ""},
		{map[string]string{"READ_DATABASE_URL": "Host=/tmp", "DATABASE_URL": "postgres://primary/x"}, "Host=/tmp",
			"READ_DATABASE_URL writes the keyword Host, which PostgreSQL reads in lower case only (host)"},
		{map[string]string{"READ_DATABASE_URL": " ", "DATABASE_URL": "x"}, "x",
			"DATABASE_URL must be a PostgreSQL connection string (a postgres:// URL or key=value pairs)"},
	} {
		r := envconfig.New(func(name string) string { return c.env[name] })
		got := ReadURL(r, settings...)
		problem := ""
		if err := r.Err(); err != nil {
			problem = strings.TrimPrefix(err.Error(), "config: ")
		}
		if got != c.want || problem != c.problem {
			t.Errorf("ReadURL with %v = %q, problem %q; want %q, problem %q", c.env, got, problem, c.want, c.problem)
		}
		if !slices.Equal(r.Names(), []string{"DATABASE_URL", "READ_DATABASE_URL"}) {
			t.Errorf("ReadURL with %v read %v, want both settings (run's misspelling hint)", c.env, r.Names())
		}
	}
}
