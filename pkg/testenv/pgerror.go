package testenv

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// WantDomainViolation fails t unless err is PostgreSQL's check_violation
// (23514) of the named domain: the database itself refused the value.
func WantDomainViolation(t testing.TB, what string, err error, domain string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.DataTypeName != domain {
		t.Errorf("%s: error = %v, want check_violation (23514) of domain %s", what, err, domain)
	}
}
