package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/testenv"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestLoadConfig(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{"IDENTITY_SECRET": testSecret}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	got, err := loadConfig(env())
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Addr: "127.0.0.1:8083", AdminAddr: "127.0.0.1:9083", IdentitySecret: testSecret, LogLevel: "info",
		Ports: []uint16{443, 8443}, Timeout: 20 * time.Second, ConnectTimeout: 5 * time.Second,
		MaxResponseBytes: 16 << 20, MaxCallBytes: 32 << 20, PageSize: 250, MaxRows: 100000, MaxConcurrent: 32, MaxConcurrentPerShop: 0,
		ShutdownDelay: 3 * time.Second}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Config{}, "Settings")); diff != "" {
		t.Errorf("loadConfig(defaults) (-want +got):\n%s", diff)
	}
	bad := [][]string{
		{"IDENTITY_SECRET", "short"},
		{"SHOP_SCHEMA_TIMEOUT", "soon"},
		{"SHOP_SCHEMA_TIMEOUT", "1s", "SHOP_SCHEMA_CONNECT_TIMEOUT", "2s"},
		{"SHOP_SCHEMA_PAGE_SIZE", "0"},
		{"SHOP_SCHEMA_MAX_RESPONSE_BYTES", "big"},
		{"SHOP_SCHEMA_PORTS", "443,http"},
		{"SHOP_SCHEMA_PORTS", " , "},
		{"SHOP_SCHEMA_SHUTDOWN_DELAY", "2m"},
	}
	for _, kv := range bad {
		if _, err := loadConfig(env(kv...)); err == nil {
			t.Errorf("loadConfig(%v) = nil error, want an error", kv)
		}
	}
	// Both listeners on one port: named at start, not left to the second
	// bind's "address already in use".
	if _, err := loadConfig(env("SHOP_SCHEMA_ADMIN_ADDR", "[::]:8083")); err == nil ||
		!strings.Contains(err.Error(), "SHOP_SCHEMA_ADDR and SHOP_SCHEMA_ADMIN_ADDR must be different listening addresses") {
		t.Errorf("loadConfig(SHOP_SCHEMA_ADMIN_ADDR=[::]:8083) = %v, want both settings named", err)
	}
	// The runtime applies GOGC and GOMEMLIMIT itself; a value it would
	// misread stops the start, as in the gateway and sales-writer.
	for name, value := range map[string]string{"GOGC": "OFF", "GOMEMLIMIT": "0"} {
		if _, err := loadConfig(env(name, value)); err == nil || !strings.Contains(err.Error(), name+" must be off") {
			t.Errorf("loadConfig(%s=%s) = %v, want an error naming %s", name, value, err, name)
		}
	}
	// A bad allow-list entry is named by its variable, without its value,
	// with the other settings (before, the guard refused it after the
	// start line: "guard: allow-list entry \"…\" is not a host, IP or CIDR").
	_, err = loadConfig(env("SHOP_SCHEMA_ALLOW_HOSTS", "127.0.0.1,nonsense..x", "SHOP_SCHEMA_PAGE_SIZE", "0"))
	if err == nil || !strings.Contains(err.Error(), "SHOP_SCHEMA_ALLOW_HOSTS must") || strings.Contains(err.Error(), "nonsense") ||
		!strings.Contains(err.Error(), "SHOP_SCHEMA_PAGE_SIZE") {
		t.Errorf("loadConfig(SHOP_SCHEMA_ALLOW_HOSTS=127.0.0.1,nonsense..x, bad page size) = %v, want both named, no value quoted", err)
	}
	if got, err := loadConfig(env("SHOP_SCHEMA_ALLOW_HOSTS", "127.0.0.1, 10.0.0.0/8, shop.test, [::1]")); err != nil || len(got.AllowHosts) != 4 {
		t.Errorf("loadConfig(a valid allow-list) = %v, %v, want four entries, no error", got.AllowHosts, err)
	}
	// A bad timeout is reported alone, not also as shorter than the
	// connect timeout left at its default.
	_, err = loadConfig(env("SHOP_SCHEMA_TIMEOUT", "0s"))
	if err == nil || !strings.Contains(err.Error(), "SHOP_SCHEMA_TIMEOUT must be") || strings.Contains(err.Error(), "CONNECT_TIMEOUT") {
		t.Errorf("loadConfig(SHOP_SCHEMA_TIMEOUT=0s) = %v, want one error, about SHOP_SCHEMA_TIMEOUT only", err)
	}
	// Every bad variable is named at once, the cross-check too.
	_, err = loadConfig(env("IDENTITY_SECRET", "short", "SHOP_SCHEMA_TIMEOUT", "1s", "SHOP_SCHEMA_CONNECT_TIMEOUT", "2s"))
	if err == nil || !strings.Contains(err.Error(), "IDENTITY_SECRET") || !strings.Contains(err.Error(), "must not exceed") {
		t.Errorf("loadConfig(short secret, connect timeout > timeout) = %v, want both named", err)
	}
}

func TestRunMasksSecretAndStops(t *testing.T) {
	vars := map[string]string{"IDENTITY_SECRET": testSecret, "SHOP_SCHEMA_ADDR": "127.0.0.1:0", "SHOP_SCHEMA_ADMIN_ADDR": "127.0.0.1:0"}
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.Output
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(k string) string { return vars[k] }, &out) }()
	for i := 0; i < 100 && !strings.Contains(out.String(), "listening"); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run() = %v, want nil after cancel", err)
	}
	if strings.Contains(out.String(), testSecret) || !bytes.Contains([]byte(out.String()), []byte(`"identity_secret":"***"`)) {
		t.Errorf("start-up log does not mask IDENTITY_SECRET:\n%s", out.String())
	}
}
