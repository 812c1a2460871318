// Package startup is the beginning of run that every binary shares, before
// its own wiring: the refusal of its configuration, its logger's first
// lines, and the stop that came while it waited for PostgreSQL. What
// differs between the binaries (their settings, the collector's, telemetry,
// their pools' options) stays in each run.
package startup

import (
	"errors"
	"io"
	"log/slog"
	"os"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/logging"
	"github.com/coinexport/export/pkg/postgres"
)

// ConfigError is err, the binary's configuration refused, followed by each
// variable of the process's environment set under a name close to one of
// settings (the names the binary reads): a required setting reported
// missing is most often one set under a wrong name. Names only, never
// values.
func ConfigError(err error, settings []string) error {
	return envconfig.WithMisspelt(err, os.Environ(), settings)
}

// Logger is the binary's JSON logger on stdout at level (logging.New),
// having written its first lines: "starting" with config (whose LogValue
// masks its secrets), then a warning for each variable of the process's
// environment set under a name close to one of settings, which no setting
// reads.
func Logger(stdout io.Writer, service, level string, config any, settings []string) *slog.Logger {
	log := logging.New(stdout, level, service)
	log.Info("starting", "config", config)
	// The process's own environment, whatever getenv a test passes to run:
	// a variable no one reads has no other way to be seen.
	envconfig.LogMisspelt(log, os.Environ(), settings)
	return log
}

// StoppedBeforePostgreSQL reports whether err says the binary was told to
// stop while it waited for PostgreSQL (postgres.ErrStopped), and logs so:
// a stop, not a failure, which run returns nil for (exit status 0).
func StoppedBeforePostgreSQL(err error, log *slog.Logger) bool {
	if !errors.Is(err, postgres.ErrStopped) {
		return false
	}
	log.Info("stopped before PostgreSQL was reached")
	return true
}
