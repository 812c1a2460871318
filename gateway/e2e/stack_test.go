package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/pkg/tracestore"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// binaries are the processes of the stack, by import path.
var binaries = map[string]string{
	"gateway":       "github.com/coinexport/export/gateway",
	"export-reader": "github.com/coinexport/export/services/export-reader",
	"sales-writer":  "github.com/coinexport/export/services/sales-writer",
	"shop-schema":   "github.com/coinexport/export/services/shop-schema",
}

// stack is a running set of processes plus the trace receiver they export to.
type stack struct {
	baseURL string
	traces  *tracestore.Store
	logs    map[string]*testenv.Output
	admin   map[string]string // each binary's admin listener, which serves /metrics
}

// build compiles every binary once per test binary run.
func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, pkg := range binaries {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir
}

// startStack starts the services and the gateway against dsn and redisURL.
func startStack(t *testing.T, dsn, redisURL string) *stack {
	t.Helper()
	bin := build(t)
	store := tracestore.New(nil, 0)
	receiver := httptest.NewServer(store)
	t.Cleanup(receiver.Close)

	addr, admin := map[string]string{}, map[string]string{}
	for name := range binaries {
		addr[name], admin[name] = testenv.FreeAddr(t), testenv.FreeAddr(t)
	}
	common := []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + dsn,
		"REDIS_URL=" + redisURL,
		"IDENTITY_SECRET=e2e-identity-secret-0123456789abcdef",
		"CURSOR_SECRET=e2e-cursor-secret-0123456789abcdefgh",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + receiver.URL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=100",
		"LOG_LEVEL=info",
	}
	own := map[string][]string{
		"export-reader": {"EXPORT_READER_ADDR=" + addr["export-reader"], "EXPORT_READER_ADMIN_ADDR=" + admin["export-reader"]},
		"sales-writer":  {"SALES_WRITER_ADDR=" + addr["sales-writer"], "SALES_WRITER_ADMIN_ADDR=" + admin["sales-writer"]},
		"shop-schema":   {"SHOP_SCHEMA_ADDR=" + addr["shop-schema"], "SHOP_SCHEMA_ADMIN_ADDR=" + admin["shop-schema"]},
		"gateway": {
			"GATEWAY_ADDR=" + addr["gateway"], "GATEWAY_ADMIN_ADDR=" + admin["gateway"],
			"EXPORT_READER_URLS=http://" + addr["export-reader"],
			"SALES_WRITER_URLS=http://" + addr["sales-writer"],
			"SHOP_SCHEMA_URLS=http://" + addr["shop-schema"],
		},
	}
	s := &stack{baseURL: "http://" + addr["gateway"] + "/v1", traces: store, logs: map[string]*testenv.Output{}, admin: admin}
	for _, name := range []string{"export-reader", "sales-writer", "shop-schema", "gateway"} {
		logs := &testenv.Output{}
		s.logs[name] = logs
		cmd := exec.Command(filepath.Join(bin, name))
		cmd.Env = append(append([]string{}, common...), own[name]...)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
			}
		})
	}
	s.waitHealthy(t)
	return s
}

func (s *stack) waitHealthy(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if s.allChecksOK() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for name, l := range s.logs {
		t.Logf("%s output:\n%s", name, l.String())
	}
	t.Fatal(fmt.Errorf("the stack did not become healthy within 30 s"))
}

// allChecksOK reports whether /v1/health answers 200 with every dependency
// and upstream "ok" (the gateway answers 200 even while some are down).
func (s *stack) allChecksOK() bool {
	resp, err := http.Get(s.baseURL + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Checks map[string]string `json:"checks"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil || len(body.Data.Checks) == 0 {
		return false
	}
	for _, state := range body.Data.Checks {
		if state != "ok" {
			return false
		}
	}
	return true
}
