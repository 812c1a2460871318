package testenv

import (
	"fmt"
	"os"
	"testing"
)

// proxiesHelperEnv makes the test binary, started by
// TestProxiesDieWithTheirTest, start nginx and haproxy and wait to be
// killed.
const proxiesHelperEnv = "TESTENV_PROXIES_HELPER"

// A test binary killed before its cleanups run (go test's -timeout, a
// Ctrl-C) takes its nginx and haproxy with it. They served on, listening,
// in a process group of their own that no terminal's SIGINT reaches,
// nginx's worker orphaned by its master.
func TestProxiesDieWithTheirTest(t *testing.T) {
	if os.Getenv(proxiesHelperEnv) == "1" {
		startProxiesAndWait(t)
		return
	}
	NeedIngress(t)
	cmd := StartHelper(t, "TestProxiesDieWithTheirTest", "proxies listening", proxiesHelperEnv+"=1", "TMPDIR="+helperTempDir(t))
	if left := SurvivorsOfKill(cmd); len(left) > 0 {
		t.Errorf("10 s after their test binary was killed, its proxies still run: %v", left)
	}
}

// startProxiesAndWait is the helper: nginx and haproxy started as the
// ingress test starts them, then nothing until the helper is killed.
func startProxiesAndWait(t *testing.T) {
	nginx, haproxy := FreeAddr(t), FreeAddr(t)
	Nginx(t, nginx, "server { listen "+nginx+"; location / { return 204; } }")
	HAProxy(t, haproxy, "defaults\n  mode http\n  timeout connect 1s\n  timeout client 1s\n  timeout server 1s\n"+
		"frontend f\n  bind "+haproxy+"\n  http-request return status 204\n")
	fmt.Println("proxies listening")
	select {}
}

// helperTempDir is a TMPDIR for a helper that is killed: the folders its
// cleanups do not remove are in one of the test's, which the servers'
// user (postgres, as root) must be able to pass through.
func helperTempDir(t *testing.T) string {
	t.Helper()
	tmp, err := os.MkdirTemp("", "testenv-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	return tmp
}
