package apikey

import (
	"fmt"
	"hash/crc32"
	"net/url"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/percent"
	"github.com/coinexport/export/pkg/racedetector"
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
	secret := key[tagLen:]
	escapedSecret := fmt.Sprintf("%%%02X", secret[0]) + secret[1:]
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
		// A broken escape for its tag's first letter leaves the secret
		// whole: the key without its tag (ContainsUntaggedKey).
		{"/v1/export/items/%2" + key[1:], "/v1/export/items/[key]", true},
		{"/v1/export/items/%2" + key[1:Len-1], "/v1/export/items/%2" + key[1:Len-1], false},
		// A key without its tag is shorter than a key: a path or an escaped
		// segment as long as it is read too.
		{"/" + secret, "/[key]", true},
		{"/v1/export/items/" + escapedSecret, "/v1/export/items/[key]", true},
		{"/v1/export/items/" + escapedSecret[:len(escapedSecret)-1], "/v1/export/items/" + escapedSecret[:len(escapedSecret)-1], false},
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

// A key's whole secret (its tag and body) is found whatever its checksum
// says, also in a copy upper-cased; a tag with less than a body after it,
// a body without a tag, or a tag spelt as no copy of a key spells it, is
// not: such text is a client's value (an order numbered "CXR-…", a random
// base64url Idempotency-Key), which the sale routes would refuse.
func TestContainsKeySecret(t *testing.T) {
	key, mistyped := keyAndMistyped(t, "sales:write")
	hex64 := strings.Repeat("0123456789ABCDEF", 4)
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{key, true},
		{"order " + key[:tagLen+bodyLen], true}, // checksum cut off
		{key[:Len-1] + "-", true},               // checksum mistyped
		{mistyped, true},                        // a typo in the body
		{strings.ToUpper(key), true},            // its checksum tells the case back
		{"CXW_" + key[tagLen:], true},
		// A body and checksum whole, its tag respelt or left out, is the
		// key's secret (ContainsUntaggedKey).
		{"CXW-" + key[tagLen:], true},
		{"Cxw_" + key[tagLen:], true},
		{"cxw " + key[tagLen:], true},
		{key[tagLen:], true},
		{"cxw" + key[tagLen:], true},
		{"CXW-" + key[tagLen:Len-1], false}, // no checksum, no tag: letters and digits
		{strings.Repeat("0", 60) + key[tagLen:] + strings.Repeat("0", 19), false}, // inside a longer run: an id
		{"CXR-" + hex64, false}, // an order number
		{"cxa-01J9Z3K4QW8N6V2B7C5D0E1F2G01J9Z3K4QW8N6V2B7C5D0E1F2G", false}, // a prefixed ULID pair
		{"9fQ2Cxa-" + hex64[:50] + "_x-Y", false},                           // random base64url
		{key[:tagLen+bodyLen-1], false},
		{key[:30] + "-" + key[30:], true},      // a dash typed into the body
		{key[:20] + "-----" + key[20:], false}, // more than a body's width
		{"cxw_ORDER000000000000000000000000000001", false},
		{"", false},
	} {
		if got := ContainsKeySecret(tc.s); got != tc.want {
			t.Errorf("ContainsKeySecret(%.24q…) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

// A key without its tag is its whole secret: found by its checksum under
// any of the three tags, in a path, a query or a client's value, and
// refused, or hidden, as the key is; the same run of letters and digits
// with one character changed, or one short, is a client's id.
func TestContainsUntaggedKey(t *testing.T) {
	for _, scopes := range [][]string{{"export:read"}, {"sales:write"}, {"export:read", "sales:write"}} {
		key, _, err := Generate(scopes)
		if err != nil {
			t.Fatal(err)
		}
		secret := key[tagLen:]
		changed := secret[:10] + string(nextInAlphabet(secret[10])) + secret[11:]
		for _, tc := range []struct {
			s    string
			want bool
		}{
			{secret, true},
			{"x" + secret + ".json", true},
			{"order " + secret, true},
			{"cxr" + secret, true}, // its '_' dropped
			{secret + "Ab3", true},
			// Inside a longer run of letters and digits, a client's id:
			// reading every window of such ids would refuse a client's
			// id now and then (ContainsUntaggedKey).
			{strings.Repeat("Ab3", 30) + secret + "Ab3", false},
			{secret[:untaggedLen-1], false},
			{secret[1:], false},
			{changed, false},
			{strings.Repeat("Ab3", 40), false},
		} {
			if got := ContainsUntaggedKey(tc.s); got != tc.want {
				t.Errorf("ContainsUntaggedKey(%.24q…) = %v, want %v", tc.s, got, tc.want)
			}
			if got := ContainsKey(tc.s); got != tc.want {
				t.Errorf("ContainsKey(%.24q…) = %v, want %v", tc.s, got, tc.want)
			}
			if got := ContainsKeyLike(tc.s); got != tc.want {
				t.Errorf("ContainsKeyLike(%.24q…) = %v, want %v", tc.s, got, tc.want)
			}
		}
		if got, ok := RestoreTag(secret); got != key || !ok {
			t.Errorf("RestoreTag(<a %s key without its tag>) = %.8q…, %v; want the key", key[:tagLen], got, ok)
		}
		if got, ok := RestoreTag(changed); ok {
			t.Errorf("RestoreTag(<a %s key without its tag, a character changed>) = %.8q…, true; want none", key[:tagLen], got)
		}
		path := "/v1/export/items/" + secret + "/sales/confirm"
		if !PathHoldsKey(path) {
			t.Errorf("PathHoldsKey(<a %s key without its tag>) = false", key[:tagLen])
		}
		if got, want := RedactKeyLikePath(path), "/v1/export/items/[key]/sales/confirm"; got != want {
			t.Errorf("RedactKeyLikePath(<a %s key without its tag>) = %q, want %q", key[:tagLen], got, want)
		}
		if got, want := RedactKeyLikePath("/v1/export/items/"+url.PathEscape("x "+secret)), "/v1/export/items/[key]"; got != want {
			t.Errorf("RedactKeyLikePath(<%%-encoded, a %s key without its tag>) = %q, want %q", key[:tagLen], got, want)
		}
	}
}

// nextInAlphabet is the alphabet's character after c, wrapping around.
func nextInAlphabet(c byte) byte {
	return alphabet[(strings.IndexByte(alphabet, c)+1)%len(alphabet)]
}

// The query check runs on every request before any limit: bytes full of
// tag-like "cx" must not cost an allocation each.
func TestContainsKeyOnBytesDoesNotAllocate(t *testing.T) {
	if racedetector.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	junk := []byte(strings.Repeat("cxr_", 2000))
	if allocs := testing.AllocsPerRun(10, func() { ContainsKey(junk) }); allocs != 0 {
		t.Errorf("ContainsKey(8 KB of cxr_) = %v allocations, want 0", allocs)
	}
	letters := []byte(strings.Repeat("Ab3", 2700)) // every window a candidate for a key without its tag
	if allocs := testing.AllocsPerRun(10, func() { ContainsKey(letters) }); allocs != 0 {
		t.Errorf("ContainsKey(8 KB of letters) = %v allocations, want 0", allocs)
	}
}

// Text that looks like a key, whole, mistyped or cut short, is found for
// redaction; a tag with a few characters after it, or none, is not.
func TestContainsKeyLike(t *testing.T) {
	key, mistyped := keyAndMistyped(t, "export:read")
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
		{"cx.r_" + key[4:tagLen+minKeyLikeRun+2], false},
		{"cxq_" + key[tagLen:Len-1], false},
		// Behind a tag misspelt, or none, a key's body and checksum are
		// its whole secret.
		{"cx.r_" + key[4:], true},
		{"cxq_" + key[tagLen:], true},
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
	// A '/' typed into a key leaves a run across two segments, and "[key]"s
	// beside a tag make one up: what follows the tag goes too, but for the
	// routes' words.
	for path, want := range map[string]string{
		"/v1/export/items/" + key[:12] + "/" + key[12:] + "/sales":               "/v1/export/items/[key]/[key]/sales",
		"/v1/export/items/CXA /00000000000000000":                                "/v1/export/items/[key]/[key]",
		"/v1/export/items/cxr_/%41%41%41%41%41%41%41%41%41%41%41%41%41%41%41%41": "/v1/export/items/[key]/[key]",
		"/v1/cxr_abcdefghij/-" + key + "/-" + key:                                "/v1/[key]/[key]/[key]",
		// The first segment holds most of a key alone; the rest of its
		// secret, after the '/', went unredacted.
		"/v1/export/items/" + key[:tagLen+20] + "/" + key[tagLen+20:tagLen+bodyLen] + "/sales": "/v1/export/items/[key]/[key]/sales",
	} {
		if got := RedactKeyLikePath(path); got != want {
			t.Errorf("RedactKeyLikePath(%q) = %q, want %q", path, got, want)
		}
	}
	// An item id with a tag is no key, and the route's words after it do
	// not make one (they did: every sale path of such an item was hidden).
	for _, path := range []string{"/v1/export/items/cxr_coin-17", "/v1/export/items/cxr_coin-17/sales/confirm",
		"/v1/export/items/CXR-12345/sales/confirm", "/v1/export/items/cxa-10001/sales/cancel"} {
		if got := RedactKeyLikePath(path); got != path {
			t.Errorf("RedactKeyLikePath(%q) = %q, want it unchanged", path, got)
		}
	}
}

// keyOf is the key a tag and 32 bytes make, as Generate makes one, for
// seeds and fuzz targets that need keys of their choosing.
func keyOf(tag string, raw []byte) string {
	raw = append(raw[:len(raw):len(raw)], make([]byte, 32)...)[:32]
	body := tag + base62(raw, bodyLen)
	sum := checksum(body)
	return body + string(sum[:])
}

// ContainsKey finds a key wherever it is, in a string as in bytes, and is
// what the plain definition says: a well-formed key begins at some byte.
// WellFormed's checksum is the CRC-32 in base62 that big.Int writes.
func FuzzContainsKey(f *testing.F) {
	key := keyOf(TagRead, []byte("seed"))
	for _, s := range []string{
		key, "sync/1.0 (" + key + ")", "x" + key, "sync/1.0", key[:Len-1], key[:Len-1] + "A", key[:Len-1] + "B",
		strings.Repeat("cxr_", 20), keyOf(TagWrite, nil), keyOf(TagAll, []byte{0xff}) + keyOf(TagRead, []byte{1}),
		strings.ToUpper(key[:4]) + key[4:], key[:20] + "-" + key[21:], "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sumOf := func(tagged string) string {
			c := crc32.ChecksumIEEE([]byte(tagged))
			return base62([]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)}, checksumLen)
		}
		want, wantWellFormed := false, false
		for i := 0; i+Len <= len(s); i++ {
			tag, rest := s[i:i+tagLen], s[i+tagLen:i+Len]
			if (tag == TagRead || tag == TagWrite || tag == TagAll) && strings.Trim(rest, alphabet) == "" &&
				strings.HasSuffix(rest, sumOf(s[i:i+Len-checksumLen])) {
				wantWellFormed = true
			}
		}
		// Or the body and checksum of a key without its tag, under any tag,
		// at the start or the end of a run of the alphabet's characters.
		outside := func(j int) bool { return j < 0 || j >= len(s) || !strings.ContainsRune(alphabet, rune(s[j])) }
		for i := 0; i+untaggedLen <= len(s); i++ {
			rest := s[i : i+untaggedLen]
			if strings.Trim(rest, alphabet) != "" || !outside(i-1) && !outside(i+untaggedLen) {
				continue
			}
			for _, tag := range []string{TagRead, TagWrite, TagAll} {
				if strings.HasSuffix(rest, sumOf(tag+rest[:bodyLen])) {
					want = true
				}
			}
		}
		want = want || wantWellFormed
		if got := ContainsKey(s); got != want {
			t.Fatalf("ContainsKey(%q) = %v, want %v", s, got, want)
		}
		if got := ContainsKey([]byte(s)); got != want {
			t.Fatalf("ContainsKey([]byte(%q)) = %v, want %v", s, got, want)
		}
		if want && !ContainsKeyLike(s) {
			t.Fatalf("ContainsKeyLike(%q) = false, but it holds a key", s)
		}
		if got := WellFormed(s); got != (wantWellFormed && len(s) == Len) {
			t.Fatalf("WellFormed(%q) = %v, want %v", s, got, !got)
		}
	})
}

// A key placed anywhere in a path, its characters %-encoded once or
// several times, is found (PathHoldsKey) whenever decoding the segment
// that holds it, up to maxUnescapes times as url.PathUnescape does, shows
// it; and neither redaction leaves a key in its output, as sent or
// decoded.
func FuzzPathHoldsKey(f *testing.F) {
	for _, path := range []string{"/v1/export/items/", "/v1/export/items//sales/confirm", "/v1/%zz/", "/v1/a/%25", "/v1/a/%2", "/x/%"} {
		for at, mask := range []uint64{0, 1, 1 << 52, 0xffffffffffffffff} {
			f.Add(path, []byte("seed"), byte(at), mask, uint8(at), len(path)-at)
		}
	}
	f.Add("/v1/export/items/x.json", []byte{}, byte(1), uint64(0), uint8(0), 18)
	f.Add("/v1/export/items/a%2F/sales/confirm", []byte{0xff}, byte(2), uint64(2), uint8(1), 21)
	f.Fuzz(func(t *testing.T, path string, raw []byte, tag byte, mask uint64, rounds uint8, at int) {
		key := keyOf([]string{TagRead, TagWrite, TagAll}[tag%3], raw)
		var escaped strings.Builder
		for i := range len(key) {
			if mask&(1<<(i%64)) == 0 {
				escaped.WriteByte(key[i])
				continue
			}
			e := fmt.Sprintf("%%%02X", key[i])
			for range rounds % 6 {
				e = strings.ReplaceAll(e, "%", "%25")
			}
			escaped.WriteString(e)
		}
		at = min(max(at, 0), len(path))
		p := path[:at] + escaped.String() + path[at:]

		want := false
		for segment := range strings.SplitSeq(p, "/") {
			for range maxUnescapes + 1 {
				want = want || ContainsKey(segment)
				var err error
				if segment, err = url.PathUnescape(segment); err != nil {
					break
				}
			}
		}
		if want && !PathHoldsKey(p) {
			t.Fatalf("PathHoldsKey(%q) = false; it holds %s", p, key)
		}
		redacted, found := RedactPath(p)
		if found != PathHoldsKey(p) || !found && redacted != p {
			t.Fatalf("RedactPath(%q) = %q, %v; PathHoldsKey says %v", p, redacted, found, PathHoldsKey(p))
		}
		for name, out := range map[string]string{"RedactPath": redacted, "RedactKeyLikePath": RedactKeyLikePath(p)} {
			for range maxUnescapes + 1 {
				if ContainsKey(out) {
					t.Fatalf("%s(%q) = %q, which holds a key", name, p, out)
				}
				out = percent.DecodeLeniently(out)
			}
		}
	})
}

// What RedactKeyLikePath leaves of a path holds nothing ContainsKeyLike
// finds, as sent or decoded: spans and logs record it.
func FuzzRedactKeyLikePath(f *testing.F) {
	key := keyOf(TagRead, []byte("seed"))
	mistyped := key[:20] + string(key[20]^1) + key[21:]
	escaped := fmt.Sprintf("%%%02X", key[0]) + key[1:]
	for _, p := range []string{
		"/v1/export/items/coin-1", "/v1/export/items/" + key, "/v1/export/items/" + mistyped + "/sales",
		"/v1/export/items/cxr_coin-17", "/v1/export/items/cxr_coin-17/sales/confirm", "/v1/export/items/" + key[:tagLen+minKeyLikeRun], "/v1/export/items/x" + key + ".json",
		"/v1/export/items/a%2F" + key + "/sales/confirm", "/v1/%zz/" + escaped, "/v1/a/%25" + escaped[1:],
		"/v1/a/%25252525" + "41" + strings.Repeat("x", Len), "/v1/export/items/cxr-" + key[4:], "/v1/export/items/CXR " + key[4:],
		"/v1/export/items/" + key[:14] + "-" + key[14:], "/v1/export/items/" + key[:19] + "\n" + key[19:], "",
	} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got := RedactKeyLikePath(p)
		// The routes' words are kept (routeWord): with them masked, what is
		// left holds no key-like text.
		var masked []string
		for segment := range strings.SplitSeq(got, "/") {
			if routeWord(segment) {
				segment = strings.Repeat("#", len(segment))
			}
			masked = append(masked, segment)
		}
		out := strings.Join(masked, "/")
		for range maxUnescapes + 1 {
			if ContainsKeyLike(out) {
				t.Fatalf("RedactKeyLikePath(%q) = %q, which holds key-like text %q", p, got, out)
			}
			out = percent.DecodeLeniently(out)
		}
		if !ContainsKeyLike(p) && !strings.Contains(p, "%") && got != p {
			t.Fatalf("RedactKeyLikePath(%q) = %q, want it unchanged", p, got)
		}
	})
}

// keyAndMistyped returns a new key of scope, and the key with a typo in its
// body (its checksum then fails).
func keyAndMistyped(t *testing.T, scope string) (key, mistyped string) {
	t.Helper()
	key, _, err := Generate([]string{scope})
	if err != nil {
		t.Fatal(err)
	}
	return key, key[:20] + string(key[20]^1) + key[21:]
}

// BenchmarkContainsKeySecret: the sale routes read every Idempotency-Key
// and external_order_id with it; the worst text is one of tags, each
// followed by a window's scan.
func BenchmarkContainsKeySecret(b *testing.B) {
	for name, s := range map[string]string{
		"order id":       "order-2024-000123456:confirm",
		"128 base64url":  strings.Repeat("9fQ2xa-0123456789ABCDEF_", 6)[:128],
		"128 of cxr_":    strings.Repeat("cxr_", 32),
		"512 of cxr_ab ": strings.Repeat("cxr_ab", 86)[:512],
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				ContainsKeySecret(s)
			}
		})
	}
}

// BenchmarkContainsKey: the gateway reads every query parameter's name and
// value with it, before any limit; the worst text is runs of one key
// without its tag's length, each with a checksum's first digit that a
// checksum may have, so that each is read (its CRC).
func BenchmarkContainsKey(b *testing.B) {
	worst := strings.Repeat(strings.Repeat("a", bodyLen)+"4aaaaa.", 8000/(untaggedLen+1))
	for name, s := range map[string]string{
		"cursor":                 "AQAAAAAAAAAHAAYmq4vTQyAKY29pbi0xODM3ZGF0YQ8vX3ZGmQ5eXAFnBv2GC0yYLBw1Y1Cn4IOZ4fQ",
		"64 hex":                 "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"8 KB of 49-letter runs": worst,
	} {
		bytes := []byte(s)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				ContainsKey(bytes)
			}
		})
	}
}

// A key typed into a host name (its '_' a '-', as a host name has no '_';
// any case, as DNS folds it) is a whole secret when its body is whole,
// which a shop's base_url is refused for; a host that merely starts with a
// tag, or holds a key cut short, is not.
func TestHostHoldsKeySecret(t *testing.T) {
	key, _ := keyAndMistyped(t, "export:read")
	hyphenated := "cxr-" + key[tagLen:]
	for _, tc := range []struct {
		host string
		want bool
	}{
		{hyphenated + ".shop.example", true},
		{strings.ToLower(hyphenated) + ".shop.example", true},
		{strings.ToUpper(hyphenated) + ".shop.example", true},
		{"shop." + key[:tagLen+bodyLen] + ".example", true}, // checksum cut off, the copied '_'
		{"CXA-" + key[tagLen:tagLen+bodyLen] + ".shop.example", true},
		{"cxr" + key[tagLen:] + ".shop.example", true},           // its '_' dropped
		{"cxr\u2010" + key[tagLen:] + ".shop.example", true},     // a Unicode hyphen for its '_'
		{"xn--cxr" + key[tagLen:] + "-su36a.shop.example", true}, // that host as IDNA sends it: the hyphen gone
		{"cxr." + key[tagLen:] + ".shop.example", true},          // a '.' for its '_': the tag's own label
		{"CXR--" + key[tagLen:] + ".shop.example", true},
		{"cxr" + key[tagLen:tagLen+30] + ".shop.example", false}, // a body cut short
		{"cxaccountingservicesonline.example.com", false},
		{"cxr-" + key[tagLen:tagLen+30] + ".shop.example", false}, // a body cut short: redacted, not refused
		{"cxa-shop-production-server1.example.com", false},
		{"cxa-numismatique-philatelie-collections.boutique.fr", false}, // 43 letters within 47 bytes, in words
		{"www.cxa-numismatique-philatelie-collections.boutique.fr", false},
		{"cxr-" + key[tagLen:tagLen+20] + "." + key[tagLen+20:] + ".example", false}, // a '.' typed into it: redacted, not refused
		{"cxr-01j9z3k4qw8n6v2b7c5d0e1f2g.shop.example", false},
		{"shop.example", false},
		{"", false},
	} {
		if got := HostHoldsKeySecret(tc.host); got != tc.want {
			t.Errorf("HostHoldsKeySecret(%.24q…) = %v, want %v", tc.host, got, tc.want)
		}
	}
}

// A host's labels that look like a key are "[key]" for spans and logs, the
// rest kept; a host without one is returned as it is.
func TestRedactKeyLikeHost(t *testing.T) {
	key, mistyped := keyAndMistyped(t, "export:read")
	for host, want := range map[string]string{
		"cxr-" + key[tagLen:] + ".shop.example":                                           "[key].shop.example",
		strings.ToLower("CXR-"+key[tagLen:tagLen+20]) + ".shop.example":                   "[key].shop.example",
		"shop." + mistyped + ".example":                                                   "shop.[key].example",
		"xn--cxr" + key[tagLen:] + "-su36a.shop.example":                                  "[key].shop.example", // a Unicode hyphen for its '_', as IDNA sends it
		"cxr" + key[tagLen:tagLen+20] + ".shop.example":                                   "cxr" + key[tagLen:tagLen+20] + ".shop.example",
		"cxaccountingservicesonline.example.com":                                          "cxaccountingservicesonline.example.com",
		"cxr" + key[tagLen:tagLen+20] + "." + key[tagLen+20:tagLen+bodyLen] + ".example":  "[key].[key].example",    // its '_' dropped, a '.' typed into it
		"cxr-" + key[tagLen:tagLen+20] + "." + key[tagLen+20:tagLen+bodyLen] + ".example": "[key].[key].example",    // the first label most of a key alone
		"cxa-shop-production-server1.example.com":                                         "[key].example.com",      // looks like one: kept out, as a path's
		"cxa-numismatique-philatelie-collections.boutique.fr":                             "[key].boutique.fr",      // served, but kept out too
		"cxr." + key[tagLen:] + ".shop.example":                                           "cxr.[key].shop.example", // the tag a label of its own, a word's letters
		"cxr.x." + key[tagLen:tagLen+bodyLen] + ".example":                                "cxr.x.[key].example",
		"cxr.coin-17.shop.example":                                                        "cxr.coin-17.shop.example",
		"cxr-coin-17.shop.example":                                                        "cxr-coin-17.shop.example",
		"shop.example":                                                                    "shop.example",
		"203.0.113.7":                                                                     "203.0.113.7",
		"":                                                                                "",
	} {
		if got := RedactKeyLikeHost(host); got != want {
			t.Errorf("RedactKeyLikeHost(%.24q…) = %q, want %q", host, got, want)
		}
	}
}
