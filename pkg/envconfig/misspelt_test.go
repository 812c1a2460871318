package envconfig

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
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
