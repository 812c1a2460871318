package lingerclose

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its tests: every
// connection closed through the Listener drains in a goroutine of its own
// (drainThenClose), and one that never ends would pile up in a gateway
// that runs for weeks.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
