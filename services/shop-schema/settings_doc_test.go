package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envdoc"
)

// The shop-schema's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	forDocs(t).Test(t, "testdata/repository", "services/shop-schema")
}

// forDocs is the shop-schema as envdoc checks it; what it reads is learned
// by starting it (envdoc.ReadAtStart).
func forDocs(t *testing.T) envdoc.Binary[Config] {
	base := map[string]string{
		"IDENTITY_SECRET": envdoc.Secrets["IDENTITY_SECRET"],
	}
	read := envdoc.ReadAtStart(t, base, "SHOP_SCHEMA_ADDR", "SHOP_SCHEMA_ADMIN_ADDR", func(ctx context.Context, getenv func(string) string) error {
		return run(ctx, getenv, io.Discard)
	})
	return envdoc.Binary[Config]{
		Name:       "shop-schema",
		Load:       loadConfig,
		Read:       read,
		Base:       base,
		Listeners:  func(c Config) (string, string) { return c.Addr, c.AdminAddr },
		HealthPath: "/healthz",
		Settings:   func(c Config) []string { return c.Settings },
		Stop:       func(c Config) time.Duration { return envdoc.ServiceStop(c.ShutdownDelay, drainTime(c), 0) },
		Drain:      drainTime,
	}
}
