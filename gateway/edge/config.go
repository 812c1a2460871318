package edge

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coinexport/export/pkg/postgres"
	"github.com/ulule/limiter/v3"
)

// Config is everything the gateway reads from its environment. Each field's
// variable and default are beside it; README.md has the same table.
type Config struct {
	Addr             string        // GATEWAY_ADDR (127.0.0.1:8080)
	AdminAddr        string        // GATEWAY_ADMIN_ADDR (127.0.0.1:9080): /metrics, /debug/pprof
	DatabaseURL      string        // DATABASE_URL (required; secret)
	RedisURL         string        // REDIS_URL (redis://127.0.0.1:6379/0; secret)
	IdentitySecret   string        // IDENTITY_SECRET (required, ≥32 bytes; secret)
	LogLevel         string        // LOG_LEVEL (info)
	TrustTraceparent bool          // GATEWAY_TRUST_TRACEPARENT (false)
	ProxyHeader      string        // GATEWAY_PROXY_HEADER (""): client IP header set by a trusted proxy
	TrustedProxies   []string      // GATEWAY_TRUSTED_PROXIES (""): comma-separated IPs/CIDRs allowed to set it
	MaxHeaderBytes   int           // GATEWAY_MAX_HEADER_BYTES (8192)
	ReadTimeout      time.Duration // GATEWAY_READ_TIMEOUT (15s)
	WriteTimeout     time.Duration // GATEWAY_WRITE_TIMEOUT (60s)
	IdleTimeout      time.Duration // GATEWAY_IDLE_TIMEOUT (60s)
	ShutdownTimeout  time.Duration // GATEWAY_SHUTDOWN_TIMEOUT (15s)

	ExportReaderURLs []string // EXPORT_READER_URLS (http://127.0.0.1:8081)
	SalesWriterURLs  []string // SALES_WRITER_URLS (http://127.0.0.1:8082)
	ShopSchemaURLs   []string // SHOP_SCHEMA_URLS (http://127.0.0.1:8083)

	UpstreamConnectTimeout time.Duration // UPSTREAM_CONNECT_TIMEOUT (1s)
	UpstreamReadTimeout    time.Duration // UPSTREAM_READ_TIMEOUT (30s)
	UpstreamWriteTimeout   time.Duration // UPSTREAM_WRITE_TIMEOUT (10s)
	UpstreamDownFor        time.Duration // UPSTREAM_DOWN_FOR (2s)
	UpstreamProbeInterval  time.Duration // UPSTREAM_PROBE_INTERVAL (2s)
	UpstreamMaxConns       int           // UPSTREAM_MAX_CONNS (512)

	KeyCacheTTL        time.Duration // KEY_CACHE_TTL (30s)
	KeyCacheUnheardTTL time.Duration // KEY_CACHE_UNHEARD_TTL (1s)
	KeyCacheSize       int           // KEY_CACHE_SIZE (100000)

	RateLimitEnabled      bool          // RATE_LIMIT_ENABLED (true)
	RateLimitRedisTimeout time.Duration // RATE_LIMIT_REDIS_TIMEOUT (50ms)
	RateLimitKeyPrefix    string        // RATE_LIMIT_KEY_PREFIX (rl:)
	RateExportRead        limiter.Rate  // RATE_LIMIT_EXPORT_READ (6000-M) per key
	RateSalesWrite        limiter.Rate  // RATE_LIMIT_SALES_WRITE (600-M) per key
	RateAnonymous         limiter.Rate  // RATE_LIMIT_ANONYMOUS (600-M) per client IP
	RateShopSchema        limiter.Rate  // RATE_LIMIT_SHOP_SCHEMA (30-M) per client IP
	RateAuthFailures      limiter.Rate  // RATE_LIMIT_AUTH_FAILURES (60-M) per client IP
}

// BodyLimit is the largest request body accepted (413 above it).
const BodyLimit = 64 << 10

// bodyReadLimit is the largest body the server reads before answering. A
// body over BodyLimit but under this is read in full and then refused, so a
// client still sending it gets the 413 envelope: refused unread, the
// connection is closed under the client's feet, which sees a reset or a
// broken pipe instead of the answer. Above this the server refuses on the
// declared length and closes (a client sending that much is not a client
// that reads answers carefully, and the gateway will not buffer more).
const bodyReadLimit = 1 << 20

// LoadConfig reads and validates the configuration.
func LoadConfig(getenv func(string) string) (Config, error) {
	r := reader{getenv: getenv}
	cfg := Config{
		Addr:             r.str("GATEWAY_ADDR", "127.0.0.1:8080"),
		AdminAddr:        r.str("GATEWAY_ADMIN_ADDR", "127.0.0.1:9080"),
		DatabaseURL:      r.str("DATABASE_URL", ""),
		RedisURL:         r.str("REDIS_URL", "redis://127.0.0.1:6379/0"),
		IdentitySecret:   r.str("IDENTITY_SECRET", ""),
		LogLevel:         r.str("LOG_LEVEL", "info"),
		TrustTraceparent: r.boolean("GATEWAY_TRUST_TRACEPARENT", false),
		ProxyHeader:      r.str("GATEWAY_PROXY_HEADER", ""),
		TrustedProxies:   r.list("GATEWAY_TRUSTED_PROXIES", ""),
		MaxHeaderBytes:   r.integer("GATEWAY_MAX_HEADER_BYTES", 8192),
		ReadTimeout:      r.duration("GATEWAY_READ_TIMEOUT", 15*time.Second),
		WriteTimeout:     r.duration("GATEWAY_WRITE_TIMEOUT", 60*time.Second),
		IdleTimeout:      r.duration("GATEWAY_IDLE_TIMEOUT", 60*time.Second),
		ShutdownTimeout:  r.duration("GATEWAY_SHUTDOWN_TIMEOUT", 15*time.Second),

		ExportReaderURLs: r.list("EXPORT_READER_URLS", "http://127.0.0.1:8081"),
		SalesWriterURLs:  r.list("SALES_WRITER_URLS", "http://127.0.0.1:8082"),
		ShopSchemaURLs:   r.list("SHOP_SCHEMA_URLS", "http://127.0.0.1:8083"),

		UpstreamConnectTimeout: r.duration("UPSTREAM_CONNECT_TIMEOUT", time.Second),
		UpstreamReadTimeout:    r.duration("UPSTREAM_READ_TIMEOUT", 30*time.Second),
		UpstreamWriteTimeout:   r.duration("UPSTREAM_WRITE_TIMEOUT", 10*time.Second),
		UpstreamDownFor:        r.duration("UPSTREAM_DOWN_FOR", 2*time.Second),
		UpstreamProbeInterval:  r.duration("UPSTREAM_PROBE_INTERVAL", 2*time.Second),
		UpstreamMaxConns:       r.integer("UPSTREAM_MAX_CONNS", 512),

		KeyCacheTTL:        r.duration("KEY_CACHE_TTL", 30*time.Second),
		KeyCacheUnheardTTL: r.duration("KEY_CACHE_UNHEARD_TTL", time.Second),
		KeyCacheSize:       r.integer("KEY_CACHE_SIZE", 100_000),

		RateLimitEnabled:      r.boolean("RATE_LIMIT_ENABLED", true),
		RateLimitRedisTimeout: r.duration("RATE_LIMIT_REDIS_TIMEOUT", 50*time.Millisecond),
		RateLimitKeyPrefix:    r.str("RATE_LIMIT_KEY_PREFIX", "rl:"),
		RateExportRead:        r.rate("RATE_LIMIT_EXPORT_READ", "6000-M"),
		RateSalesWrite:        r.rate("RATE_LIMIT_SALES_WRITE", "600-M"),
		RateAnonymous:         r.rate("RATE_LIMIT_ANONYMOUS", "600-M"),
		RateShopSchema:        r.rate("RATE_LIMIT_SHOP_SCHEMA", "30-M"),
		RateAuthFailures:      r.rate("RATE_LIMIT_AUTH_FAILURES", "60-M"),
	}
	if r.err != nil {
		return Config{}, r.err
	}
	return cfg, cfg.validate()
}

func (c Config) validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("DATABASE_URL is required"))
	}
	if len(c.IdentitySecret) < 32 {
		errs = append(errs, errors.New("IDENTITY_SECRET must be at least 32 bytes"))
	}
	if c.RedisURL == "" {
		errs = append(errs, errors.New("REDIS_URL is required"))
	}
	if c.MaxHeaderBytes < 1024 {
		errs = append(errs, errors.New("GATEWAY_MAX_HEADER_BYTES must be at least 1024"))
	}
	if c.KeyCacheSize < 1 || c.UpstreamMaxConns < 1 {
		errs = append(errs, errors.New("KEY_CACHE_SIZE and UPSTREAM_MAX_CONNS must be positive"))
	}
	for name, d := range map[string]time.Duration{
		"UPSTREAM_CONNECT_TIMEOUT": c.UpstreamConnectTimeout, "UPSTREAM_READ_TIMEOUT": c.UpstreamReadTimeout,
		"UPSTREAM_WRITE_TIMEOUT": c.UpstreamWriteTimeout, "UPSTREAM_PROBE_INTERVAL": c.UpstreamProbeInterval,
		"KEY_CACHE_TTL": c.KeyCacheTTL, "KEY_CACHE_UNHEARD_TTL": c.KeyCacheUnheardTTL,
		"RATE_LIMIT_REDIS_TIMEOUT": c.RateLimitRedisTimeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	return errors.Join(errs...)
}

// LogValue lists the configuration for the start-up log, secrets masked.
func (c Config) LogValue() []any {
	return []any{
		"addr", c.Addr, "admin_addr", c.AdminAddr,
		"database_url", postgres.Redact(c.DatabaseURL), "redis_url", maskURL(c.RedisURL),
		"identity_secret", "***", "log_level", c.LogLevel,
		"trust_traceparent", c.TrustTraceparent, "proxy_header", c.ProxyHeader, "trusted_proxies", c.TrustedProxies,
		"export_reader_urls", c.ExportReaderURLs, "sales_writer_urls", c.SalesWriterURLs, "shop_schema_urls", c.ShopSchemaURLs,
		"upstream_connect_timeout", c.UpstreamConnectTimeout, "upstream_read_timeout", c.UpstreamReadTimeout,
		"key_cache_ttl", c.KeyCacheTTL, "key_cache_size", c.KeyCacheSize,
		"rate_limit_enabled", c.RateLimitEnabled,
		"rate_export_read", c.RateExportRead.Formatted, "rate_sales_write", c.RateSalesWrite.Formatted,
		"rate_anonymous", c.RateAnonymous.Formatted, "rate_shop_schema", c.RateShopSchema.Formatted,
		"rate_auth_failures", c.RateAuthFailures.Formatted,
	}
}

// maskDSN shows where the database is, never its password.
func maskURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	if u.User != nil {
		u.User = url.UserPassword(u.User.Username(), "***")
	}
	return u.Redacted()
}

// reader reads typed variables and keeps the first error.
type reader struct {
	getenv func(string) string
	err    error
}

func (r *reader) str(name, def string) string {
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		return v
	}
	return def
}

func (r *reader) fail(name, v string, err error) {
	if r.err == nil {
		r.err = fmt.Errorf("%s=%q: %v", name, v, err)
	}
}

func (r *reader) boolean(name string, def bool) bool {
	v := r.str(name, strconv.FormatBool(def))
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, v, err)
	}
	return b
}

func (r *reader) integer(name string, def int) int {
	v := r.str(name, strconv.Itoa(def))
	n, err := strconv.Atoi(v)
	if err != nil {
		r.fail(name, v, err)
	}
	return n
}

func (r *reader) duration(name string, def time.Duration) time.Duration {
	v := r.str(name, def.String())
	d, err := time.ParseDuration(v)
	if err != nil {
		r.fail(name, v, err)
	}
	return d
}

func (r *reader) list(name, def string) []string {
	var out []string
	for _, s := range strings.Split(r.str(name, def), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// rate reads ulule's formatted syntax ("<limit>-<S|M|H|D>").
func (r *reader) rate(name, def string) limiter.Rate {
	v := r.str(name, def)
	rate, err := limiter.NewRateFromFormatted(v)
	if err == nil && rate.Limit < 1 {
		err = errors.New("limit must be at least 1")
	}
	if err != nil {
		r.fail(name, v, err)
	}
	return rate
}
