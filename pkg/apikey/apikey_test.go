package apikey

import (
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
)

func TestGenerateIsWellFormed(t *testing.T) {
	tests := []struct {
		scopes []string
		tag    string
	}{
		{[]string{"export:read"}, TagRead},
		{[]string{"sales:write"}, TagWrite},
		{[]string{"export:read", "sales:write"}, TagAll},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		for range 50 {
			secret, prefix, err := Generate(tt.scopes)
			if err != nil {
				t.Fatal(err)
			}
			if !WellFormed(secret) {
				t.Fatalf("WellFormed(%q) = false, want true", secret)
			}
			if !strings.HasPrefix(secret, tt.tag) || !strings.HasPrefix(secret, prefix) || len(prefix) != displayLen {
				t.Fatalf("Generate(%v) = %q, %q; want tag %q and a %d-char prefix of the secret", tt.scopes, secret, prefix, tt.tag, displayLen)
			}
			if seen[secret] {
				t.Fatalf("Generate returned %q twice", secret)
			}
			seen[secret] = true
		}
	}
}

func TestWellFormedRefuses(t *testing.T) {
	good, _, _ := Generate([]string{"export:read"})
	flip := func(i int) string {
		b := []byte(good)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	for name, s := range map[string]string{
		"empty":         "",
		"short":         good[:Len-1],
		"long":          good + "0",
		"unknown tag":   "xxx_" + good[tagLen:],
		"body typo":     flip(10),
		"checksum typo": flip(Len - 1),
		"non-base62":    good[:20] + "-" + good[21:],
		"padded":        " " + good[1:],
	} {
		if WellFormed(s) {
			t.Errorf("WellFormed(%s %q) = true, want false", name, s)
		}
	}
}

func TestHashOfIsSHA256(t *testing.T) {
	// SHA-256("abc") from FIPS 180-2.
	got := HashOf("abc")
	want := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if h := strings.ToLower(hex(got[:])); h != want {
		t.Errorf("HashOf(abc) = %s, want %s", h, want)
	}
}

func hex(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, len(b)*2)
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func TestRedactPath(t *testing.T) {
	key, _, _ := Generate([]string{"export:read"})
	other, _, _ := Generate([]string{"sales:write"})
	escaped := fmt.Sprintf("%%%02X", key[0]) + key[1:]
	lookalike := key[:Len-1] + "0" // wrong checksum (unless it happened to be "0")
	if lookalike == key {
		lookalike = key[:Len-1] + "1"
	}
	tests := []struct {
		path, want string
		found      bool
	}{
		{"/v1/export/items/coin-1", "/v1/export/items/coin-1", false},
		{"/v1/export/items/" + key, "/v1/export/items/[key]", true},
		{"/v1/export/items/" + other + "/sales/confirm", "/v1/export/items/[key]/sales/confirm", true},
		{"/" + key + "/" + other, "/[key]/[key]", true},
		{"/v1/export/items/" + lookalike, "/v1/export/items/" + lookalike, false},
		// A key inside a segment is one too.
		{"/v1/export/items/x" + key, "/v1/export/items/[key]", true},
		{"/v1/export/items/" + key + ".json", "/v1/export/items/[key]", true},
		{"/v1/export/items/a%2F" + key + "/sales/confirm", "/v1/export/items/[key]/sales/confirm", true},
		{"/v1/nothing/x" + escaped, "/v1/nothing/[key]", true},
		// An escaped letter hides nothing, even beside a broken escape.
		{"/v1/export/items/" + escaped, "/v1/export/items/[key]", true},
		{"/v1/%zz/" + escaped, "/v1/%zz/[key]", true},
		{"/v1/export/items/" + escaped + "/%zz", "/v1/export/items/[key]/%zz", true},
		{"/v1/export/items/" + escaped + "%zz", "/v1/export/items/[key]", true},
		{"/v1/export/items/%zz" + escaped + "%4", "/v1/export/items/[key]", true},
		{"/v1/export/items/%2" + key[1:], "/v1/export/items/%2" + key[1:], false},
		// Encoded twice, or more often than any client needs.
		{"/v1/a/%25" + escaped[1:], "/v1/a/[key]", true},
		{"/v1/a/%25252525" + "41" + strings.Repeat("x", Len), "/v1/a/[key]", true}, // "A" encoded 5 times
		{"/v1/a/%2541" + strings.Repeat("x", Len), "/v1/a/%2541" + strings.Repeat("x", Len), false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, found := RedactPath(tt.path)
		if got != tt.want || found != tt.found {
			t.Errorf("RedactPath(%q) = %q, %v; want %q, %v", tt.path, got, found, tt.want, tt.found)
		}
	}
}

// Keys issued before the checksum divided a uint32 must stay well formed.
func TestChecksumMatchesBase62(t *testing.T) {
	for _, s := range []string{"", "a", "cxr_abc", "cxw_0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg"} {
		c := crc32.ChecksumIEEE([]byte(s))
		sum := checksum(s)
		if got, want := string(sum[:]), base62([]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)}, checksumLen); got != want {
			t.Errorf("checksum(%q) = %s, want %s", s, got, want)
		}
	}
}

func TestContainsKey(t *testing.T) {
	key, _, err := Generate([]string{"export:read"})
	if err != nil {
		t.Fatal(err)
	}
	other := "A" // the checksum's last character changed
	if key[Len-1] == 'A' {
		other = "B"
	}
	broken := key[:Len-1] + other
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{key, true},
		{"sync/1.0 (" + key + ")", true},
		{"x" + key, true},
		{"sync/1.0", false},
		{key[:Len-1], false},
		{"sync/1.0 (" + broken + ")", false},
	} {
		if got := ContainsKey(tc.s); got != tc.want {
			t.Errorf("ContainsKey(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

// The query check runs on every request before any limit: bytes full of
// tag-like "cx" must not cost an allocation each.
func TestContainsKeyOnBytesDoesNotAllocate(t *testing.T) {
	junk := []byte(strings.Repeat("cxr_", 2000))
	if allocs := testing.AllocsPerRun(10, func() { ContainsKey(junk) }); allocs != 0 {
		t.Errorf("ContainsKey(8 KB of cxr_) = %v allocations, want 0", allocs)
	}
}

// Text that looks like a key, whole, mistyped or cut short, is found for
// redaction; a tag with a few characters after it, or none, is not.
func TestContainsKeyLike(t *testing.T) {
	key, _, err := Generate([]string{"export:read"})
	if err != nil {
		t.Fatal(err)
	}
	mistyped := key[:20] + string(key[20]^1) + key[21:]
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{key, true},
		{"ua (" + mistyped + ")", true},
		{key[:tagLen+minKeyLikeRun], true},
		{"x" + key[:30] + "-", true},
		{strings.ToUpper(key[:4]) + key[4:], true},
		{"cxr-" + key[4:], true},
		{"cxr " + key[4:], true},
		{key[:14] + "-" + key[14:], true},
		{key[:19] + "\n" + key[19:], true},
		{key[:tagLen+minKeyLikeRun-1], false},
		{"cxr_coin-17", false},
		{"cxr_coin-2024-01", false},
		{"cx.r_" + key[4:], false},
		{"cxq_" + key[tagLen:], false},
		{"", false},
	} {
		if got := ContainsKeyLike(tc.s); got != tc.want {
			t.Errorf("ContainsKeyLike(%.24q) = %v, want %v", tc.s, got, tc.want)
		}
	}
	if ContainsKey(mistyped) {
		t.Errorf("ContainsKey(mistyped key) = true: the gateway would refuse a request for a near miss")
	}
	if got := RedactKeyLikePath("/v1/export/items/" + mistyped + "/sales"); got != "/v1/export/items/[key]/sales" {
		t.Errorf("RedactKeyLikePath(near miss) = %q", got)
	}
	if got := RedactKeyLikePath("/v1/export/items/cxr_coin-17"); got != "/v1/export/items/cxr_coin-17" {
		t.Errorf("RedactKeyLikePath(an id with a tag) = %q, want it unchanged", got)
	}
}
