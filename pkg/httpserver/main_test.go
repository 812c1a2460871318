package httpserver

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its tests: a
// server's connections, its listeners and its drain at shutdown must all
// end with Run, or every service would pile them up per failed request.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
