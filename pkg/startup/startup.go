// Package startup is the beginning of run that every binary shares, before
// its own wiring: the refusal of its configuration and its logger's first
// lines. What differs between the binaries (their settings, the
// collector's, telemetry, their pools' options) stays in each run, and the
// stop that came while PostgreSQL was awaited is postgres.StoppedBeforeReached:
// shop-schema, which has no database, starts here too and must link no
// PostgreSQL client.
package startup

import (
	"io"
	"log/slog"
	"os"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/logging"
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
