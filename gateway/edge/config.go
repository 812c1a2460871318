package edge

import (
	"cmp"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/coinexport/export/gateway/upstream"
	"github.com/coinexport/export/pkg/envconfig"
	"github.com/coinexport/export/pkg/gcdefaults"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/redisclient"
	"github.com/coinexport/export/pkg/telemetry"
	"github.com/ulule/limiter/v3"
	"golang.org/x/net/http/httpguts"
)

// Config is everything the gateway reads from its environment. Each field's
// variable and default are beside it; README.md has the same table.
type Config struct {
	Addr             string         // GATEWAY_ADDR (127.0.0.1:8080)
	AdminAddr        string         // GATEWAY_ADMIN_ADDR (127.0.0.1:9080): /metrics, /debug/pprof
	DatabaseURL      string         // DATABASE_URL (required; secret)
	RedisURL         string         // REDIS_URL (redis://127.0.0.1:6379/0; secret)
	IdentitySecret   string         // IDENTITY_SECRET (required, ≥32 bytes; secret)
	LogLevel         string         // LOG_LEVEL (info)
	TrustTraceparent bool           // GATEWAY_TRUST_TRACEPARENT (false)
	ProxyHeader      string         // GATEWAY_PROXY_HEADER (""): client IP header set by a trusted proxy
	TrustedProxies   []netip.Prefix // GATEWAY_TRUSTED_PROXIES (""): comma-separated IPs/CIDRs allowed to set it; required with ProxyHeader
	MaxHeaderBytes   int            // GATEWAY_MAX_HEADER_BYTES (8192)
	ReadTimeout      time.Duration  // GATEWAY_READ_TIMEOUT (15s)
	WriteTimeout     time.Duration  // GATEWAY_WRITE_TIMEOUT (60s)
	IdleTimeout      time.Duration  // GATEWAY_IDLE_TIMEOUT (60s)
	ShutdownTimeout  time.Duration  // GATEWAY_SHUTDOWN_TIMEOUT (25s): no shorter than any service's drain
	ShutdownDelay    time.Duration  // GATEWAY_SHUTDOWN_DELAY (0s): serving on after the stop signal
	MaxConnections   int            // GATEWAY_MAX_CONNECTIONS (4096) client connections open at once; 0 = no cap

	// ShopSchemaIdentitySecret signs shop-schema's calls in IdentitySecret's
	// place: shop-schema reads merchants' servers, and holding
	// IDENTITY_SECRET it could sign identities export-reader and
	// sales-writer accept.
	ShopSchemaIdentitySecret string // SHOP_SCHEMA_IDENTITY_SECRET ("": IDENTITY_SECRET signs them, with a warning; ≥32 bytes, not IDENTITY_SECRET; secret)

	ExportReaderURLs []string // EXPORT_READER_URLS (http://127.0.0.1:8081)
	SalesWriterURLs  []string // SALES_WRITER_URLS (http://127.0.0.1:8082)
	ShopSchemaURLs   []string // SHOP_SCHEMA_URLS (http://127.0.0.1:8083)

	UpstreamConnectTimeout time.Duration // UPSTREAM_CONNECT_TIMEOUT (1s)
	UpstreamReadTimeout    time.Duration // UPSTREAM_READ_TIMEOUT (30s)
	UpstreamWriteTimeout   time.Duration // UPSTREAM_WRITE_TIMEOUT (10s)
	UpstreamDownFor        time.Duration // UPSTREAM_DOWN_FOR (2s)
	UpstreamProbeInterval  time.Duration // UPSTREAM_PROBE_INTERVAL (2s)
	UpstreamMaxConns       int           // UPSTREAM_MAX_CONNS (512)
	// UpstreamResolveInterval, when not 0, resolves each upstream URL's host
	// name that often and makes every address an instance (upstream.Discover).
	UpstreamResolveInterval time.Duration // UPSTREAM_RESOLVE_INTERVAL (0: off)

	KeyCacheTTL        time.Duration // KEY_CACHE_TTL (30s)
	KeyCacheUnheardTTL time.Duration // KEY_CACHE_UNHEARD_TTL (1s)
	KeyCacheSize       int           // KEY_CACHE_SIZE (100000)
	KeyLookupTimeout   time.Duration // KEY_LOOKUP_TIMEOUT (2s)

	RateLimitEnabled      bool          // RATE_LIMIT_ENABLED (true)
	RateLimitRedisTimeout time.Duration // RATE_LIMIT_REDIS_TIMEOUT (50ms)
	RateLimitKeyPrefix    string        // RATE_LIMIT_KEY_PREFIX (rl:)
	RateExportRead        limiter.Rate  // RATE_LIMIT_EXPORT_READ (6000-M) per key
	RateSalesWrite        limiter.Rate  // RATE_LIMIT_SALES_WRITE (600-M) per key
	RateAnonymous         limiter.Rate  // RATE_LIMIT_ANONYMOUS (600-M) per client IP
	RateShopSchema        limiter.Rate  // RATE_LIMIT_SHOP_SCHEMA (30-M) per client IP
	ShopSchemaInFlight    int           // RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT (4) shop schema calls at once per client IP
	OwnerInFlight         int           // RATE_LIMIT_OWNER_IN_FLIGHT (64) keyed requests at once per owner; 0 = no cap
	OwnerSaleInFlight     int           // RATE_LIMIT_OWNER_SALE_IN_FLIGHT (a quarter of the above, 16) of them on the sale routes; the export routes have the rest
	RateAuthFailures      limiter.Rate  // RATE_LIMIT_AUTH_FAILURES (60-M) per client IP

	GC gcdefaults.Settings // GOGC (400), GOMEMLIMIT (100MiB)
	// Settings names every variable read (tracing's: telemetry.Names), so that run can warn of one set
	// with a name close to them (envconfig.Misspelt).
	Settings []string
}

// BodyLimit is the largest request body accepted (413 above it).
const BodyLimit = 64 << 10

// LoadConfig reads and validates the configuration.
func LoadConfig(getenv func(string) string) (Config, error) {
	r := envconfig.New(getenv)
	cfg := readSettings(r, getenv)
	readDependentSettings(r, &cfg)
	cfg.Settings = slices.Concat(r.Names(), gcdefaults.Names, telemetry.Names)
	if err := r.Err(); err != nil {
		return Config{Settings: cfg.Settings}, err // only the names, for run's misspelling hint
	}
	return cfg, nil
}

// readSettings reads every setting that has a default, within the bounds
// it is read with; readDependentSettings checks what those bounds cannot.
func readSettings(r *envconfig.Reader, getenv func(string) string) Config {
	timeout := func(name string, def time.Duration) time.Duration {
		return r.Duration(name, def, time.Millisecond, time.Hour)
	}
	return Config{
		Addr:             r.Addr("GATEWAY_ADDR", "127.0.0.1:8080"),
		AdminAddr:        r.Addr("GATEWAY_ADMIN_ADDR", "127.0.0.1:9080"),
		RedisURL:         r.String("REDIS_URL", "redis://127.0.0.1:6379/0"),
		LogLevel:         r.LogLevel(),
		TrustTraceparent: r.Bool("GATEWAY_TRUST_TRACEPARENT", false),
		ProxyHeader:      r.String("GATEWAY_PROXY_HEADER", ""),
		MaxHeaderBytes:   r.Int("GATEWAY_MAX_HEADER_BYTES", 8192, minHeaderBytes, 1<<20),
		ReadTimeout:      timeout("GATEWAY_READ_TIMEOUT", 15*time.Second),
		WriteTimeout:     timeout("GATEWAY_WRITE_TIMEOUT", 60*time.Second),
		IdleTimeout:      timeout("GATEWAY_IDLE_TIMEOUT", 60*time.Second),
		ShutdownTimeout:  timeout("GATEWAY_SHUTDOWN_TIMEOUT", 25*time.Second),
		ShutdownDelay:    r.Duration("GATEWAY_SHUTDOWN_DELAY", 0, 0, time.Minute),
		MaxConnections:   r.Int("GATEWAY_MAX_CONNECTIONS", defaultMaxConnections, 0, 1_000_000),

		ExportReaderURLs: r.List("EXPORT_READER_URLS", "http://127.0.0.1:8081"),
		SalesWriterURLs:  r.List("SALES_WRITER_URLS", "http://127.0.0.1:8082"),
		ShopSchemaURLs:   r.List("SHOP_SCHEMA_URLS", "http://127.0.0.1:8083"),

		UpstreamConnectTimeout: timeout("UPSTREAM_CONNECT_TIMEOUT", time.Second),
		UpstreamReadTimeout:    timeout("UPSTREAM_READ_TIMEOUT", 30*time.Second),
		UpstreamWriteTimeout:   timeout("UPSTREAM_WRITE_TIMEOUT", 10*time.Second),
		UpstreamDownFor:        timeout("UPSTREAM_DOWN_FOR", 2*time.Second),
		// A probe waits for its answer one interval: shorter than this, a
		// service that answers in a few milliseconds under load goes
		// unanswered, and every instance is taken out.
		UpstreamProbeInterval:   r.Duration("UPSTREAM_PROBE_INTERVAL", 2*time.Second, 100*time.Millisecond, time.Hour),
		UpstreamMaxConns:        r.Int("UPSTREAM_MAX_CONNS", 512, 1, 100_000),
		UpstreamResolveInterval: r.Duration("UPSTREAM_RESOLVE_INTERVAL", 0, 0, time.Hour),

		KeyCacheTTL:        timeout("KEY_CACHE_TTL", 30*time.Second),
		KeyCacheUnheardTTL: timeout("KEY_CACHE_UNHEARD_TTL", time.Second),
		KeyCacheSize:       r.Int("KEY_CACHE_SIZE", 100_000, 1, 100_000_000),
		// The two waits a request may make before it is proxied: longer
		// than seconds, a stalled PostgreSQL or Redis holds requests that
		// long before the lookup fails them (503) or the limiter turns to
		// deciding in the process.
		KeyLookupTimeout: r.Duration("KEY_LOOKUP_TIMEOUT", 2*time.Second, time.Millisecond, 30*time.Second),

		RateLimitEnabled:      r.Bool("RATE_LIMIT_ENABLED", true),
		RateLimitRedisTimeout: r.Duration("RATE_LIMIT_REDIS_TIMEOUT", 50*time.Millisecond, time.Millisecond, 5*time.Second),
		RateLimitKeyPrefix:    r.String("RATE_LIMIT_KEY_PREFIX", "rl:"),
		RateExportRead:        rate(r, "RATE_LIMIT_EXPORT_READ", "6000-M"),
		RateSalesWrite:        rate(r, "RATE_LIMIT_SALES_WRITE", "600-M"),
		RateAnonymous:         rate(r, "RATE_LIMIT_ANONYMOUS", "600-M"),
		RateShopSchema:        rate(r, "RATE_LIMIT_SHOP_SCHEMA", "30-M"),
		ShopSchemaInFlight:    r.Int("RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT", 4, 1, 10000),
		OwnerInFlight:         r.Int("RATE_LIMIT_OWNER_IN_FLIGHT", 64, 0, 100000),
		RateAuthFailures:      rate(r, "RATE_LIMIT_AUTH_FAILURES", "60-M"),

		GC: gcdefaults.Read(getenv),
	}
}

// readDependentSettings reads into cfg the settings that are required or
// read against others (DATABASE_URL, the secrets, the trusted proxies, the
// owner's sale slots), and checks what readSettings read beyond the bounds
// it was read with: the Redis URL's form, GOGC and GOMEMLIMIT,
// UPSTREAM_RESOLVE_INTERVAL (0 or at least 100ms), the instance URLs, and
// settings wrong together (the two listeners, the key cache's TTLs).
func readDependentSettings(r *envconfig.Reader, cfg *Config) {
	r.SeparateListeners("GATEWAY_ADDR", cfg.Addr, "GATEWAY_ADMIN_ADDR", cfg.AdminAddr)
	cfg.DatabaseURL = postgres.ReadURL(r, "DATABASE_URL")
	redisProblem := redisclient.URLProblem(cfg.RedisURL)
	r.Check(redisProblem == "", "REDIS_URL "+redisProblem)
	cfg.GC.Check(r)
	// Only signed with here: IDENTITY_SECRET_PREVIOUS is for the services.
	cfg.IdentitySecret = r.SigningSecret("IDENTITY_SECRET")
	cfg.ShopSchemaIdentitySecret = readShopSchemaIdentitySecret(r, cfg.IdentitySecret)
	cfg.TrustedProxies = readTrustedProxies(r, cfg.ProxyHeader)
	cfg.OwnerSaleInFlight = readOwnerSaleInFlight(r, cfg.OwnerInFlight)
	// Trusted longer once revocations go unheard than while heard, a key
	// would be looked up no sooner: the setting would do nothing.
	r.Check(cfg.KeyCacheUnheardTTL <= cfg.KeyCacheTTL,
		"KEY_CACHE_UNHEARD_TTL must not exceed KEY_CACHE_TTL: a key is never trusted longer than KEY_CACHE_TTL")
	r.Check(cfg.UpstreamResolveInterval == 0 || cfg.UpstreamResolveInterval >= 100*time.Millisecond,
		"UPSTREAM_RESOLVE_INTERVAL must be 0 (off) or at least 100ms")
	checkInstanceURLs(r, "EXPORT_READER_URLS", cfg.ExportReaderURLs)
	checkInstanceURLs(r, "SALES_WRITER_URLS", cfg.SalesWriterURLs)
	checkInstanceURLs(r, "SHOP_SCHEMA_URLS", cfg.ShopSchemaURLs)
}

// readShopSchemaIdentitySecret reads SHOP_SCHEMA_IDENTITY_SECRET, "" when
// unset: a gateway upgraded without it signs shop-schema's calls with
// identitySecret as before (run warns), so that the upgrade and the split
// of the secret are two steps (README, "Rotating IDENTITY_SECRET"). Set,
// it is held to IDENTITY_SECRET's rules and must differ from it: the same
// value would leave shop-schema holding a secret the other services
// accept, the one thing the setting is for.
func readShopSchemaIdentitySecret(r *envconfig.Reader, identitySecret string) string {
	const name = "SHOP_SCHEMA_IDENTITY_SECRET"
	if r.String(name, "") == "" {
		return ""
	}
	secret := r.SigningSecret(name)
	r.Check(secret != identitySecret,
		name+" must differ from IDENTITY_SECRET: shop-schema would hold a secret export-reader and sales-writer accept (unset it to sign shop-schema's calls with IDENTITY_SECRET)")
	return secret
}

// ShopSchemaSigningSecret is the secret shop-schema's calls are signed
// with: SHOP_SCHEMA_IDENTITY_SECRET, or IDENTITY_SECRET when it is unset.
func (c Config) ShopSchemaSigningSecret() string {
	return cmp.Or(c.ShopSchemaIdentitySecret, c.IdentitySecret)
}

// readOwnerSaleInFlight reads how many of an owner's ownerInFlight slots
// are the sale routes', and records a split that leaves either service
// none. By default a quarter: a sale takes a few milliseconds, so 16 in
// flight carry more sales a second than a sales-writer commits, while the
// owner's syncs, whose pages take longer and come over many connections,
// keep 48.
func readOwnerSaleInFlight(r *envconfig.Reader, ownerInFlight int) int {
	sale := r.Int("RATE_LIMIT_OWNER_SALE_IN_FLIGHT", max(1, ownerInFlight/4), 1, 100000)
	if ownerInFlight == 1 {
		r.Failf("RATE_LIMIT_OWNER_IN_FLIGHT must be 0 (no cap) or at least 2: its slots are split between the sale routes and the export routes, one at least each")
		return sale
	}
	if ownerInFlight > 0 && sale >= ownerInFlight {
		r.Failf("RATE_LIMIT_OWNER_SALE_IN_FLIGHT (%d) must be below RATE_LIMIT_OWNER_IN_FLIGHT (%d): the export routes have the owner's other slots, and need one at least", sale, ownerInFlight)
	}
	return sale
}

// readTrustedProxies reads GATEWAY_TRUSTED_PROXIES, the proxies believed
// when their proxyHeader (GATEWAY_PROXY_HEADER) names the client, and
// records a problem with either that would let a client choose its own
// address: its per-IP rate-limit buckets and its logged address.
func readTrustedProxies(r *envconfig.Reader, proxyHeader string) []netip.Prefix {
	trusted, ok := parseTrustedProxies(r.List("GATEWAY_TRUSTED_PROXIES", ""))
	r.Check(ok, "GATEWAY_TRUSTED_PROXIES must list IPs or CIDRs, comma-separated")
	// A proxy header believed from anyone is the client's own claim.
	// A name no request can carry (a space, a colon copied with it) left
	// every client with the proxy's address, all in one per-IP bucket.
	r.Check(proxyHeader == "" || httpguts.ValidHeaderFieldName(proxyHeader),
		"GATEWAY_PROXY_HEADER must be a header name, such as X-Forwarded-For (no spaces, no colon)")
	// RFC 7239's header holds for=… pairs, not addresses: no entry of it
	// parsed, and every client was the proxy, all in one per-IP bucket.
	r.Check(!strings.EqualFold(proxyHeader, "Forwarded"),
		"GATEWAY_PROXY_HEADER=Forwarded is not read (its entries are for=…, not addresses): have the proxy append X-Forwarded-For, and name that")
	// A header proxies set beside X-Forwarded-For, named for it, started,
	// and made every client the proxy, all in one per-IP bucket.
	if holds, ok := notAnAddress[http.CanonicalHeaderKey(proxyHeader)]; ok {
		r.Failf("GATEWAY_PROXY_HEADER=%s holds no address (%s): have the proxy set the client's address in X-Forwarded-For (or X-Real-IP), and name that", proxyHeader, holds)
	}
	r.Check(proxyHeader == "" || len(trusted) > 0,
		"GATEWAY_TRUSTED_PROXIES is required with GATEWAY_PROXY_HEADER: without it any client could set its own IP")
	// Every address trusted, the client is the header's left-most entry,
	// which it writes itself: a guesser sending a new one each time got a
	// new RATE_LIMIT_AUTH_FAILURES budget each time.
	r.Check(!slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Bits() == 0 }),
		"GATEWAY_TRUSTED_PROXIES must list the proxies, not every address (0.0.0.0/0, ::/0): any client could set its own IP")
	return trusted
}

// notAnAddress is what each header a proxy sets beside X-Forwarded-For
// holds, by its canonical name: no address, whatever the request.
var notAnAddress = map[string]string{
	"X-Forwarded-Proto":       "the scheme the client used",
	"X-Forwarded-Protocol":    "the scheme the client used",
	"X-Forwarded-Scheme":      "the scheme the client used",
	"X-Forwarded-Ssl":         "on or off",
	"X-Forwarded-Host":        "the host the client asked for",
	"Host":                    "the host the client asked for",
	"X-Forwarded-Server":      "the proxy's host name",
	"X-Forwarded-Port":        "the port the client connected to",
	"X-Forwarded-Prefix":      "a path",
	"X-Forwarded-Uri":         "a path",
	"X-Forwarded-Client-Cert": "the client's certificate",
	"Via":                     "the proxies' protocols and names",
}

// checkInstanceURLs records a problem unless urls, the list read from
// name, holds at least one instance and every one is well formed.
//
// An address listed twice is refused: it would be two instances of one
// process, sent twice its share of requests and counted twice in health.
func checkInstanceURLs(r *envconfig.Reader, name string, urls []string) {
	seen := map[string]bool{}
	for _, raw := range urls {
		p, err := upstream.ParseInstanceURL(raw)
		if err != nil {
			r.Failf("%s must list http(s)://host[:port] URLs, separated by commas, without credentials, path or query", name)
			return
		}
		address := upstream.Base(p)
		if seen[address] {
			r.Failf("%s lists %s twice: each instance once", name, address)
			return
		}
		seen[address] = true
	}
	r.Check(len(urls) > 0, name+" must list at least one URL")
}

// rate reads ulule's formatted syntax ("<limit>-<S|M|H|D>", limit from 1
// to maxRateLimit).
func rate(r *envconfig.Reader, name, def string) limiter.Rate {
	v := r.String(name, def)
	rate, err := limiter.NewRateFromFormatted(v)
	if err != nil || rate.Limit < 1 || rate.Limit > maxRateLimit {
		r.Failf("%s must be <limit>-<S|M|H|D> with a limit from 1 to %d, such as %s (got %s)", name, int64(maxRateLimit), def, envconfig.Shown(v))
	}
	return rate
}

// maxRateLimit bounds a rate's limit. Redis counts a window in Lua
// numbers (ratelimit's script), doubles, exact up to 2^53: past that the
// counts went wrong (a limit of 10^17 answered X-RateLimit-Remaining above
// it), and with a limit of 2^63-1, which ulule reads, every decision read
// none remaining, so RATE_LIMIT_AUTH_FAILURES set so refused every key
// not in the cache 429, valid ones too. 10^12 a period is far above any
// stack's rate and keeps the script's sums exact.
const maxRateLimit = 1_000_000_000_000

// maskedOr is an optional secret as the start-up log shows it: masked,
// or unset when it is "".
func maskedOr(secret, unset string) string {
	if secret == "" {
		return unset
	}
	return "***"
}

// LogValue describes the configuration for the start-up log, secrets
// masked (slog calls it for a Config given as a value).
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("addr", c.Addr), slog.String("admin_addr", c.AdminAddr),
		slog.String("database", postgres.Describe(c.DatabaseURL)), slog.String("redis", redisclient.Describe(c.RedisURL)),
		slog.String("identity_secret", "***"),
		slog.String("shop_schema_identity_secret", maskedOr(c.ShopSchemaIdentitySecret, "unset or blank: IDENTITY_SECRET")),
		slog.String("log_level", c.LogLevel),
		slog.Bool("trust_traceparent", c.TrustTraceparent), slog.String("proxy_header", c.ProxyHeader),
		slog.Any("trusted_proxies", c.TrustedProxies), slog.Int("max_header_bytes", c.MaxHeaderBytes),
		slog.String("read_timeout", c.ReadTimeout.String()), slog.String("write_timeout", c.WriteTimeout.String()),
		slog.String("idle_timeout", c.IdleTimeout.String()), slog.String("shutdown_timeout", c.ShutdownTimeout.String()),
		slog.String("shutdown_delay", c.ShutdownDelay.String()), slog.Int("max_connections", c.MaxConnections),
		slog.Any("export_reader_urls", c.ExportReaderURLs), slog.Any("sales_writer_urls", c.SalesWriterURLs),
		slog.Any("shop_schema_urls", c.ShopSchemaURLs),
		slog.String("upstream_connect_timeout", c.UpstreamConnectTimeout.String()),
		slog.String("upstream_read_timeout", c.UpstreamReadTimeout.String()),
		slog.String("upstream_write_timeout", c.UpstreamWriteTimeout.String()),
		slog.String("upstream_down_for", c.UpstreamDownFor.String()),
		slog.String("upstream_probe_interval", c.UpstreamProbeInterval.String()),
		slog.Int("upstream_max_conns", c.UpstreamMaxConns),
		slog.String("upstream_resolve_interval", c.UpstreamResolveInterval.String()),
		slog.String("key_cache_ttl", c.KeyCacheTTL.String()), slog.String("key_cache_unheard_ttl", c.KeyCacheUnheardTTL.String()),
		slog.Int("key_cache_size", c.KeyCacheSize), slog.String("key_lookup_timeout", c.KeyLookupTimeout.String()),
		slog.Bool("rate_limit_enabled", c.RateLimitEnabled),
		slog.String("rate_limit_redis_timeout", c.RateLimitRedisTimeout.String()),
		slog.String("rate_limit_key_prefix", c.RateLimitKeyPrefix),
		slog.String("rate_export_read", c.RateExportRead.Formatted), slog.String("rate_sales_write", c.RateSalesWrite.Formatted),
		slog.String("rate_anonymous", c.RateAnonymous.Formatted), slog.String("rate_shop_schema", c.RateShopSchema.Formatted),
		slog.Int("shop_schema_in_flight", c.ShopSchemaInFlight),
		slog.Int("owner_in_flight", c.OwnerInFlight), slog.Int("owner_sale_in_flight", c.OwnerSaleInFlight),
		slog.String("rate_auth_failures", c.RateAuthFailures.Formatted),
		slog.Any("gc", c.GC),
	)
}

// defaultMaxConnections is GATEWAY_MAX_CONNECTIONS's default, sized for
// deploy/k8s's pod (a 256 MiB memory limit): a connection costs about 21 KB
// held open, idle or not (gateway README, "Connections"), so 4,096 of them
// take ~86 MB over a fresh gateway's 28 MB, beside the 32 MiB of held
// answers (heldAnswersLimit) and up to 1,024 connections lingering at their
// close (lingerclose.Defaults, ~24 MiB) and 256 refused ones
// (maxRefusalsLingering, ~6 MiB): ~176 MB, the rest left to requests
// in flight and the collector. A connection's request body buffer is not
// kept once its request is answered (keptBodyBufferBytes).
const defaultMaxConnections = 4096

// minHeaderBytes is the smallest GATEWAY_MAX_HEADER_BYTES. A sync must not
// be refused 431 halfway through a catalog of long ids: a list page's URL
// with the longest cursor export-reader issues (an id of 128 four-byte
// characters: 751 characters of cursor, ~900 bytes of request line) and
// what a client, its tracing and an ingress add fit under it. At 1,024 (the
// minimum until session 46) they did not.
const minHeaderBytes = 4096
