// Command sales-writer serves POST /v1/export/items/{item_id}/sales/confirm
// and .../sales/cancel behind the gateway: it sells an export item at most
// once and makes every retry with the same Idempotency-Key a replay.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/coinexport/export/pkg/gcdefaults"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/postgres/poolmetrics"
	"github.com/coinexport/export/pkg/schema"
	"github.com/coinexport/export/pkg/startup"
	"github.com/coinexport/export/pkg/stopsignal"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/coinexport/export/services/sales-writer/api"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/jackc/pgx/v5/pgxpool"
)

const serviceName = "sales-writer"

func main() {
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout, gcdefaults.Settings.Apply); err != nil {
		fmt.Fprintln(os.Stderr, serviceName+":", err)
		os.Exit(1)
	}
}

// run starts the process's part (configuration, logger, telemetry, the
// pool once PostgreSQL is reached) and serves until ctx is done. Tests call
// it with their own getenv, and nil for applyGC.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer, applyGC func(gcdefaults.Settings)) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return startup.ConfigError(err, cfg.Settings)
	}
	// The collector's settings belong to the process: main applies them,
	// tests (which call run inside the test binary) pass nil.
	if applyGC != nil {
		applyGC(cfg.GC)
	}
	log := startup.Logger(stdout, serviceName, cfg.LogLevel, cfg, cfg.Settings)

	stopTelemetry, err := telemetry.Setup(ctx, getenv, serviceName, log)
	if err != nil {
		return err
	}
	defer stopTelemetry(context.Background())

	// Every statement of the writer reaches its rows through an index; see
	// IndexScansOnly for what plans made on a sales table analyzed while
	// empty cost. Its key lock needs a snapshot per statement: see
	// ReadCommitted.
	pool, err := postgres.OpenWhenReached(ctx, postgres.WithPoolSize(cfg.DatabaseURL, cfg.DBMaxConns), log,
		postgres.IndexScansOnly(), postgres.StatementTimeout(cfg.QueryTimeout), postgres.ApplicationName(serviceName),
		postgres.ReadCommitted())
	if postgres.StoppedBeforeReached(err, log) {
		return nil
	}
	if err != nil {
		return err
	}
	defer postgres.Close(pool)
	return serve(ctx, cfg, log, pool)
}

// serve wires the writer on pool (the identity's check, readiness, routes,
// metrics, the purge) and serves until ctx is done. The purge and the side
// connection stop before it returns, so before run closes the pool.
func serve(ctx context.Context, cfg Config, log *slog.Logger, pool *pgxpool.Pool) error {
	signer, err := identity.NewServiceSigner(cfg.IdentitySecret, cfg.IdentityPrevious, cfg.IdentityAcceptUnbound)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	// A build newer than the database's schema waits, unready, for the
	// migration (schema.Readiness), and a read-only database (a standby
	// after a failover) keeps the writer unready, out of rotation.
	side, err := postgres.OpenSide(ctx, pool)
	if err != nil {
		return err
	}
	defer postgres.Close(side)
	readiness := schema.NewReadiness(ctx, side, log, schema.Writable(), schema.ServingOn(pool))
	srv := httpserver.New(httpserver.Config{
		Service:   serviceName,
		Addr:      cfg.Addr,
		AdminAddr: cfg.AdminAddr,
		Log:       log,
		Signer:    signer,
		Ready:     readiness.Ready,
		// Every sale call in flight at SIGTERM ends by its own bound.
		ShutdownTimeout: drainTime(cfg),
		// No keyed sale is sent on a connection the drain closes unread
		// and then sent again to a listener already closed.
		ShutdownDelay: cfg.ShutdownDelay,
		// A sale that panicked may have been applied: its 500 says how to
		// retry it, as the writer's own 500s do.
		PanicMessage: api.InternalErrorMessage,
		PanicNotes:   api.PanicNotes,
	}, mux)
	writer := sales.NewGroupingWriter(pool, cfg.IdempotencyRetention, cfg.CommitGroups, sales.GroupMetrics(srv.Registry()))
	writer.ReportWarnedCommits(log, srv.Registry())
	api.Routes(mux, writer, log, srv.Registry(), cfg.QueryTimeout)
	poolmetrics.Register(srv.Registry(), "postgres", pool)

	purgeCtx, stopPurge := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { writer.RunPurge(purgeCtx, cfg.PurgeInterval, log) })
	defer wg.Wait()
	defer stopPurge()

	return srv.Run(ctx)
}

// drainTime is how long a stopping writer lets its sale calls in flight
// end: the longest call (api.CallBound: SALES_WRITER_QUERY_TIMEOUT and the
// grace past it) and the writing of its answer (httpserver.DrainOutlasting).
// Cut off at the usual 10 s, a call started just before SIGTERM that
// waited out its bound (a locked row) was cancelled by the drain, answered
// 503 "the sale may have been applied" or its connection closed, where its
// own timeout, a moment later, would have answered that nothing was
// applied (PostgreSQL's statement_timeout rolls it back); with
// SALES_WRITER_QUERY_TIMEOUT over 10 s every call waiting past 10 s when
// SIGTERM came was.
func drainTime(cfg Config) time.Duration {
	return httpserver.DrainOutlasting(api.CallBound(cfg.QueryTimeout))
}
