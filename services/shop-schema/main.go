// Command shop-schema serves POST /v1/sync/prestashop/schema: it reads a
// merchant's PrestaShop categories, features and shared feature values with
// the webservice key sent in the request, behind an SSRF guard.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/startup"
	"github.com/coinexport/export/pkg/stopsignal"
	"github.com/coinexport/export/pkg/telemetry"
	"go.opentelemetry.io/otel/trace"

	"github.com/coinexport/export/services/shop-schema/internal/api"
	"github.com/coinexport/export/services/shop-schema/internal/guard"
	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
	"github.com/coinexport/export/services/shop-schema/internal/shopschema"
)

const serviceName = "shop-schema"

func main() {
	ctx, stop := stopsignal.Context()
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, serviceName+":", err)
		os.Exit(1)
	}
}

// run starts the service and blocks until ctx is done.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return startup.ConfigError(err, cfg.Settings)
	}
	log := startup.Logger(stdout, serviceName, cfg.LogLevel, cfg, cfg.Settings)
	if len(cfg.AllowHosts) > 0 || cfg.CAFile != "" {
		log.Warn("test-only settings active: SHOP_SCHEMA_ALLOW_HOSTS or SHOP_SCHEMA_CA_FILE let the service reach addresses or trust CAs it otherwise would not")
	}
	stopTelemetry, err := telemetry.Setup(ctx, getenv, serviceName, log)
	if err != nil {
		return err
	}
	defer stopTelemetry(context.Background()) // spans it could not flush are logged there
	srv, err := newServer(cfg, log, nil, net.DefaultResolver)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// newServer wires the service: guard, PrestaShop client, logic, routes.
// tp is the tracer provider of outbound spans (nil: the global one).
func newServer(cfg Config, log *slog.Logger, tp trace.TracerProvider, resolver guard.Resolver) (*httpserver.Server, error) {
	signer, err := identity.NewServiceSigner(cfg.IdentitySecret, cfg.IdentityPrevious, cfg.IdentityAcceptUnbound)
	if err != nil {
		return nil, err
	}
	g, err := guard.New(cfg.Ports, cfg.AllowHosts)
	if err != nil {
		return nil, err
	}
	roots, err := rootCAs(cfg.CAFile)
	if err != nil {
		return nil, err
	}
	client := prestashop.NewClient(prestashop.Config{
		Guard: g, Resolver: resolver, RootCAs: roots, ConnectTimeout: cfg.ConnectTimeout,
		MaxBytes: cfg.MaxResponseBytes, MaxCallBytes: cfg.MaxCallBytes, PageSize: cfg.PageSize, MaxRows: cfg.MaxRows, TracerProvider: tp,
	})
	svc := shopschema.New(g, resolver, client, cfg.Timeout)
	mux := http.NewServeMux()
	srv := httpserver.New(httpserver.Config{
		Service: serviceName, Addr: cfg.Addr, AdminAddr: cfg.AdminAddr, Log: log, Signer: signer,
		ShutdownTimeout: drainTime(cfg),
		// No schema call sent on a connection the drain closes unread is
		// sent again to a listener already closed (the gateway's 502).
		ShutdownDelay: cfg.ShutdownDelay,
	}, mux)
	api.Routes(mux, api.NewHandler(svc, log, srv.Registry(), cfg.MaxConcurrent, cfg.MaxConcurrentPerShop))
	return srv, nil
}

// drainTime is how long a stopping shop-schema lets its calls in flight
// finish: a whole schema read (SHOP_SCHEMA_TIMEOUT) and the writing of its
// answer, a few MB at most (the call's memory cap), never less than the
// services' usual drain (httpserver.DrainOutlasting). Cut off at the usual
// 10 s, a read of a slow shop started just before SIGTERM was lost, and
// with a single instance (Compose) its client got a 503.
func drainTime(cfg Config) time.Duration {
	return httpserver.DrainOutlasting(cfg.Timeout)
}

// rootCAs is the system pool plus, for tests, the CAs in file.
func rootCAs(file string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if file == "" {
		return pool, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("SHOP_SCHEMA_CA_FILE: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("SHOP_SCHEMA_CA_FILE holds no PEM certificate")
	}
	return pool, nil
}
