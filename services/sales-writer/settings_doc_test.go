package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/envdoc"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/services/sales-writer/api"
)

// The sales-writer's settings as the READMEs document them and the manifests
// set them are the ones it reads, with the defaults it applies (envdoc).
func TestSettingsAsDocumentedAndDeployed(t *testing.T) {
	forDocs(t).Test(t, "testdata/repository", "services/sales-writer")
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
		Stop:       func(c Config) time.Duration { return envdoc.ServiceStop(c.ShutdownDelay, drainTime(c), 2) },
		Drain:      drainTime,
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
		if drain, call := drainTime(cfg), api.CallBound(queryTimeout); drain < call+httpserver.AnswerWriteMargin {
			t.Errorf("SALES_WRITER_QUERY_TIMEOUT=%s: the drain is %s, a call may run %s and its answer be written %s later",
				queryTimeout, drain, call, httpserver.AnswerWriteMargin)
		}
	}
}
