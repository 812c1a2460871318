package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
)

// proxyHelperEnv tells this test binary, run again by
// TestNoProxyFromTheEnvironment, that it is the helper.
const proxyHelperEnv = "SHOP_SCHEMA_PROXY_HELPER"

// TestNoProxyFromTheEnvironment: a shop is called directly even with
// HTTPS_PROXY set (issue 6: no proxy from the environment): through a proxy
// the guard would check only the proxy's address, never the shop's. Go
// reads the proxy variables once per process, so the call is made by this
// test binary run again with them set; the shop's name is not loopback,
// which net/http never proxies.
func TestNoProxyFromTheEnvironment(t *testing.T) {
	if os.Getenv(proxyHelperEnv) != "" {
		readThroughEnvironmentProxy(t)
		return
	}
	var proxied atomic.Int64
	proxy := testenv.ServeConns(t, func(net.Conn) { proxied.Add(1) })
	// -test.v and its "--- PASS" line: a helper whose -test.run matched
	// no test (this one renamed) would exit 0 having read nothing.
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), proxyHelperEnv+"=1", "HTTPS_PROXY=http://"+proxy, "https_proxy=http://"+proxy,
		"NO_PROXY=", "no_proxy=")
	testenv.DiesWithTest(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil || proxied.Load() != 0 || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Errorf("with HTTPS_PROXY set: the proxy accepted %d connections (want 0), the helper %v:\n%s", proxied.Load(), err, out)
	}
}

// readThroughEnvironmentProxy reads a shop named example.com (the name
// its certificate holds), which the service's resolver puts on 127.0.0.1.
func readThroughEnvironmentProxy(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	_, port, _ := net.SplitHostPort(shop.Addr())
	svc := startServiceWith(t, shop, map[string]string{"SHOP_SCHEMA_PORTS": "443," + port},
		fakeshop.Resolver{"example.com": {"127.0.0.1"}})
	status, env := svc.post(t, body("https://example.com:"+port, fakeshop.Key))
	if status != http.StatusOK || shop.Connections() == 0 {
		t.Errorf("POST schema for the shop = %d %s, %d connections to it; want 200 from the shop itself", status, errCode(env), shop.Connections())
	}
}
