package catalog_test

import (
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/identity"
)

func TestValidItemID(t *testing.T) {
	t.Parallel()
	const segment = " (an item id is one URL path segment)"
	for _, tt := range []struct {
		id, reason string // reason "" : valid
	}{
		{"coin-1", ""},
		{"s7-123", ""},
		{"...", ""},
		{".a", ""},
		{"a.", ""},
		{"a..b", ""},
		{"a b", ""},
		{"a%2Fb", ""},
		{"a?b#c;d", ""},
		{"Талер-1780", ""},
		{strings.Repeat("é", catalog.MaxItemIDLen), ""},
		{"", "must not be empty"},
		{" ", "must not be empty"},
		{"\xff", "must be valid UTF-8"},
		{"a\xc3", "must be valid UTF-8"},
		{strings.Repeat("x", catalog.MaxItemIDLen+1), "must be at most 128 characters, got 129"},
		{"a\x00b", "must not contain control characters"},
		{"a\nb", "must not contain control characters"},
		{"a\x7fb", "must not contain control characters"},
		{"a\u0085b", "must not contain control characters"},
		{" a", "must not start or end with white space"},
		{"a\u00a0", "must not start or end with white space"},
		{"x/y", `must not contain "/" or "\"` + segment},
		{"/", `must not contain "/" or "\"` + segment},
		{"../a", `must not contain "/" or "\"` + segment},
		{`x\y`, `must not contain "/" or "\"` + segment},
		{".", `must not be "." or ".."` + segment},
		{"..", `must not be "." or ".."` + segment},
	} {
		err := catalog.ValidItemID(tt.id)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.reason {
			t.Errorf("ValidItemID(%q) = %q, want %q", tt.id, got, tt.reason)
		}
	}
}

func TestStorableItemID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{"coin-1", true},
		{"Талер-1780", true},
		{"a?b#c%d e", true},
		{strings.Repeat("é", catalog.MaxItemIDLen), true},
		// Refused by ValidItemID, yet rows stored before it may hold them.
		{"x/y", true},
		{`x\y`, true},
		{"..", true},
		{" a ", true},
		{" ", true},
		{"a\nb", true},
		{"a\x7fb", true},
		// No stored row can hold these.
		{"", false},
		{strings.Repeat("x", catalog.MaxItemIDLen+1), false},
		{strings.Repeat("é", catalog.MaxItemIDLen+1), false},
		{"\xff", false},
		{"a\xc3", false},
		{"a\x00b", false},
		{"\x00", false},
	} {
		if got := catalog.StorableItemID(tt.id); got != tt.want {
			t.Errorf("StorableItemID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}

// An id holding an API key would be listed in every sync page, the key in
// clear text, and could never be read nor sold: the gateway refuses a URL
// with a key in it. The import refuses it, without quoting it.
func TestItemIDHoldingAKeyIsRefused(t *testing.T) {
	t.Parallel()
	key, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		t.Fatal(err)
	}
	const want = "must not hold an API key (the gateway refuses a URL with a key in it)"
	untagged := strings.TrimPrefix(key, apikey.TagRead)
	for name, id := range map[string]string{
		"the key":                   key,
		"the key in a longer id":    "coin-" + key + ".json",
		"its tag's _ %-escaped":     strings.Replace(key, "_", "%5F", 1),
		"its tag's _ escaped twice": strings.Replace(key, "_", "%255F", 1),
		"the key without its tag":   untagged,
		"the key with a space":      "coin " + key,
	} {
		err := catalog.ValidItemID(id)
		if err == nil || err.Error() != want {
			t.Errorf("%s: ValidItemID = %v, want %q", name, err, want)
		}
		if err != nil && strings.Contains(err.Error(), untagged[:12]) {
			t.Errorf("%s: the reason quotes the key: %v", name, err)
		}
		line := `{"id":"` + id + `","status":"active","currency":"EUR","texts":{"ENG":{"title":"T"}}}`
		_, err = catalog.ParseJSONL(strings.NewReader(line))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: ParseJSONL error = %v, want the line refused: %q", name, err, want)
		}
		if err != nil && strings.Contains(err.Error(), untagged[:12]) {
			t.Errorf("%s: ParseJSONL's error quotes the key: %v", name, err)
		}
	}
	// A key cut short, or one letter off, is no key: such an id stays valid.
	for _, id := range []string{key[:len(key)-1], key[:len(key)-1] + flip(key[len(key)-1])} {
		if err := catalog.ValidItemID(id); err != nil {
			t.Errorf("ValidItemID(a key one letter off) = %v, want nil", err)
		}
	}
}

// flip returns another letter of the key alphabet than c.
func flip(c byte) string {
	if c == 'a' {
		return "b"
	}
	return "a"
}
