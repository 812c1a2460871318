package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envdoc"
	"github.com/coinexport/export/pkg/httpserver"
)

// The export-reader's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	forDocs(t).Test(t, "testdata/repository", "services/export-reader")
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
		Stop:       func(c Config) time.Duration { return envdoc.ServiceStop(c.ShutdownDelay, drainTime(c), 2) },
		Drain:      drainTime,
	}
}

// A stopping reader drains until every call in flight at SIGTERM has ended
// by its own bound (EXPORT_READER_QUERY_TIMEOUT) and its answer has been
// written: drained for the services' usual 10 s, a page that waited on a
// lock past it was cut off, and with EXPORT_READER_QUERY_TIMEOUT raised
// past 10 s, every page still running then.
func TestTheDrainOutlastsEveryCall(t *testing.T) {
	for _, queryTimeout := range []time.Duration{time.Millisecond, time.Second, 10 * time.Second, 25 * time.Second, time.Hour} {
		if drain := drainTime(Config{QueryTimeout: queryTimeout}); drain < queryTimeout+httpserver.AnswerWriteMargin {
			t.Errorf("EXPORT_READER_QUERY_TIMEOUT=%s: the drain is %s, a call may run %s and its answer be written %s later",
				queryTimeout, drain, queryTimeout, httpserver.AnswerWriteMargin)
		}
	}
}
