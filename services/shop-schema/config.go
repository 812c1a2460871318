package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Config is every setting of the binary, read from the environment once.
type Config struct {
	Addr           string        // SHOP_SCHEMA_ADDR
	AdminAddr      string        // SHOP_SCHEMA_ADMIN_ADDR
	IdentitySecret string        // IDENTITY_SECRET (secret)
	LogLevel       string        // LOG_LEVEL
	AllowHosts     []string      // SHOP_SCHEMA_ALLOW_HOSTS (tests only)
	CAFile         string        // SHOP_SCHEMA_CA_FILE (tests only)
	Ports          []uint16      // SHOP_SCHEMA_PORTS
	Timeout        time.Duration // SHOP_SCHEMA_TIMEOUT
	ConnectTimeout time.Duration // SHOP_SCHEMA_CONNECT_TIMEOUT
	MaxBytes       int64         // SHOP_SCHEMA_MAX_RESPONSE_BYTES
	PageSize       int           // SHOP_SCHEMA_PAGE_SIZE
	MaxRows        int           // SHOP_SCHEMA_MAX_ROWS
	MaxConcurrent  int           // SHOP_SCHEMA_MAX_CONCURRENT
}

// loadConfig reads the environment through getenv, applies defaults and
// validates.
func loadConfig(getenv func(string) string) (Config, error) {
	c := Config{
		Addr:           or(getenv("SHOP_SCHEMA_ADDR"), "127.0.0.1:8083"),
		AdminAddr:      or(getenv("SHOP_SCHEMA_ADMIN_ADDR"), "127.0.0.1:9083"),
		IdentitySecret: getenv("IDENTITY_SECRET"),
		LogLevel:       or(getenv("LOG_LEVEL"), "info"),
		AllowHosts:     splitList(getenv("SHOP_SCHEMA_ALLOW_HOSTS")),
		CAFile:         getenv("SHOP_SCHEMA_CA_FILE"),
	}
	var errs []error
	collect := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	c.Ports, err = ports(or(getenv("SHOP_SCHEMA_PORTS"), "443,8443"))
	collect(err)
	c.Timeout, err = duration(getenv, "SHOP_SCHEMA_TIMEOUT", 20*time.Second)
	collect(err)
	c.ConnectTimeout, err = duration(getenv, "SHOP_SCHEMA_CONNECT_TIMEOUT", 5*time.Second)
	collect(err)
	maxBytes, err := integer(getenv, "SHOP_SCHEMA_MAX_RESPONSE_BYTES", 16<<20, 1<<10, 1<<30)
	c.MaxBytes = int64(maxBytes)
	collect(err)
	c.PageSize, err = integer(getenv, "SHOP_SCHEMA_PAGE_SIZE", 250, 1, 5000)
	collect(err)
	c.MaxRows, err = integer(getenv, "SHOP_SCHEMA_MAX_ROWS", 100000, 1, 10000000)
	collect(err)
	c.MaxConcurrent, err = integer(getenv, "SHOP_SCHEMA_MAX_CONCURRENT", 32, 1, 10000)
	collect(err)
	if len(c.IdentitySecret) < 32 {
		errs = append(errs, errors.New("IDENTITY_SECRET must be at least 32 bytes"))
	}
	if c.ConnectTimeout > c.Timeout {
		errs = append(errs, errors.New("SHOP_SCHEMA_CONNECT_TIMEOUT must not exceed SHOP_SCHEMA_TIMEOUT"))
	}
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("config: %w", errors.Join(errs...))
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
		slog.String("identity_secret", secret), slog.String("log_level", c.LogLevel),
		slog.Any("allow_hosts", c.AllowHosts), slog.String("ca_file", c.CAFile),
		slog.Any("ports", c.Ports), slog.String("timeout", c.Timeout.String()),
		slog.String("connect_timeout", c.ConnectTimeout.String()), slog.Int64("max_response_bytes", c.MaxBytes),
		slog.Int("page_size", c.PageSize), slog.Int("max_rows", c.MaxRows),
		slog.Int("max_concurrent", c.MaxConcurrent),
	)
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func ports(v string) ([]uint16, error) {
	var out []uint16
	for _, s := range splitList(v) {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("SHOP_SCHEMA_PORTS: %q is not a port", s)
		}
		out = append(out, uint16(n))
	}
	if len(out) == 0 {
		return nil, errors.New("SHOP_SCHEMA_PORTS must list at least one port")
	}
	return out, nil
}

func duration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive duration", name, v)
	}
	return d, nil
}

func integer(getenv func(string) string, name string, def, lo, hi int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: %q must be an integer from %d to %d", name, v, lo, hi)
	}
	return n, nil
}
