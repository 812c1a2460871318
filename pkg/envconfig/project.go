package envconfig

import (
	"slices"
	"strings"

	"github.com/agnivade/levenshtein"
)

// ProjectSettings is every variable a binary of the project reads itself
// (the four services' configs, exportctl, make run's TRACESTORE_ADDR),
// sorted; TestProjectSettingsAreTheConfigs holds it to their sources.
var ProjectSettings = []string{
	"CURSOR_SECRET", "CURSOR_SECRET_PREVIOUS", "DATABASE_URL",
	"EXPORT_READER_ADDR", "EXPORT_READER_ADMIN_ADDR", "EXPORT_READER_DB_MAX_CONNS",
	"EXPORT_READER_QUERY_TIMEOUT", "EXPORT_READER_READ_AHEAD_PAGES", "EXPORT_READER_READ_AHEAD_TTL",
	"EXPORT_READER_SHUTDOWN_DELAY", "EXPORT_READER_URLS",
	"GATEWAY_ADDR", "GATEWAY_ADMIN_ADDR", "GATEWAY_IDLE_TIMEOUT", "GATEWAY_MAX_CONNECTIONS", "GATEWAY_MAX_HEADER_BYTES",
	"GATEWAY_PROXY_HEADER",
	"GATEWAY_READ_TIMEOUT", "GATEWAY_SHUTDOWN_DELAY", "GATEWAY_SHUTDOWN_TIMEOUT", "GATEWAY_TRUSTED_PROXIES",
	"GATEWAY_TRUST_TRACEPARENT", "GATEWAY_WRITE_TIMEOUT",
	"IDEMPOTENCY_PURGE_INTERVAL", "IDEMPOTENCY_RETENTION",
	"IDENTITY_ACCEPT_UNBOUND", "IDENTITY_SECRET", "IDENTITY_SECRET_PREVIOUS",
	"KEY_CACHE_SIZE", "KEY_CACHE_TTL", "KEY_CACHE_UNHEARD_TTL", "KEY_LOOKUP_TIMEOUT", "LOG_LEVEL",
	"RATE_LIMIT_ANONYMOUS", "RATE_LIMIT_AUTH_FAILURES", "RATE_LIMIT_ENABLED", "RATE_LIMIT_EXPORT_READ",
	"RATE_LIMIT_KEY_PREFIX", "RATE_LIMIT_OWNER_IN_FLIGHT", "RATE_LIMIT_OWNER_SALE_IN_FLIGHT", "RATE_LIMIT_REDIS_TIMEOUT",
	"RATE_LIMIT_SALES_WRITE",
	"RATE_LIMIT_SHOP_SCHEMA", "RATE_LIMIT_SHOP_SCHEMA_IN_FLIGHT",
	"READ_DATABASE_URL", "READ_MAX_LAG", "REDIS_URL",
	"SALES_WRITER_ADDR", "SALES_WRITER_ADMIN_ADDR", "SALES_WRITER_COMMIT_GROUPS", "SALES_WRITER_DB_MAX_CONNS",
	"SALES_WRITER_QUERY_TIMEOUT",
	"SALES_WRITER_SHUTDOWN_DELAY",
	"SALES_WRITER_URLS",
	"SHOP_SCHEMA_ADDR", "SHOP_SCHEMA_ADMIN_ADDR", "SHOP_SCHEMA_ALLOW_HOSTS", "SHOP_SCHEMA_CA_FILE",
	"SHOP_SCHEMA_CONNECT_TIMEOUT", "SHOP_SCHEMA_IDENTITY_SECRET", "SHOP_SCHEMA_MAX_CALL_BYTES", "SHOP_SCHEMA_MAX_CONCURRENT",
	"SHOP_SCHEMA_MAX_CONCURRENT_PER_SHOP",
	"SHOP_SCHEMA_MAX_RESPONSE_BYTES", "SHOP_SCHEMA_MAX_ROWS", "SHOP_SCHEMA_PAGE_SIZE", "SHOP_SCHEMA_PORTS",
	"SHOP_SCHEMA_SHUTDOWN_DELAY", "SHOP_SCHEMA_TIMEOUT", "SHOP_SCHEMA_URLS", "TRACESTORE_ADDR",
	"UPSTREAM_CONNECT_TIMEOUT", "UPSTREAM_DOWN_FOR", "UPSTREAM_MAX_CONNS", "UPSTREAM_PROBE_INTERVAL",
	"UPSTREAM_READ_TIMEOUT", "UPSTREAM_RESOLVE_INTERVAL", "UPSTREAM_WRITE_TIMEOUT",
}

// ProjectPrefixes begin the names of the project's own settings, and of
// no variable another program is known to set: a variable that begins
// with one and is no project setting is a setting written wrong, however
// far from the name meant (SALES_WRITER_TIMEOUT for
// SALES_WRITER_QUERY_TIMEOUT). IDENTITY_ and CURSOR_ are not among them:
// Azure gives a managed identity's containers IDENTITY_ENDPOINT and
// IDENTITY_HEADER, and the Cursor editor its terminals CURSOR_TRACE_ID.
var ProjectPrefixes = []string{
	"EXPORT_READER_", "GATEWAY_", "IDEMPOTENCY_", "KEY_CACHE_",
	"RATE_LIMIT_", "SALES_WRITER_", "SHOP_SCHEMA_", "UPSTREAM_",
}

// projectPrefix is the project prefix name begins with, once normalized,
// or "".
func projectPrefix(name string) string {
	upper := normalized(name)
	for _, p := range ProjectPrefixes {
		if strings.HasPrefix(upper, p) {
			return p
		}
	}
	return ""
}

// unknownProjectSetting reports whether name has a project prefix and no
// binary of the project reads it, with the setting it most likely meant:
// the one sharing the most words with what follows the prefix
// (SALES_WRITER_DATABASE_URL: DATABASE_URL), then one with the same prefix
// (SALES_WRITER_TIMEOUT: SALES_WRITER_QUERY_TIMEOUT, not
// SHOP_SCHEMA_TIMEOUT), then the nearest by edits of those words.
func unknownProjectSetting(name string) (meant string, unknown bool) {
	prefix := projectPrefix(name)
	if prefix == "" || slices.Contains(ProjectSettings, name) {
		return "", false
	}
	rest := normalized(name)[len(prefix):]
	words := strings.Split(rest, "_")
	type score struct{ shared, samePrefix, edits int }
	better := func(a, b score) bool {
		if a.shared != b.shared {
			return a.shared > b.shared
		}
		if a.samePrefix != b.samePrefix {
			return a.samePrefix > b.samePrefix
		}
		return a.edits < b.edits
	}
	var best score
	for _, setting := range ProjectSettings {
		settingPrefix := projectPrefix(setting)
		settingRest := setting[len(settingPrefix):]
		s := score{edits: levenshtein.ComputeDistance(rest, settingRest)}
		for _, w := range strings.Split(settingRest, "_") {
			if slices.Contains(words, w) {
				s.shared++
			}
		}
		if settingPrefix == prefix {
			s.samePrefix = 1
		}
		if meant == "" || better(s, best) {
			meant, best = setting, s
		}
	}
	return meant, true
}

// serviceLinks are the variables Kubernetes gives a pod for each Service
// of its namespace (unless the pod sets enableServiceLinks: false), found
// by their NAME_SERVICE_HOST: NAME_SERVICE_HOST, NAME_SERVICE_PORT[_…],
// NAME_PORT and NAME_PORT_<port>_<protocol>[_…]. The Services named
// gateway, export-reader, sales-writer and shop-schema give GATEWAY_PORT,
// SHOP_SCHEMA_PORT (one edit from SHOP_SCHEMA_PORTS) and the like: no
// setting written wrong.
func serviceLinks(environ []string) map[string]bool {
	var services []string
	for _, entry := range environ {
		name, _, _ := strings.Cut(entry, "=")
		if service, ok := strings.CutSuffix(name, "_SERVICE_HOST"); ok {
			services = append(services, service)
		}
	}
	links := map[string]bool{}
	for _, entry := range environ {
		name, _, _ := strings.Cut(entry, "=")
		for _, service := range services {
			rest, ok := strings.CutPrefix(name, service+"_")
			if ok && (rest == "PORT" || strings.HasPrefix(rest, "PORT_") || strings.HasPrefix(rest, "SERVICE_")) {
				links[name] = true
			}
		}
	}
	return links
}
