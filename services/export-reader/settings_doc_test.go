package main

import (
	"context"
	"io"
	"testing"

	"github.com/coinexport/export/pkg/envdoc"
)

// The export-reader's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	forDocs(t).Test(t, "../..", "services/export-reader")
}

// forDocs is the export-reader as envdoc checks it; what it reads is learned
// by starting it (envdoc.ReadAtStart).
func forDocs(t *testing.T) envdoc.Binary[Config] {
	base := map[string]string{
		"DATABASE_URL":    envdoc.Secrets["DATABASE_URL"],
		"IDENTITY_SECRET": envdoc.Secrets["IDENTITY_SECRET"],
		"CURSOR_SECRET":   envdoc.Secrets["CURSOR_SECRET"],
	}
	read := envdoc.ReadAtStart(t, base, "EXPORT_READER_ADDR", "EXPORT_READER_ADMIN_ADDR", func(ctx context.Context, getenv func(string) string) error {
		return run(ctx, getenv, io.Discard)
	})
	return envdoc.Binary[Config]{
		Name:       "export-reader",
		Load:       loadConfig,
		Read:       read,
		Base:       base,
		Listeners:  func(c Config) (string, string) { return c.Addr, c.AdminAddr },
		HealthPath: "/healthz",
		Settings:   func(c Config) []string { return c.Settings },
		Stop:       envdoc.ServiceStop[Config],
		Drain:      envdoc.ServiceDrain[Config],
	}
}
