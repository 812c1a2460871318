package main

import (
	"log/slog"
	"slices"
	"time"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/gcdefaults"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/coinexport/export/services/sales-writer/sales"
)

// Config is everything the sales writer reads from its environment.
type Config struct {
	Addr                  string              // SALES_WRITER_ADDR (127.0.0.1:8082)
	AdminAddr             string              // SALES_WRITER_ADMIN_ADDR (127.0.0.1:9082): /metrics and /debug/pprof
	DatabaseURL           string              // DATABASE_URL (required; secret: may hold a password)
	DBMaxConns            int                 // SALES_WRITER_DB_MAX_CONNS (8)
	CommitGroups          int                 // SALES_WRITER_COMMIT_GROUPS (1): commit groups of sale calls at once; 0: each call commits alone
	QueryTimeout          time.Duration       // SALES_WRITER_QUERY_TIMEOUT (10s): a sale call's bound in the database
	ShutdownDelay         time.Duration       // SALES_WRITER_SHUTDOWN_DELAY (3s): serving on, unready, after SIGTERM
	IdentitySecret        string              // IDENTITY_SECRET (required, ≥32 bytes; secret)
	IdentityPrevious      []string            // IDENTITY_SECRET_PREVIOUS (accepted while rotating; secret)
	IdentityAcceptUnbound bool                // IDENTITY_ACCEPT_UNBOUND (false): identity-v1 accepted too, while upgrading
	IdempotencyRetention  time.Duration       // IDEMPOTENCY_RETENTION (24h)
	PurgeInterval         time.Duration       // IDEMPOTENCY_PURGE_INTERVAL (5m)
	LogLevel              string              // LOG_LEVEL (info)
	GC                    gcdefaults.Settings // GOGC (400), GOMEMLIMIT (100MiB)
	// Settings names every variable read (tracing's: telemetry.Names), so that run can warn of one set
	// with a name close to them (envconfig.Misspelt).
	Settings []string
}

// loadConfig reads the environment, applies the defaults and validates.
func loadConfig(getenv func(string) string) (Config, error) {
	r := envconfig.New(getenv)
	cfg := Config{
		Addr:                 r.Addr("SALES_WRITER_ADDR", "127.0.0.1:8082"),
		AdminAddr:            r.Addr("SALES_WRITER_ADMIN_ADDR", "127.0.0.1:9082"),
		DBMaxConns:           r.Int("SALES_WRITER_DB_MAX_CONNS", 8, 1, 1000),
		CommitGroups:         r.Int("SALES_WRITER_COMMIT_GROUPS", sales.DefaultCommitGroups, 0, 64),
		QueryTimeout:         r.Duration("SALES_WRITER_QUERY_TIMEOUT", 10*time.Second, time.Millisecond, time.Hour),
		ShutdownDelay:        r.Duration("SALES_WRITER_SHUTDOWN_DELAY", httpserver.DefaultShutdownDelay, 0, time.Minute),
		IdempotencyRetention: r.Duration("IDEMPOTENCY_RETENTION", 24*time.Hour, time.Second, 365*24*time.Hour),
		PurgeInterval:        r.Duration("IDEMPOTENCY_PURGE_INTERVAL", 5*time.Minute, time.Second, 24*time.Hour),
		LogLevel:             r.LogLevel(),
		GC:                   gcdefaults.Read(getenv),
	}
	r.SeparateListeners("SALES_WRITER_ADDR", cfg.Addr, "SALES_WRITER_ADMIN_ADDR", cfg.AdminAddr)
	cfg.DatabaseURL = postgres.ReadURL(r, "DATABASE_URL")
	cfg.GC.Check(r)
	cfg.IdentitySecret, cfg.IdentityPrevious = r.Secret("IDENTITY_SECRET")
	cfg.IdentityAcceptUnbound = r.Bool("IDENTITY_ACCEPT_UNBOUND", false)
	cfg.Settings = slices.Concat(r.Names(), gcdefaults.Names, telemetry.Names)
	if err := r.Err(); err != nil {
		return Config{Settings: cfg.Settings}, err // only the names, for run's misspelling hint
	}
	return cfg, nil
}

// LogValue describes the configuration for the start-up log, secrets
// masked (slog calls it for a Config given as a value).
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("addr", c.Addr), slog.String("admin_addr", c.AdminAddr),
		slog.String("database", postgres.Describe(c.DatabaseURL)), slog.Int("db_max_conns", c.DBMaxConns),
		slog.Int("commit_groups", c.CommitGroups),
		slog.String("query_timeout", c.QueryTimeout.String()), slog.String("shutdown_delay", c.ShutdownDelay.String()),
		slog.String("identity_secret", "***"), slog.Int("identity_secrets_previous", len(c.IdentityPrevious)),
		slog.Bool("identity_accept_unbound", c.IdentityAcceptUnbound),
		slog.String("idempotency_retention", c.IdempotencyRetention.String()),
		slog.String("idempotency_purge_interval", c.PurgeInterval.String()),
		slog.String("log_level", c.LogLevel), slog.Any("gc", c.GC),
	)
}
