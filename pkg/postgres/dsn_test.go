package postgres

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

func TestWithPoolSize(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://u:pw@db:5432/x?sslmode=disable", "postgres://u:pw@db:5432/x?sslmode=disable&pool_max_conns=8"},
		{"postgres://u:pw@db/x?pool_max_conns=2&sslmode=disable", "postgres://u:pw@db/x?sslmode=disable&pool_max_conns=8"},
		{"postgres://u:pw@db/x", "postgres://u:pw@db/x?pool_max_conns=8"},
		{"host=/run/pg user=u password=pw dbname=x", "host=/run/pg user=u password=pw dbname=x pool_max_conns=8"},
	}
	for _, tt := range tests {
		if got := WithPoolSize(tt.dsn, 8); got != tt.want {
			t.Errorf("WithPoolSize(%q, 8) = %q, want %q", tt.dsn, got, tt.want)
		}
	}
}

// A URL's settings keep their values through WithPoolSize: url.Values
// writes a space as "+", which pgx reads as a "+", so a socket folder with
// a space (make run in a clone at "/home/me/my code") was dialled as
// "/home/me/my+code" by every service, unready for ever, while exportctl,
// given the URL as it was, connected.
func TestWithPoolSizeKeepsTheValues(t *testing.T) {
	for _, host := range []string{"/home/me/my code/.run/pg", "/tmp/ü+ß/pg"} {
		dsn := "postgres://postgres@/x?host=" + url.PathEscape(host) + "&application_name=a%20b"
		cfg, err := pgxpool.ParseConfig(WithPoolSize(dsn, 8))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ConnConfig.Host != host || cfg.MaxConns != 8 || cfg.ConnConfig.RuntimeParams["application_name"] != "a b" {
			t.Errorf("WithPoolSize(%q, 8) reads as host %q, application_name %q, pool_max_conns %d; want %q, \"a b\", 8",
				dsn, cfg.ConnConfig.Host, cfg.ConnConfig.RuntimeParams["application_name"], cfg.MaxConns, host)
		}
	}
}

func TestDescribeShowsNoPassword(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://u:s3cret@db:5432/x?sslmode=disable", "u@db:5432/x"},
		{"postgres://u@db/x?sslmode=disable&password=s3cret", "u@db:5432/x"},
		{"postgresql://u:s3cret@db1:5433,db2/x?sslmode=disable", "u@db1:5433,db2:5432/x"},
		{"host=/run/pg user=u password=s3cret dbname=x", "u@/run/pg/x"},
		{"host=db user=u password='s3cr et' dbname=x sslmode=disable", "u@db:5432/x"},
		{"host=db user=u password = s3cret dbname=x sslmode=disable", "u@db:5432/x"},
		{"host=db user=u password=s3cret dbname=x pool_max_conns=8 sslmode=disable", "u@db:5432/x"},
		{"postgres://u:s3cret@db:notaport/x", "(unparsable)"},
		{"host=db password='s3cret", "(unparsable)"},
		{"postgres://u:s3cr@t@db/x", "(unparsable)"},
		{"postgres://u:1234/s3cret@db/x", "(unparsable)"},
	}
	for _, tt := range tests {
		got := Describe(tt.dsn)
		if got != tt.want {
			t.Errorf("Describe(%q) = %q, want %q", tt.dsn, got, tt.want)
		}
		if strings.Contains(got, "s3cr") {
			t.Errorf("Describe(%q) = %q shows the password", tt.dsn, got)
		}
	}
}

// A connection string is valid only if each setting pgx would pass to the
// session could be one: a misspelt URL scheme (with a query, it reads as
// keyword/value pairs) or a keyword in another letter case would leave
// pgx dialling its default host, and the service waiting there for ever.
func TestDSNProblemRefusesWhatNoSettingCouldBe(t *testing.T) {
	for dsn, want := range map[string]bool{
		"postgres://u:pw@db:5432/app?sslmode=require":          true,
		"postgresql://u@/app?host=/run/pg":                     true,
		"host=db dbname=app user=u password='a://b?c=d'":       true,
		"host=db dbname=app application_name=x myapp.tenant=7": true,
		"host=db TimeZone=UTC search_path=app":                 true,
		"postgress://u:pw@db:5432/app?sslmode=require":         false,
		"postgre://postgres@/postgres?host=/run/pg":            false,
		"jdbc:postgresql://db:5432/app?user=u":                 false,
		"Host=db dbname=app":                                   false,
		"host=db DBNAME=app":                                   false,
		"postgres://u@db/app?Port=5433":                        false,
		"host=db sslmode=":                                     true, // empty: pgx's default
		"not a connection string":                              false,
	} {
		if got := DSNProblem(dsn) == ""; got != want {
			t.Errorf("DSNProblem(%q) = %q, want it empty: %v", dsn, DSNProblem(dsn), want)
		}
	}
}

// A keyword in capitals is named, as written and as it must be: told that
// key=value pairs are no connection string, the operator looked at
// key=value pairs. A misspelt scheme, whose keyword as pgx reads it holds
// the password, is not quoted.
func TestDSNProblemNamesAKeywordInCapitals(t *testing.T) {
	const notOne = "must be a PostgreSQL connection string (a postgres:// URL or key=value pairs)"
	for dsn, want := range map[string]string{
		"Host=db dbname=app":                    "writes the keyword Host, which PostgreSQL reads in lower case only (host)",
		"host=db DBNAME=app USER=u":             "writes the keyword DBNAME, which PostgreSQL reads in lower case only (dbname)",
		"postgres://u@db/app?Port=5433":         "writes the keyword Port, which PostgreSQL reads in lower case only (port)",
		"postgress://u:s3cret@db/app?sslmode=x": notOne,
		"not a connection string":               notOne,
	} {
		if got := DSNProblem(dsn); got != want {
			t.Errorf("DSNProblem(%q) = %q, want %q", dsn, got, want)
		}
	}
}
