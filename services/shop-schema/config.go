package main

import (
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/gcdefaults"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/coinexport/export/services/shop-schema/internal/guard"
)

// Config is every setting of the binary, read from the environment once.
type Config struct {
	Addr           string // SHOP_SCHEMA_ADDR (127.0.0.1:8083)
	AdminAddr      string // SHOP_SCHEMA_ADMIN_ADDR (127.0.0.1:9083): /metrics and /debug/pprof
	IdentitySecret string // IDENTITY_SECRET (required, ≥32 bytes; secret)
	// IdentityPrevious: IDENTITY_SECRET_PREVIOUS (accepted while rotating; secret).
	IdentityPrevious []string
	// IdentityAcceptUnbound: IDENTITY_ACCEPT_UNBOUND (false), identity-v1
	// signatures accepted too, while gateways of an older build remain.
	IdentityAcceptUnbound bool
	LogLevel              string        // LOG_LEVEL (info)
	AllowHosts            []string      // SHOP_SCHEMA_ALLOW_HOSTS (tests only)
	CAFile                string        // SHOP_SCHEMA_CA_FILE (tests only)
	Ports                 []uint16      // SHOP_SCHEMA_PORTS (443,8443)
	Timeout               time.Duration // SHOP_SCHEMA_TIMEOUT (20s)
	ConnectTimeout        time.Duration // SHOP_SCHEMA_CONNECT_TIMEOUT (5s)
	MaxResponseBytes      int64         // SHOP_SCHEMA_MAX_RESPONSE_BYTES (16 MiB)
	MaxCallBytes          int64         // SHOP_SCHEMA_MAX_CALL_BYTES (32 MiB)
	PageSize              int           // SHOP_SCHEMA_PAGE_SIZE (250)
	MaxRows               int           // SHOP_SCHEMA_MAX_ROWS (100000)
	MaxConcurrent         int           // SHOP_SCHEMA_MAX_CONCURRENT (32)
	MaxConcurrentPerShop  int           // SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP (0: no cap per shop, the default; shop-schema README, "Reads in flight per shop")
	ShutdownDelay         time.Duration // SHOP_SCHEMA_SHUTDOWN_DELAY (3s): serving on, unready, after SIGTERM
	// Settings names every variable read (tracing's: telemetry.Names), so that run can warn of one set
	// with a name close to them (envconfig.Misspelt).
	Settings []string
}

// The range of SHOP_SCHEMA_TIMEOUT and SHOP_SCHEMA_CONNECT_TIMEOUT.
const (
	minTimeout = time.Millisecond
	maxTimeout = time.Hour
)

func validTimeout(d time.Duration) bool { return minTimeout <= d && d <= maxTimeout }

// loadConfig reads the environment through getenv, applies defaults and
// validates.
func loadConfig(getenv func(string) string) (Config, error) {
	r := envconfig.New(getenv)
	c := Config{
		Addr:             r.Addr("SHOP_SCHEMA_ADDR", "127.0.0.1:8083"),
		AdminAddr:        r.Addr("SHOP_SCHEMA_ADMIN_ADDR", "127.0.0.1:9083"),
		LogLevel:         r.LogLevel(),
		AllowHosts:       r.List("SHOP_SCHEMA_ALLOW_HOSTS", ""),
		CAFile:           r.String("SHOP_SCHEMA_CA_FILE", ""),
		Ports:            ports(r, "SHOP_SCHEMA_PORTS", "443,8443"),
		Timeout:          r.Duration("SHOP_SCHEMA_TIMEOUT", 20*time.Second, minTimeout, maxTimeout),
		ConnectTimeout:   r.Duration("SHOP_SCHEMA_CONNECT_TIMEOUT", 5*time.Second, minTimeout, maxTimeout),
		MaxResponseBytes: int64(r.Int("SHOP_SCHEMA_MAX_RESPONSE_BYTES", 16<<20, 1<<10, 1<<30)),
		MaxCallBytes:     int64(r.Int("SHOP_SCHEMA_MAX_CALL_BYTES", 32<<20, 1<<10, 1<<30)),
		PageSize:         r.Int("SHOP_SCHEMA_PAGE_SIZE", 250, 1, 5000),
		MaxRows:          r.Int("SHOP_SCHEMA_MAX_ROWS", 100000, 1, 10000000),
		MaxConcurrent:    r.Int("SHOP_SCHEMA_MAX_CONCURRENT", 32, 1, 10000),
		// Counted per shop address (shoplimit), so that one slow shop, from
		// however many callers, leaves the other slots to other shops.
		MaxConcurrentPerShop: r.Int("SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP", 0, 0, 10000),
		ShutdownDelay:        r.Duration("SHOP_SCHEMA_SHUTDOWN_DELAY", httpserver.DefaultShutdownDelay, 0, time.Minute),
	}
	r.SeparateListeners("SHOP_SCHEMA_ADDR", c.Addr, "SHOP_SCHEMA_ADMIN_ADDR", c.AdminAddr)
	// Checked here, with the other settings, so that a bad entry is named
	// by its variable (and refused before the start line), not by the guard.
	if _, err := guard.New(c.Ports, c.AllowHosts); err != nil {
		r.Failf("SHOP_SCHEMA_ALLOW_HOSTS must list host names, IP addresses or CIDRs, separated by commas")
	}
	c.IdentitySecret, c.IdentityPrevious = r.Secret("IDENTITY_SECRET")
	c.IdentityAcceptUnbound = r.Bool("IDENTITY_ACCEPT_UNBOUND", false)
	// Compared only when both are valid: a bad one is reported alone.
	if validTimeout(c.Timeout) && validTimeout(c.ConnectTimeout) {
		r.Check(c.ConnectTimeout <= c.Timeout, "SHOP_SCHEMA_CONNECT_TIMEOUT must not exceed SHOP_SCHEMA_TIMEOUT")
	}
	gcdefaults.Read(getenv).Check(r) // Go's own defaults, but no bad value unseen
	c.Settings = slices.Concat(r.Names(), gcdefaults.Names, telemetry.Names)
	if err := r.Err(); err != nil {
		return Config{Settings: c.Settings}, err // only the names, for run's misspelling hint
	}
	return c, nil
}

// LogValue logs the configuration with the secret masked.
func (c Config) LogValue() slog.Value {
	secret := "unset"
	if c.IdentitySecret != "" {
		secret = "***"
	}
	return slog.GroupValue(
		slog.String("addr", c.Addr), slog.String("admin_addr", c.AdminAddr),
		slog.String("identity_secret", secret), slog.Int("identity_secrets_previous", len(c.IdentityPrevious)),
		slog.Bool("identity_accept_unbound", c.IdentityAcceptUnbound),
		slog.String("log_level", c.LogLevel),
		slog.Any("allow_hosts", c.AllowHosts), slog.String("ca_file", c.CAFile),
		slog.Any("ports", c.Ports), slog.String("timeout", c.Timeout.String()),
		slog.String("connect_timeout", c.ConnectTimeout.String()), slog.Int64("max_response_bytes", c.MaxResponseBytes),
		slog.Int64("max_call_bytes", c.MaxCallBytes),
		slog.Int("page_size", c.PageSize), slog.Int("max_rows", c.MaxRows),
		slog.Int("max_concurrent", c.MaxConcurrent),
		slog.Int("max_concurrent_per_shop", c.MaxConcurrentPerShop), slog.String("shutdown_delay", c.ShutdownDelay.String()),
	)
}

// ports reads a comma-separated list of TCP ports (at least one).
func ports(r *envconfig.Reader, name, def string) []uint16 {
	var out []uint16
	for _, item := range r.List(name, def) {
		n, err := strconv.ParseUint(item, 10, 16)
		if err != nil || n == 0 {
			r.Failf("%s must list ports from 1 to 65535, separated by commas (got %s)", name, envconfig.Shown(item))
			return nil
		}
		out = append(out, uint16(n))
	}
	r.Check(len(out) > 0, name+" must list at least one port")
	return out
}
