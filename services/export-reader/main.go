// Command export-reader serves GET /v1/export/items and
// GET /v1/export/items/{item_id} behind the gateway: the catalog sync path,
// one index range scan per page with the items' JSON stored pre-rendered.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/postgres/poolmetrics"
	"github.com/coinexport/export/pkg/schema"
	"github.com/coinexport/export/pkg/startup"
	"github.com/coinexport/export/pkg/stopsignal"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/coinexport/export/services/export-reader/internal/api"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/coinexport/export/services/export-reader/internal/export"
	"github.com/coinexport/export/services/export-reader/internal/replica"
	"github.com/jackc/pgx/v5/pgxpool"
)

const serviceName = "export-reader"

func main() {
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, serviceName+":", err)
		os.Exit(1)
	}
}

// run starts the process's part (configuration, logger, telemetry, the
// pool once PostgreSQL is reached) and serves until ctx is done. Tests call
// it with their own getenv.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return startup.ConfigError(err, cfg.Settings)
	}
	log := startup.Logger(stdout, serviceName, cfg.LogLevel, cfg, cfg.Settings)
	if cfg.ReadAheadPages > 0 && cfg.readAhead().Reads == 0 {
		log.Warn("read-ahead off: it may use a quarter of the pool, and EXPORT_READER_DB_MAX_CONNS under 4 leaves it none",
			"read_ahead_pages", cfg.ReadAheadPages, "db_max_conns", cfg.DBMaxConns)
	}

	stopTelemetry, err := telemetry.Setup(ctx, getenv, serviceName, log)
	if err != nil {
		return err
	}
	defer stopTelemetry(context.Background())

	pool, err := postgres.OpenWhenReached(ctx, postgres.WithPoolSize(cfg.DatabaseURL, cfg.DBMaxConns), log,
		postgres.ApplicationName(serviceName))
	if postgres.StoppedBeforeReached(err, log) {
		return nil
	}
	if err != nil {
		return err
	}
	defer postgres.Close(pool)
	return serve(ctx, cfg, log, pool, databaseSetting(getenv))
}

// serve wires the reader on pool (the identity's check, cursors, the
// replica's lag, readiness, routes, metrics) and serves until ctx is done.
// dsnSetting names the variable the pool's DSN came from, which the log's
// causes name (databaseSetting). The replica's lag reading and the side
// connection stop before it returns, so before run closes the pool.
func serve(ctx context.Context, cfg Config, log *slog.Logger, pool *pgxpool.Pool, dsnSetting string) error {
	signer, err := identity.NewServiceSigner(cfg.IdentitySecret, cfg.IdentityPrevious, cfg.IdentityAcceptUnbound)
	if err != nil {
		return err
	}
	cursors, err := cursor.New(cfg.CursorSecret, cfg.CursorPrevious...)
	if err != nil {
		return err
	}
	// The readiness check and the replica's lag reading share a connection
	// apart from the pool, so that neither waits behind the reads.
	side, err := postgres.OpenSide(ctx, pool)
	if err != nil {
		return err
	}
	defer postgres.Close(side)
	// A standby too far behind must not let a sync succeed: its next
	// incremental one would skip what the standby lacked (README, "Reading
	// from a replica").
	lag := replica.Start(ctx, side, log, replica.Options{MaxLag: cfg.ReadMaxLag})
	defer lag.Close()
	reader := export.NewReader(pool, cursors, cfg.readAhead(), export.RefuseListsUnless(lag.Check))
	defer reader.StopReadingAhead() // drained: its pages go to no one
	mux := http.NewServeMux()
	api.New(reader, log, cfg.QueryTimeout, dsnSetting).Register(mux)
	// A build newer than the database's schema waits, unready, for the
	// migration (schema.Readiness).
	readiness := schema.NewReadiness(ctx, side, log, schema.ServingOn(pool), schema.SettingNamed(dsnSetting))
	srv := httpserver.New(httpserver.Config{
		Service:   serviceName,
		Addr:      cfg.Addr,
		AdminAddr: cfg.AdminAddr,
		Log:       log,
		Signer:    signer,
		Ready:     readiness.Ready,
		// Every call in flight at SIGTERM ends by its own bound.
		ShutdownTimeout: drainTime(cfg),
		// No page asked for on a connection the drain closes unread is
		// asked for again of a listener already closed.
		ShutdownDelay: cfg.ShutdownDelay,
	}, mux)
	poolmetrics.Register(srv.Registry(), "postgres", pool)
	srv.Registry().MustRegister(reader.Collectors()...)
	srv.Registry().MustRegister(lag.Collector())
	return srv.Run(ctx)
}

// drainTime is how long a stopping reader lets its calls in flight end:
// EXPORT_READER_QUERY_TIMEOUT bounds a call's whole database work (the
// wait for a pool connection, a first page's sync barrier, the wait for a
// page read ahead, the scan), then its answer is written, up to a page of
// about 6 MB (httpserver.DrainOutlasting). Drained for the services'
// usual 10 s, a page waiting on export_items' lock (a migration's) when
// SIGTERM came was cut off at 10 s, its client answered 503 or nothing,
// where the lock's release a moment later, within its own timeout, would
// have had it answered; with EXPORT_READER_QUERY_TIMEOUT over 10 s every
// page still running 10 s after SIGTERM was.
func drainTime(cfg Config) time.Duration {
	return httpserver.DrainOutlasting(cfg.QueryTimeout)
}
