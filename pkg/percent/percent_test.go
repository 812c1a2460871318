package percent

import (
	"net/url"
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
