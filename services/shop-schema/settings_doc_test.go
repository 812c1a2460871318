package main

import (
	"context"
	"io"
	"maps"
	"testing"

	"github.com/coinexport/export/pkg/envdoc"
)

// The shop-schema's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	forDocs(t).Test(t, "../..", "services/shop-schema")
}

// forDocs learns what the shop-schema reads by starting it with a recording
// getenv and a context already done: run reads its config and telemetry's variables, starts its server and stops it at once.
func forDocs(t *testing.T) envdoc.Binary[Config] {
	base := map[string]string{
		"IDENTITY_SECRET": envdoc.Secrets["IDENTITY_SECRET"],
	}
	rec := &envdoc.Recorder{Env: maps.Clone(base)}
	rec.Env["SHOP_SCHEMA_ADDR"], rec.Env["SHOP_SCHEMA_ADMIN_ADDR"] = "127.0.0.1:0", "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := run(ctx, rec.Getenv, io.Discard); err != nil {
		t.Fatalf("run() with a stopped context = %v, want nil", err)
	}
	return envdoc.Binary[Config]{
		Name:       "shop-schema",
		Load:       loadConfig,
		Read:       rec.Names(),
		Base:       base,
		Listeners:  func(c Config) (string, string) { return c.Addr, c.AdminAddr },
		HealthPath: "/healthz",
		Settings:   func(c Config) []string { return c.Settings },
	}
}
