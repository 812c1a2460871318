package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"

	"github.com/coinexport/export/services/shop-schema/internal/fakeshop"
)

// A stopping shop-schema closes the gateway's kept-alive connections while
// its listener still serves (SHOP_SCHEMA_SHUTDOWN_DELAY), as sales-writer
// and export-reader do: a schema call the gateway had just sent on one,
// which the service never read, is sent again on a new connection and
// served. Closed by the drain, the connection's repeat found the listener
// closed too, and the gateway answered 502. Meanwhile /healthz answers
// 503, so that the gateways stop sending here before the listener closes.
func TestAConnectionClosedAtTheStopLeavesItsRepeatAListener(t *testing.T) {
	shop := fakeshop.Sample("8", false)
	shop.Start(t.Cleanup)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, shop.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	vars := map[string]string{"IDENTITY_SECRET": testSecret, "SHOP_SCHEMA_ALLOW_HOSTS": "127.0.0.1", "SHOP_SCHEMA_CA_FILE": caFile,
		"SHOP_SCHEMA_ADDR": addr, "SHOP_SCHEMA_ADMIN_ADDR": testenv.FreeAddr(t)}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var out testenv.Output
	done := make(chan error, 1)
	go func() { done <- run(runCtx, func(k string) string { return vars[k] }, &out) }()
	waitHealth(t, "http://"+addr+"/healthz", http.StatusOK, &out)

	// The gateway's kept-alive connection, idle after a schema call.
	kept, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	if status := schemaCallOn(t, kept, shop.URL()); status != http.StatusOK {
		t.Fatalf("the schema call before the stop = %d, want 200", status)
	}

	stop() // SIGTERM
	kept.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := kept.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("the kept-alive connection, after the stop: read %d bytes, %v; want it closed", n, err)
	}
	// The gateway's repeat, on a new connection.
	again, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the repeat found shop-schema's listener closed (the gateway's 502): %v\n%s", err, out.String())
	}
	defer again.Close()
	if status := schemaCallOn(t, again, shop.URL()); status != http.StatusOK {
		t.Errorf("the repeat = %d, want 200", status)
	}
	waitHealth(t, "http://"+addr+"/healthz", http.StatusServiceUnavailable, &out)
	if err := <-done; err != nil {
		t.Errorf("run() = %v, want nil after a clean stop", err)
	}
}

// schemaCallOn sends a signed schema call of the shop at baseURL on conn,
// as the gateway does, and returns its answer's status.
func schemaCallOn(t *testing.T, conn net.Conn, baseURL string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+conn.RemoteAddr().String()+"/v1/sync/prestashop/schema",
		strings.NewReader(body(baseURL, fakeshop.Key)))
	req.Header.Set("Content-Type", "application/json")
	signer, _ := identity.NewSigner(testSecret)
	for _, h := range signer.Sign(identity.Identity{RequestID: "req-stop"}, identity.RequestOf(req), time.Now()) {
		req.Header.Set(h.Name, h.Value)
	}
	resp := testenv.SendOn(t, conn, req)
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// waitHealth waits until the service's /healthz answers want.
func waitHealth(t *testing.T, url string, want int, out *testenv.Output) {
	t.Helper()
	for range 400 {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("/healthz never answered %d:\n%s", want, out.String())
}
