package testenv

import (
	"fmt"
	"os"
	"testing"
)

// postmasterHelperEnv tells this test binary, run again by
// TestPostgreSQLDiesWithItsTest, to start the harness's clusters and wait
// to be killed.
const postmasterHelperEnv = "TESTENV_POSTMASTER_HELPER"

// A test binary killed before its cleanups run (go test's -timeout, a
// Ctrl-C) takes the PostgreSQL servers the harness started with it: the
// shared cluster (TEST_DATABASE_URL unset) and a test's own (start, and
// startUnder's prlimit) ran on as pg_ctl daemons, with their backends,
// memory and data folders.
func TestPostgreSQLDiesWithItsTest(t *testing.T) {
	if os.Getenv(postmasterHelperEnv) == "1" {
		Postgres(t)         // the shared cluster, with a backend of the pool's
		ShortOfResources(t) // a test's own, under prlimit
		fmt.Println("postgres ready")
		select {}
	}
	tmp := helperTempDir(t)
	cmd := StartHelper(t, "TestPostgreSQLDiesWithItsTest", "postgres ready", postmasterHelperEnv+"=1", "TMPDIR="+tmp, "TEST_DATABASE_URL=")
	if left := SurvivorsOfKillIn(cmd, tmp); len(left) > 0 {
		t.Errorf("10 s after its test binary was killed, its PostgreSQL servers still run: %v", left)
	}
}
