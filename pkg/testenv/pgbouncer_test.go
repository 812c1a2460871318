package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is told the server with its password and connect_query (quoted
// as it reads it), its port, its mode and the test's settings, after its own.
func TestPgBouncerFiles(t *testing.T) {
	cfg, err := pgx.ParseConfig("host=/tmp/pg port=5433 user=app password=pw dbname=exportsvc")
	if err != nil {
		t.Fatal(err)
	}
	files := pgbouncerFiles(cfg, "/tmp/b", "24501", "transaction", "SET application_name = 'it''s'", []string{"ignore_startup_parameters = jit"})
	ini := files["pgbouncer.ini"]
	for _, line := range []string{
		"db = host=/tmp/pg port=5433 dbname=exportsvc user=app password=pw connect_query='SET application_name = ''it''''s'''",
		"listen_port = 24501",
		"pool_mode = transaction",
		"auth_file = /tmp/b/users.txt",
		"default_pool_size = 2\nlogfile = /tmp/b/pgbouncer.log\nignore_startup_parameters = jit\n",
	} {
		if !strings.Contains(ini, line) {
			t.Errorf("pgbouncer.ini lacks %q:\n%s", line, ini)
		}
	}
	if got := files["users.txt"]; got != `"app" ""`+"\n" {
		t.Errorf("users.txt = %q, want the user with no password", got)
	}
	noQuery := pgbouncerFiles(cfg, "/tmp/b", "24501", "session", "", nil)["pgbouncer.ini"]
	if strings.Contains(noQuery, "connect_query") {
		t.Errorf("pgbouncer.ini without a connect query has one:\n%s", noQuery)
	}
}

// pgbouncerHelperEnv makes the test binary, started by
// TestPgBouncerDiesWithItsTest, start a PgBouncer and wait to be killed.
const pgbouncerHelperEnv = "TESTENV_PGBOUNCER_HELPER"

// A test binary killed before its cleanups run (go test's -timeout, a
// Ctrl-C) takes its PgBouncer with it: it served on, orphaned, on its port
// and with its server connections.
func TestPgBouncerDiesWithItsTest(t *testing.T) {
	if os.Getenv(pgbouncerHelperEnv) == "1" {
		// A server it is never asked to reach: PostgresURL would start
		// the harness's own cluster where TEST_DATABASE_URL is unset,
		// which the helper's kill leaves running.
		PgBouncer(t, "host=/nonexistent port=5432 user=postgres dbname=none", "session")
		fmt.Println("pgbouncer listening")
		select {}
	}
	if _, err := pgbouncerBinary(); err != nil {
		t.Skipf("testenv: %v", err)
	}
	cmd := StartHelper(t, "TestPgBouncerDiesWithItsTest", "pgbouncer listening", pgbouncerHelperEnv+"=1", "TMPDIR="+helperTempDir(t))
	if left := SurvivorsOfKill(cmd); len(left) > 0 {
		t.Errorf("10 s after its test binary was killed, its PgBouncer still runs: %v", left)
	}
}
