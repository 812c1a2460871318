package catalog_test

import (
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/catalog"
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
