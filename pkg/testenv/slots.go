package testenv

import (
	"context"
	"fmt"
	"testing"
)

// SlotLimitedRole creates a login role of the test's own on the cluster of
// dsn (a database from PostgresURL), allowed to read and write that
// database's tables, and returns dsn as the role, and limit, which sets
// the role's CONNECTION LIMIT (-1: none). Past it PostgreSQL refuses the
// role's new sessions with SQLSTATE 53300 ("too many connections for
// role"), as it refuses every client's once max_connections are taken,
// which a test cannot do to a cluster other tests share. The role is no
// superuser: a CONNECTION LIMIT does not bind one. Its sessions are ended
// and the role dropped when the test ends: close the test's pools on
// roleDSN before (a cleanup registered after this one runs first).
func SlotLimitedRole(t testing.TB, dsn string) (roleDSN string, limit func(n int)) {
	t.Helper()
	role := "slots_" + randomHex(6) // lower case: a name SQL and a DSN take unquoted
	admin := connect(t, dsn)
	adminExec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(context.Background(), sql); err != nil {
			t.Fatalf("testenv: %s: %v", sql, err)
		}
	}
	adminExec("CREATE ROLE " + role + " LOGIN")
	t.Cleanup(func() {
		defer admin.Close(context.Background())
		adminExec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + role + "'")
		adminExec("DROP OWNED BY " + role) // its grants on this database's tables
		adminExec("DROP ROLE " + role)
	})
	adminExec("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role)
	adminExec("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO " + role)
	limit = func(n int) {
		t.Helper()
		adminExec(fmt.Sprintf("ALTER ROLE %s CONNECTION LIMIT %d", role, n))
	}
	return dsn + " user=" + role, limit
}
