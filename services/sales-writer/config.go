package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/coinexport/export/pkg/postgres"
)

// Config is everything the sales writer reads from its environment.
type Config struct {
	Addr                 string        // SALES_WRITER_ADDR
	AdminAddr            string        // SALES_WRITER_ADMIN_ADDR; "" disables /metrics
	DatabaseURL          string        // DATABASE_URL (secret: may hold a password)
	DBMaxConns           int           // SALES_WRITER_DB_MAX_CONNS
	IdentitySecret       string        // IDENTITY_SECRET (secret)
	IdempotencyRetention time.Duration // IDEMPOTENCY_RETENTION
	PurgeInterval        time.Duration // IDEMPOTENCY_PURGE_INTERVAL
	LogLevel             string        // LOG_LEVEL
}

// loadConfig reads the environment, applies the defaults and validates.
func loadConfig(getenv func(string) string) (Config, error) {
	str := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var errs []error
	dur := func(name, def string) time.Duration {
		d, err := time.ParseDuration(str(name, def))
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be a positive duration such as %s", name, def))
		}
		return d
	}
	maxConns, err := strconv.Atoi(str("SALES_WRITER_DB_MAX_CONNS", "8"))
	if err != nil || maxConns < 1 || maxConns > 1000 {
		errs = append(errs, errors.New("SALES_WRITER_DB_MAX_CONNS must be an integer from 1 to 1000"))
	}
	cfg := Config{
		Addr:                 str("SALES_WRITER_ADDR", "127.0.0.1:8082"),
		AdminAddr:            str("SALES_WRITER_ADMIN_ADDR", "127.0.0.1:9082"),
		DatabaseURL:          getenv("DATABASE_URL"),
		DBMaxConns:           maxConns,
		IdentitySecret:       getenv("IDENTITY_SECRET"),
		IdempotencyRetention: dur("IDEMPOTENCY_RETENTION", "24h"),
		PurgeInterval:        dur("IDEMPOTENCY_PURGE_INTERVAL", "5m"),
		LogLevel:             str("LOG_LEVEL", "info"),
	}
	if cfg.DatabaseURL == "" {
		errs = append(errs, errors.New("DATABASE_URL is required"))
	}
	if len(cfg.IdentitySecret) < 32 {
		errs = append(errs, errors.New("IDENTITY_SECRET must be at least 32 bytes"))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return cfg, nil
}

// logAttrs describes the configuration for the start-up log, secrets masked.
func (c Config) logAttrs() []any {
	return []any{
		"addr", c.Addr, "admin_addr", c.AdminAddr,
		"database_url", postgres.Redact(c.DatabaseURL), "db_max_conns", c.DBMaxConns,
		"identity_secret", "***",
		"idempotency_retention", c.IdempotencyRetention.String(),
		"idempotency_purge_interval", c.PurgeInterval.String(),
		"log_level", c.LogLevel,
	}
}
