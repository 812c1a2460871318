package main

import (
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/gcdefaults"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/coinexport/export/services/export-reader/internal/export"
	"github.com/coinexport/export/services/export-reader/internal/replica"
)

// Config is everything the export reader reads from its environment.
type Config struct {
	Addr        string // EXPORT_READER_ADDR (127.0.0.1:8081)
	AdminAddr   string // EXPORT_READER_ADMIN_ADDR (127.0.0.1:9081): /metrics and /debug/pprof
	DatabaseURL string // READ_DATABASE_URL, else DATABASE_URL (required; secret: may hold a password)
	// ReadMaxLag: READ_MAX_LAG (60s), the lag of a standby read database
	// past which list pages answer 503; 0 measures it without refusing.
	ReadMaxLag     time.Duration
	DBMaxConns     int           // EXPORT_READER_DB_MAX_CONNS (8)
	QueryTimeout   time.Duration // EXPORT_READER_QUERY_TIMEOUT (10s)
	ShutdownDelay  time.Duration // EXPORT_READER_SHUTDOWN_DELAY (3s): serving on, unready, after SIGTERM
	ReadAheadPages int           // EXPORT_READER_READ_AHEAD_PAGES (256); 0 turns read-ahead off
	ReadAheadTTL   time.Duration // EXPORT_READER_READ_AHEAD_TTL (2s)
	CursorSecret   string        // CURSOR_SECRET (required, ≥32 bytes; secret)
	// CursorPrevious are the secrets accepted besides it while it is
	// rotated (CURSOR_SECRET_PREVIOUS, comma-separated; secret).
	CursorPrevious []string
	IdentitySecret string // IDENTITY_SECRET (required, ≥32 bytes; secret)
	// IdentityPrevious: IDENTITY_SECRET_PREVIOUS, likewise (secret).
	IdentityPrevious []string
	// IdentityAcceptUnbound: IDENTITY_ACCEPT_UNBOUND (false), identity-v1
	// signatures accepted too, while gateways of an older build remain.
	IdentityAcceptUnbound bool
	LogLevel              string // LOG_LEVEL (info)
	// Settings names every variable read (tracing's: telemetry.Names), so that run can warn of one set
	// with a name close to them (envconfig.Misspelt).
	Settings []string
}

// loadConfig reads the environment, applies the defaults and validates.
func loadConfig(getenv func(string) string) (Config, error) {
	r := envconfig.New(getenv)
	cfg := Config{
		Addr:           r.Addr("EXPORT_READER_ADDR", "127.0.0.1:8081"),
		AdminAddr:      r.Addr("EXPORT_READER_ADMIN_ADDR", "127.0.0.1:9081"),
		ReadMaxLag:     r.Duration("READ_MAX_LAG", time.Minute, 0, time.Hour),
		DBMaxConns:     r.Int("EXPORT_READER_DB_MAX_CONNS", 8, 1, 1000),
		QueryTimeout:   r.Duration("EXPORT_READER_QUERY_TIMEOUT", 10*time.Second, time.Millisecond, time.Hour),
		ShutdownDelay:  r.Duration("EXPORT_READER_SHUTDOWN_DELAY", httpserver.DefaultShutdownDelay, 0, time.Minute),
		ReadAheadPages: r.Int("EXPORT_READER_READ_AHEAD_PAGES", 256, 0, 8192), // 8192 pages ≈ 1 GB
		ReadAheadTTL:   r.Duration("EXPORT_READER_READ_AHEAD_TTL", 2*time.Second, time.Millisecond, time.Minute),
		LogLevel:       r.LogLevel(),
	}
	r.SeparateListeners("EXPORT_READER_ADDR", cfg.Addr, "EXPORT_READER_ADMIN_ADDR", cfg.AdminAddr)
	cfg.DatabaseURL = postgres.ReadURL(r, "READ_DATABASE_URL", "DATABASE_URL")
	// The lag is read once a second: a lower bound would refuse syncs on
	// the reading's own age.
	r.Check(cfg.ReadMaxLag == 0 || cfg.ReadMaxLag >= 2*replica.DefaultInterval,
		"READ_MAX_LAG must be 0 (off) or at least 2s: the replica's lag is read once a second")
	cfg.CursorSecret, cfg.CursorPrevious = r.Secret("CURSOR_SECRET")
	cfg.IdentitySecret, cfg.IdentityPrevious = r.Secret("IDENTITY_SECRET")
	cfg.IdentityAcceptUnbound = r.Bool("IDENTITY_ACCEPT_UNBOUND", false)
	// One secret for both would let cursors, which every client holds, be
	// MACs made with the key the gateway signs identities with, and tie
	// the two rotations together.
	r.Check(!sharesSecret(append([]string{cfg.CursorSecret}, cfg.CursorPrevious...), append([]string{cfg.IdentitySecret}, cfg.IdentityPrevious...)),
		"CURSOR_SECRET and IDENTITY_SECRET (and their _PREVIOUS lists) must not share a secret: one for each purpose")
	gcdefaults.Read(getenv).Check(r) // Go's own defaults, but no bad value unseen
	cfg.Settings = slices.Concat(r.Names(), gcdefaults.Names, telemetry.Names)
	if err := r.Err(); err != nil {
		return Config{Settings: cfg.Settings}, err // only the names, for run's misspelling hint
	}
	return cfg, nil
}

// databaseSetting names the variable Config.DatabaseURL comes from (the
// one postgres.ReadURL took, and named a bad one by), which the log's
// causes name (postgres.CauseOf): a replica's READ_DATABASE_URL
// is not DATABASE_URL, the primary's. Not a Config field: it is no setting.
func databaseSetting(getenv func(string) string) string {
	if strings.TrimSpace(getenv("READ_DATABASE_URL")) != "" { // as envconfig's String reads it
		return "READ_DATABASE_URL"
	}
	return "DATABASE_URL"
}

// LogValue describes the configuration for the start-up log, secrets
// masked (slog calls it for a Config given as a value).
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("addr", c.Addr), slog.String("admin_addr", c.AdminAddr),
		slog.String("database", postgres.Describe(c.DatabaseURL)), slog.Int("db_max_conns", c.DBMaxConns),
		slog.String("query_timeout", c.QueryTimeout.String()), slog.String("shutdown_delay", c.ShutdownDelay.String()), slog.String("read_max_lag", c.ReadMaxLag.String()),
		slog.Int("read_ahead_pages", c.ReadAheadPages), slog.String("read_ahead_ttl", c.ReadAheadTTL.String()),
		slog.String("cursor_secret", "***"), slog.Int("cursor_secrets_previous", len(c.CursorPrevious)),
		slog.String("identity_secret", "***"), slog.Int("identity_secrets_previous", len(c.IdentityPrevious)),
		slog.Bool("identity_accept_unbound", c.IdentityAcceptUnbound),
		slog.String("log_level", c.LogLevel),
	)
}

// readAhead is the list read-ahead: a quarter of the pool at most reads
// ahead, so requests always find connections of their own (a pool under 4
// connections reads nothing ahead).
func (c Config) readAhead() export.ReadAhead {
	return export.ReadAhead{
		Pages:   c.ReadAheadPages,
		TTL:     c.ReadAheadTTL,
		Reads:   c.DBMaxConns / 4,
		Timeout: c.QueryTimeout,
	}
}

// sharesSecret reports whether a secret, at least 32 bytes long (shorter
// ones are refused on their own), is in both lists.
func sharesSecret(a, b []string) bool {
	return slices.ContainsFunc(a, func(s string) bool { return len(s) >= 32 && slices.Contains(b, s) })
}
