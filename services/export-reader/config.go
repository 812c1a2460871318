package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/services/export-reader/internal/export"
)

// Config is everything the export reader reads from its environment.
type Config struct {
	Addr           string        // EXPORT_READER_ADDR
	AdminAddr      string        // EXPORT_READER_ADMIN_ADDR; "" disables /metrics
	DatabaseURL    string        // READ_DATABASE_URL, else DATABASE_URL (secret: may hold a password)
	DBMaxConns     int           // EXPORT_READER_DB_MAX_CONNS
	QueryTimeout   time.Duration // EXPORT_READER_QUERY_TIMEOUT
	ReadAheadPages int           // EXPORT_READER_READ_AHEAD_PAGES; 0 turns read-ahead off
	ReadAheadTTL   time.Duration // EXPORT_READER_READ_AHEAD_TTL
	CursorSecret   string        // CURSOR_SECRET (secret)
	// CursorPrevious are secrets being rotated out: cursors they signed are
	// still accepted (CURSOR_SECRET_PREVIOUS, comma-separated; secret).
	CursorPrevious []string
	IdentitySecret string // IDENTITY_SECRET (secret)
	LogLevel       string // LOG_LEVEL
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
	maxConns, err := strconv.Atoi(str("EXPORT_READER_DB_MAX_CONNS", "8"))
	if err != nil || maxConns < 1 || maxConns > 1000 {
		errs = append(errs, errors.New("EXPORT_READER_DB_MAX_CONNS must be an integer from 1 to 1000"))
	}
	timeout, err := time.ParseDuration(str("EXPORT_READER_QUERY_TIMEOUT", "10s"))
	if err != nil || timeout <= 0 {
		errs = append(errs, errors.New("EXPORT_READER_QUERY_TIMEOUT must be a positive duration such as 10s"))
	}
	aheadPages, err := strconv.Atoi(str("EXPORT_READER_READ_AHEAD_PAGES", "256"))
	if err != nil || aheadPages < 0 || aheadPages > 8192 {
		errs = append(errs, errors.New("EXPORT_READER_READ_AHEAD_PAGES must be an integer from 0 (off) to 8192 (~1 GB)"))
	}
	aheadTTL, err := time.ParseDuration(str("EXPORT_READER_READ_AHEAD_TTL", "2s"))
	if err != nil || aheadTTL <= 0 || aheadTTL > time.Minute {
		errs = append(errs, errors.New("EXPORT_READER_READ_AHEAD_TTL must be a duration from 1ms to 1m such as 2s"))
	}
	cfg := Config{
		Addr:           str("EXPORT_READER_ADDR", "127.0.0.1:8081"),
		AdminAddr:      str("EXPORT_READER_ADMIN_ADDR", "127.0.0.1:9081"),
		DatabaseURL:    str("READ_DATABASE_URL", getenv("DATABASE_URL")),
		DBMaxConns:     maxConns,
		QueryTimeout:   timeout,
		ReadAheadPages: aheadPages,
		ReadAheadTTL:   aheadTTL,
		CursorSecret:   getenv("CURSOR_SECRET"),
		CursorPrevious: splitList(getenv("CURSOR_SECRET_PREVIOUS")),
		IdentitySecret: getenv("IDENTITY_SECRET"),
		LogLevel:       str("LOG_LEVEL", "info"),
	}
	if cfg.DatabaseURL == "" {
		errs = append(errs, errors.New("READ_DATABASE_URL or DATABASE_URL is required"))
	}
	if len(cfg.CursorSecret) < 32 {
		errs = append(errs, errors.New("CURSOR_SECRET must be at least 32 bytes"))
	}
	for _, s := range cfg.CursorPrevious {
		if len(s) < 32 {
			errs = append(errs, errors.New("every secret in CURSOR_SECRET_PREVIOUS must be at least 32 bytes"))
			break
		}
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
		"query_timeout", c.QueryTimeout.String(),
		"read_ahead_pages", c.ReadAheadPages, "read_ahead_ttl", c.ReadAheadTTL.String(),
		"cursor_secret", "***", "cursor_secrets_previous", len(c.CursorPrevious), "identity_secret", "***",
		"log_level", c.LogLevel,
	}
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

// splitList splits a comma-separated value, dropping empty entries.
func splitList(v string) []string {
	var out []string
	for part := range strings.SplitSeq(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
