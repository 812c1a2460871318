package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
)

// stackHelperEnv, set to a database URL, makes the test binary started by
// TestStackDiesWithItsTest start a stack and another gateway on it, and
// wait to be killed.
const stackHelperEnv = "E2E_STACK_HELPER_DSN"

// A test binary killed before its cleanups run (go test's -timeout) takes
// its stack with it: its services and gateways served on, orphaned, on
// their ports and with their database connections.
func TestStackDiesWithItsTest(t *testing.T) {
	if dsn := os.Getenv(stackHelperEnv); dsn != "" {
		s := startStack(t, dsn, testenv.RedisURL(t))
		startGateway(t, s)
		fmt.Println("stack up")
		select {}
	}
	t.Parallel()
	// TMPDIR: the helper's folders, which its cleanups do not remove, go
	// in this test's.
	helper := testenv.StartHelper(t, "TestStackDiesWithItsTest", "stack up",
		stackHelperEnv+"="+testenv.PostgresURL(t), "TMPDIR="+t.TempDir())
	if left := testenv.SurvivorsOfKill(helper); len(left) > 0 {
		t.Errorf("10 s after their test binary was killed, its stack still runs: %v", left)
	}
}
