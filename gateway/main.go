// Command gateway is the public edge of the export service: API keys,
// scopes, request ids, rate limits, and a safe proxy to the services.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/coinexport/export/gateway/edge"
	"github.com/coinexport/export/pkg/gcdefaults"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/startup"
	"github.com/coinexport/export/pkg/stopsignal"
)

const serviceName = "gateway"

func main() {
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout, gcdefaults.Settings.Apply); err != nil {
		fmt.Fprintln(os.Stderr, serviceName+":", err)
		os.Exit(1)
	}
}

// run starts the gateway from the environment and serves until ctx ends or
// a listener fails, then drains in-flight requests for at most
// GATEWAY_SHUTDOWN_TIMEOUT. Tests call it with their own getenv.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer, applyGC func(gcdefaults.Settings)) error {
	cfg, err := edge.LoadConfig(getenv)
	if err != nil {
		// "config: " and every bad variable, and any variable set that is
		// close to a setting's name: a typo is often why one is missing.
		return startup.ConfigError(err, cfg.Settings)
	}
	// The collector's settings belong to the process: main applies them,
	// tests (which call run inside the test binary) pass nil.
	if applyGC != nil {
		applyGC(cfg.GC)
	}
	log := startup.Logger(stdout, serviceName, cfg.LogLevel, cfg, cfg.Settings)
	if cfg.ShopSchemaIdentitySecret == "" {
		log.Warn("SHOP_SCHEMA_IDENTITY_SECRET is unset or blank: shop-schema's calls are signed with IDENTITY_SECRET, " +
			"so shop-schema holds a secret export-reader and sales-writer accept (README, \"Rotating IDENTITY_SECRET\", gives it one of its own)")
	}
	routeRedisLogs(log)

	gw, err := edge.Start(ctx, cfg, log, getenv)
	if postgres.StoppedBeforeReached(err, log) {
		return nil
	}
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		err = serveOn(gw, cfg.ShutdownDelay, log)
	case err = <-gw.Failed():
		log.Error("listener failed", "error", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if serr := gw.Shutdown(sctx); serr != nil && err == nil {
		err = serr
	}
	return err
}

// serveOn keeps serving for delay after the stop signal, before draining:
// a load balancer or ingress goes on sending new requests to a stopping
// instance until it hears of the stop (Kubernetes: seconds after the pod
// is marked terminating), and those would find the listener closed (an
// ingress does not retry a refused POST: the client gets its 502).
func serveOn(gw *edge.Gateway, delay time.Duration, log *slog.Logger) error {
	if delay <= 0 {
		return nil
	}
	gw.Drain() // /v1/health now answers 503: health checks take this instance out
	log.Info("stop signal: serving on while load balancers stop sending here (GATEWAY_SHUTDOWN_DELAY)", "delay", delay.String())
	select {
	case <-time.After(delay):
		return nil
	case err := <-gw.Failed():
		log.Error("listener failed", "error", err)
		return err
	}
}
