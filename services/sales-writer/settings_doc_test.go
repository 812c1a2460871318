package main

import (
	"context"
	"io"
	"testing"

	"github.com/coinexport/export/pkg/envdoc"
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
		Stop:       envdoc.ServiceStop[Config],
	}
}
