package main

import (
	"cmp"
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envdoc"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/coinexport/export/services/sales-writer/api"
)

// The sales-writer's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	forDocs(t).Test(t, "../..", "services/sales-writer")
}

// forDocs is the sales-writer as envdoc checks it; what it reads is learned
// by starting it (envdoc.ReadAtStart).
func forDocs(t *testing.T) envdoc.Binary[Config] {
	base := map[string]string{
		"DATABASE_URL":    envdoc.Secrets["DATABASE_URL"],
		"IDENTITY_SECRET": envdoc.Secrets["IDENTITY_SECRET"],
	}
	read := envdoc.ReadAtStart(t, base, "SALES_WRITER_ADDR", "SALES_WRITER_ADMIN_ADDR", func(ctx context.Context, getenv func(string) string) error {
		return run(ctx, getenv, io.Discard, nil)
	})
	return envdoc.Binary[Config]{
		Name: "sales-writer",
		Load: func(getenv func(string) string) (Config, error) {
			cfg, err := loadConfig(getenv)
			cfg.GC = cfg.GC.InForce() // the runtime's settings once main applied the defaults
			return cfg, err
		},
		Read:       read,
		Base:       base,
		Listeners:  func(c Config) (string, string) { return c.Addr, c.AdminAddr },
		HealthPath: "/healthz",
		Settings:   func(c Config) []string { return c.Settings },
		Stop:       func(c Config) time.Duration { return drainTime(c) + telemetry.MaxFlushTime },
	}
}

// A stopping writer drains until every sale call in flight at SIGTERM has
// ended by its own bound (api.CallBound) and its answer has been written:
// cut off at the services' usual 10 s, a call started just before that
// waited out its statement timeout on a locked row was cancelled by the
// drain, its sale "may have been applied", rather than answered by its
// timeout that nothing was; with SALES_WRITER_QUERY_TIMEOUT raised past
// 10 s, every call waiting that long was.
func TestTheDrainOutlastsEverySaleCall(t *testing.T) {
	for _, queryTimeout := range []time.Duration{time.Millisecond, time.Second, 10 * time.Second, 25 * time.Second, time.Hour} {
		cfg := Config{QueryTimeout: queryTimeout}
		if drain, call := drainTime(cfg), api.CallBound(queryTimeout); drain < call+answerWriteMargin {
			t.Errorf("SALES_WRITER_QUERY_TIMEOUT=%s: the drain is %s, a call may run %s and its answer be written %s later",
				queryTimeout, drain, call, answerWriteMargin)
		}
	}
}

// A stopping gateway drains the requests it relays for
// GATEWAY_SHUTDOWN_TIMEOUT, and a sale it relays may run as long as the
// writer's own drain (drainTime: the call's bound and its answer). Where the
// gateway drains for less, a sale waiting on a locked row when the gateway
// stops is cut off there: on a make run stack with
// SALES_WRITER_QUERY_TIMEOUT=16s (under UPSTREAM_READ_TIMEOUT, as its row
// asks) the client got no answer at 15 s, the gateway's WARN "drain timed
// out", and the writer logged a 499 "may have been applied", where at 16 s
// it answers 503 "nothing was applied". Each deployment is held to it, the
// gateway's default taken from its README's table (the gateway's own test
// holds that to the code).
func TestTheGatewaysDrainOutlastsTheSalesItRelays(t *testing.T) {
	const root = "../.."
	settings, err := envdoc.ReadTable(filepath.Join(root, "gateway", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	gatewayDefault := ""
	for _, s := range settings {
		if s.Name == "GATEWAY_SHUTDOWN_TIMEOUT" {
			gatewayDefault = s.Default
		}
	}
	if gatewayDefault == "" {
		t.Fatal("gateway/README.md's table gives no default for GATEWAY_SHUTDOWN_TIMEOUT")
	}
	check := func(t *testing.T, gateway, writer map[string]string) {
		t.Helper()
		cfg, err := loadConfig(func(name string) string { return writer[name] })
		if err != nil {
			t.Fatal(err)
		}
		setting := cmp.Or(gateway["GATEWAY_SHUTDOWN_TIMEOUT"], gatewayDefault)
		gatewayDrain, err := time.ParseDuration(setting)
		if err != nil {
			t.Fatalf("GATEWAY_SHUTDOWN_TIMEOUT %q: %v", setting, err)
		}
		if drain := drainTime(cfg); gatewayDrain < drain {
			t.Errorf("the gateway drains for %s (GATEWAY_SHUTDOWN_TIMEOUT), but a sale it relays may run %s (SALES_WRITER_QUERY_TIMEOUT %s, the grace past it and its answer): raise GATEWAY_SHUTDOWN_TIMEOUT, and the gateway's grace period with it",
				gatewayDrain, drain, cfg.QueryTimeout)
		}
	}
	t.Run(envdoc.ManifestFile, func(t *testing.T) {
		m, err := envdoc.ReadManifest(filepath.Join(root, envdoc.ManifestFile), envdoc.Secrets)
		if err != nil {
			t.Fatal(err)
		}
		check(t, m.Containers["gateway"].Env, m.Containers["sales-writer"].Env)
	})
	t.Run(envdoc.ComposeFile, func(t *testing.T) {
		services, err := envdoc.ReadCompose(filepath.Join(root, envdoc.ComposeFile), envdoc.Secrets)
		if err != nil {
			t.Fatal(err)
		}
		check(t, services["gateway"].Env, services["sales-writer"].Env)
	})
	t.Run(envdoc.RunScriptFile, func(t *testing.T) {
		env, err := envdoc.ReadRunScript(filepath.Join(root, envdoc.RunScriptFile),
			map[string]string{"state": "/home/dev/export/.run", "state_in_url": "/home/dev/export/.run"}, envdoc.Secrets)
		if err != nil {
			t.Fatal(err)
		}
		check(t, env, env)
	})
}
