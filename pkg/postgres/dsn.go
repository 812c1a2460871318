package postgres

import (
	"net/url"
	"strconv"
	"strings"
)

// WithPoolSize returns dsn with pool_max_conns set to size, in whichever of
// PostgreSQL's two connection-string forms dsn was given.
func WithPoolSize(dsn string, size int) string {
	n := strconv.Itoa(size)
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return dsn // Open reports it, without quoting it
		}
		q := u.Query()
		q.Set("pool_max_conns", n)
		u.RawQuery = q.Encode()
		return u.String()
	}
	// In keyword/value form the last setting of a keyword wins.
	return dsn + " pool_max_conns=" + n
}

// Redact hides the password of a connection string, for start-up logs.
func Redact(dsn string) string {
	if isURL(dsn) {
		if u, err := url.Parse(dsn); err == nil {
			return u.Redacted()
		}
		return "***"
	}
	fields := strings.Fields(dsn)
	for i, f := range fields {
		if strings.HasPrefix(f, "password=") {
			fields[i] = "password=xxxxx"
		}
	}
	return strings.Join(fields, " ")
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}
