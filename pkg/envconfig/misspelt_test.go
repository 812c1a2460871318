package envconfig

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A setting written wrong is reported with the one it is close to; a
// setting read, names far from every setting read and a short name are
// not.
func TestMisspeltNamesTheSettingMeant(t *testing.T) {
	r := New(env(map[string]string{}))
	r.String("RATE_LIMIT_EXPORT_READ", "6000-M")
	r.String("GATEWAY_TRUSTED_PROXIES", "")
	r.Int("KEY_CACHE_SIZE", 1, 0, 10)
	r.String("RATE_LIMIT_EXPORT_READ", "6000-M") // read twice, named once
	r.String("ADDR", "")
	if diff := cmp.Diff([]string{"ADDR", "GATEWAY_TRUSTED_PROXIES", "KEY_CACHE_SIZE", "RATE_LIMIT_EXPORT_READ"}, r.Names()); diff != "" {
		t.Errorf("Names() (-want +got):\n%s", diff)
	}
	environ := []string{
		"RATE_LIMIT_EXPORT_READ=100-M",      // read
		"RATE_LIMIT_EXPORT_RAED=100-M",      // two edits
		"GATEWAY_TRUSTED_PROXIE=10.0.0.0/8", // one edit
		"key_cache_size=5",                  // letter case
		"RATE-LIMIT-EXPORT-READ=5-M",        // '-' for '_'
		"KEY_CACHE_TTL=1s",                  // another setting, far
		"SHOP_SCHEMA_PORTS=443",             // far from every setting read here
		"ADRR=:1",                           // short: two edits from ADDR, not compared
		"PATH=/usr/bin",
		"NO_EQUALS_SIGN",
	}
	want := []Misspelling{
		{Name: "RATE_LIMIT_EXPORT_RAED", Meant: "RATE_LIMIT_EXPORT_READ"},
		{Name: "GATEWAY_TRUSTED_PROXIE", Meant: "GATEWAY_TRUSTED_PROXIES"},
		{Name: "key_cache_size", Meant: "KEY_CACHE_SIZE"},
		{Name: "RATE-LIMIT-EXPORT-READ", Meant: "RATE_LIMIT_EXPORT_READ"},
	}
	if diff := cmp.Diff(want, Misspelt(environ, r.Names())); diff != "" {
		t.Errorf("Misspelt (-want +got):\n%s", diff)
	}
}

// A config error carries the misspellings, names only; without one it is
// the error as it was.
func TestWithMisspelt(t *testing.T) {
	base := errors.New("config: DATABASE_URL is required")
	read := []string{"DATABASE_URL", "REDIS_URL"}
	err := WithMisspelt(base, []string{"DATABSE_URL=postgres://secret@db", "HOME=/root"}, read)
	if !errors.Is(err, base) || err.Error() != "config: DATABASE_URL is required\nDATABSE_URL is set: did you mean DATABASE_URL?" {
		t.Errorf("WithMisspelt = %q, want the error and the hint", err)
	}
	if err := WithMisspelt(base, []string{"HOME=/root"}, read); err != base {
		t.Errorf("WithMisspelt without a misspelling = %v, want the error itself", err)
	}
}

// Misspelt stays quiet on a setting meant for another binary only while no
// two settings of the project's binaries are within maxEdits of each other:
// this reads the names from their configs' sources and checks every pair,
// so that a new setting too close to another fails here rather than warn
// in a shared environment.
func TestNoTwoSettingsAreClose(t *testing.T) {
	files, _ := filepath.Glob("../../services/*/config.go")
	files = append(files, "../../gateway/edge/config.go")
	name := regexp.MustCompile(`"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"`)
	owner := map[string]string{} // setting → the file that reads it
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllStringSubmatch(string(src), -1) {
			owner[m[1]] = f
		}
	}
	if len(files) != 4 || len(owner) < 50 {
		t.Fatalf("read %d settings from %v, want the four binaries' (more than 50)", len(owner), files)
	}
	for a := range owner {
		others := []string{}
		for b := range owner {
			if b != a {
				others = append(others, b)
			}
		}
		if meant, close := closest(a, others); close {
			t.Errorf("%s (%s) is within %d edits of %s (%s): each would be reported as a misspelling of the other",
				a, owner[a], maxEdits, meant, owner[meant])
		}
	}
}

// ProjectSettings is what the binaries' configs read (their sources'
// quoted setting names), with LOG_LEVEL (read here for each) and make
// run's TRACESTORE_ADDR: a setting added to a config and not to the list
// would be warned of by every other binary sharing its environment.
func TestProjectSettingsAreTheConfigs(t *testing.T) {
	files, _ := filepath.Glob("../../services/*/config.go")
	files = append(files, "../../gateway/edge/config.go")
	name := regexp.MustCompile(`"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"`)
	rotated := regexp.MustCompile(`\.Secret\("([A-Z_]+)"\)`)
	read := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllStringSubmatch(string(src), -1) {
			read[m[1]] = true
		}
		for _, m := range rotated.FindAllStringSubmatch(string(src), -1) {
			read[m[1]+"_PREVIOUS"] = true // Reader.Secret reads it too
		}
	}
	for setting, source := range map[string]string{"LOG_LEVEL": "envconfig.go", "TRACESTORE_ADDR": "../../deploy/local/run.sh"} {
		if src, err := os.ReadFile(source); err != nil || !strings.Contains(string(src), setting) {
			t.Fatalf("%s does not read %s (%v)", source, setting, err)
		}
		read[setting] = true
	}
	if diff := cmp.Diff(slices.Sorted(maps.Keys(read)), ProjectSettings); diff != "" {
		t.Errorf("ProjectSettings (-read by the configs +listed):\n%s", diff)
	}
	for _, setting := range ProjectSettings {
		if meant, unknown := unknownProjectSetting(setting); unknown {
			t.Errorf("%s is reported unknown (did you mean %s?)", setting, meant)
		}
	}
	for _, prefix := range ProjectPrefixes {
		if !slices.ContainsFunc(ProjectSettings, func(s string) bool { return strings.HasPrefix(s, prefix) }) {
			t.Errorf("prefix %s begins no setting", prefix)
		}
	}
}

// A name with a project prefix that no binary reads is reported however
// far it is from the setting meant, which is the nearest with that prefix;
// a setting of another binary is not, nor are Kubernetes' Service links
// (SHOP_SCHEMA_PORT is one edit from SHOP_SCHEMA_PORTS).
func TestMisspeltNamesUnknownProjectSettings(t *testing.T) {
	read := []string{"SHOP_SCHEMA_PORTS", "SHOP_SCHEMA_TIMEOUT", "SALES_WRITER_QUERY_TIMEOUT", "LOG_LEVEL"}
	environ := []string{
		"SALES_WRITER_TIMEOUT=5s",          // read here, far
		"EXPORT_READER_MAX_CONNS=3",        // another binary's, three edits
		"gateway_trusted_proxy=10.0.0.0/8", // another binary's, letter case and three edits
		"EXPORT_READER_DB_MAX_CONNS=3",     // another binary's setting
		"RATE_LIMIT_EXPORT_READ=1-S",       // another binary's setting
		"SHOP_SCHEMA_SERVICE_HOST=10.0.0.3", "SHOP_SCHEMA_SERVICE_PORT=8083", "SHOP_SCHEMA_SERVICE_PORT_HTTP=8083",
		"SHOP_SCHEMA_PORT=tcp://10.0.0.3:8083", "SHOP_SCHEMA_PORT_8083_TCP=tcp://10.0.0.3:8083",
		"SHOP_SCHEMA_PORT_8083_TCP_ADDR=10.0.0.3", "GATEWAY_SERVICE_HOST=10.0.0.1", "GATEWAY_PORT=tcp://10.0.0.1:80",
		"SHOP_SCHEMA_PORTT=443", // no Service link: misspelt
		"SALES_WRITER_DATABASE_URL=x", "SHOP_SCHEMA_MAX_BYTES=1024", "sales-writer-timeout=5s",
		"READ_ONLY=1", "KEYCLOAK_URL=x", "IDENTITY_ENDPOINT=http://x", "IDENTITY_HEADER=h", "CURSOR_TRACE_ID=t",
	}
	want := []Misspelling{
		{Name: "SALES_WRITER_TIMEOUT", Meant: "SALES_WRITER_QUERY_TIMEOUT"},
		{Name: "EXPORT_READER_MAX_CONNS", Meant: "EXPORT_READER_DB_MAX_CONNS"},
		{Name: "gateway_trusted_proxy", Meant: "GATEWAY_TRUSTED_PROXIES"},
		{Name: "SHOP_SCHEMA_PORTT", Meant: "SHOP_SCHEMA_PORTS"},
		{Name: "SALES_WRITER_DATABASE_URL", Meant: "DATABASE_URL"},
		{Name: "SHOP_SCHEMA_MAX_BYTES", Meant: "SHOP_SCHEMA_MAX_CALL_BYTES"},
		{Name: "sales-writer-timeout", Meant: "SALES_WRITER_QUERY_TIMEOUT"},
	}
	if diff := cmp.Diff(want, Misspelt(environ, read)); diff != "" {
		t.Errorf("Misspelt (-want +got):\n%s", diff)
	}
}
