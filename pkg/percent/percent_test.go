package percent

import (
	"net/url"
	"strings"
	"testing"
	"unsafe"
)

func TestDecodeLeniently(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"%41%62c", "Abc"},
		{"%zz%41", "%zzA"},
		{"100%", "100%"},
		{"%4", "%4"},
		{"a%2Fb%25", "a/b%"},
		{"%2541", "%41"}, // one round only
		{"%e2%82%ac", "€"},
	} {
		if got := DecodeLeniently(tt.in); got != tt.want {
			t.Errorf("DecodeLeniently(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	s := "no escape here, 100%"
	if got := DecodeLeniently(s); unsafe.StringData(got) != unsafe.StringData(s) {
		t.Errorf("DecodeLeniently(%q) made a copy, want s itself", s)
	}
}

func TestHoldsDecoded(t *testing.T) {
	holdsA := func(s string) bool { return strings.Contains(s, "A") }
	for _, tt := range []struct {
		in     string
		rounds int
		want   bool
	}{
		{"xyz", 2, false},
		{"A", 0, true},
		{"%41", 1, true},
		{"%2541", 2, true},
		{"%2541", 1, true},  // still changing after its one round
		{"%2578", 1, true},  // so, though it decodes to no "A"
		{"%2578", 2, false}, // "%78", then "x"
		{"%zz%4", 2, false},
	} {
		if got := HoldsDecoded(tt.in, tt.rounds, holdsA); got != tt.want {
			t.Errorf("HoldsDecoded(%q, %d, holds A) = %v, want %v", tt.in, tt.rounds, got, tt.want)
		}
	}
}

// Where url.PathUnescape succeeds, DecodeLeniently reads the same.
func FuzzDecodeLeniently(f *testing.F) {
	for _, s := range []string{"", "%41", "%zz%41", "a%2Fb", "100%", "%e2%82%ac", "%%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if want, err := url.PathUnescape(s); err == nil {
			if got := DecodeLeniently(s); got != want {
				t.Fatalf("DecodeLeniently(%q) = %q, url.PathUnescape %q", s, got, want)
			}
		}
	})
}
