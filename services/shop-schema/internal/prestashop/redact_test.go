package prestashop

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/apikey"
)

func TestRedactURL(t *testing.T) {
	const key = "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"
	for raw, want := range map[string]string{
		// What this client writes passes as it is.
		"https://shop.example/api/categories?output_format=JSON&display=[id,name]&sort=[id_ASC]&limit=0,100":                "https://shop.example/api/categories?output_format=JSON&display=[id,name]&sort=[id_ASC]&limit=0,100",
		"https://shop.example/webservice/dispatcher.php?url=product_feature_values&output_format=JSON&filter%5Bcustom%5D=0": "https://shop.example/webservice/dispatcher.php?url=product_feature_values&output_format=JSON&filter%5Bcustom%5D=0",
		"https://shop.example/api/categories?output_format=JSON&ws_key=" + key:                                              "https://shop.example/api/categories?output_format=JSON&REDACTED",
		"https://shop.example/api/categories?token=abc&" + key:                                                              "https://shop.example/api/categories?REDACTED&REDACTED",
		"https://shop.example/" + key + "/api/categories":                                                                   "https://shop.example/REDACTED/api/categories",
		"https://" + key + ":x@shop.example/api/categories#" + key:                                                          "https://shop.example/api/categories",
		"https://shop.example/api/categories?display=" + key:                                                                "https://shop.example/api/categories?display=REDACTED",
		"https://shop.example/api/categories?output_format=JSON&ws%5Fkey=" + key:                                            "https://shop.example/api/categories?output_format=JSON&REDACTED",
		"://not a url": "REDACTED",
		// A redirect's URL is the shop's to write: the key %-encoded, in
		// lower case or as its Basic credential is the key all the same.
		"https://shop.example/" + percentEncoded(key) + "/api/categories":                     "https://shop.example/REDACTED/api/categories",
		"https://shop.example/api/x" + strings.ToLower(key) + "y":                             "https://shop.example/api/REDACTED",
		"https://shop.example/api/categories?url=" + percentEncoded(key):                      "https://shop.example/api/categories?url=REDACTED",
		"https://shop.example/api/categories?display=" + strings.ToLower(key) + "&limit=0,10": "https://shop.example/api/categories?display=REDACTED&limit=0,10",
		"https://" + strings.ToLower(key) + ".shop.example/api/categories":                    "https://REDACTED/api/categories",
		"https://shop.example/api/" + basicCredential(key):                                    "https://shop.example/api/REDACTED",
		// Encoded twice (%2541 is %41 is A), in a path segment and a kept
		// parameter's value.
		"https://shop.example/" + strings.ReplaceAll(percentEncoded(key), "%", "%25") + "/api/categories": "https://shop.example/REDACTED/api/categories",
		"https://shop.example/api/categories?url=" + strings.ReplaceAll(percentEncoded(key), "%", "%25"):  "https://shop.example/api/categories?url=REDACTED",
	} {
		if got := redactURL(raw, key); got != want {
			t.Errorf("redactURL(%q)\n = %q\nwant %q", raw, got, want)
		}
	}
}

// An API key of this service mistyped or cut short in base_url's path is
// sent (only a well-formed one is refused), but most of a secret is not
// recorded: the segment that holds it is "[key]" in url.full and in the
// logged error chain, as sent or %-encoded.
func TestRedactURLKeyLikeText(t *testing.T) {
	apiKey, _, err := apikey.Generate([]string{"export:read"})
	if err != nil {
		t.Fatal(err)
	}
	mistyped := apiKey[:len(apiKey)-1] + "-"
	for raw, want := range map[string]string{
		"https://shop.example/" + mistyped + "/api/categories?output_format=JSON": "https://shop.example/[key]/api/categories?output_format=JSON",
		"https://shop.example/shop/" + apiKey[:30] + "/api/categories":            "https://shop.example/shop/[key]/api/categories",
		"https://shop.example/" + percentEncoded(mistyped) + "/api/categories":    "https://shop.example/[key]/api/categories",
		"https://shop.example/cxr_shop/api/categories?output_format=JSON":         "https://shop.example/cxr_shop/api/categories?output_format=JSON", // a tag alone is no secret
	} {
		if got := redactURL(raw, "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"); got != want {
			t.Errorf("redactURL(%q)\n = %q\nwant %q", raw, got, want)
		}
	}
}

// A key with a '/' in it: %-encoded, it is within one segment, which is
// replaced; written as it is, it spans segments, and the whole path is.
func TestRedactURLKeyWithASlash(t *testing.T) {
	const key = "ABCDEFGHIJKLMNOP/QRSTUVWXYZ123456"
	for raw, want := range map[string]string{
		"https://shop.example/api/ABCDEFGHIJKLMNOP%2FQRSTUVWXYZ123456/x": "https://shop.example/api/REDACTED/x",
		"https://shop.example/api/" + key + "/x":                         "https://shop.example/REDACTED",
	} {
		if got := redactURL(raw, key); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// percentEncoded writes every byte of s as %XX.
func percentEncoded(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

func TestKeyFree(t *testing.T) {
	const key = "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"
	for text, want := range map[string]string{
		// net/http quotes a malformed status line: the shop wrote it.
		`Get "https://shop.example/api/languages": net/http: HTTP/1.x transport connection broken: malformed HTTP status code "` + key + `"`: `Get "https://shop.example/api/languages": net/http: HTTP/1.x transport connection broken: malformed HTTP status code "REDACTED"`,
		`malformed HTTP response "` + strings.ToLower(key) + `"`:                                                                             `malformed HTTP response "REDACTED"`,
		`malformed HTTP response "Basic ` + basicCredential(key) + `"`:                                                                       `malformed HTTP response "Basic REDACTED"`,
		`malformed HTTP response "` + percentEncoded(key) + `"`:                                                                              "the error's text is withheld: it may hold the shop key",
		`malformed HTTP response "` + strings.ReplaceAll(percentEncoded(key), "%", "%25") + `"`:                                              "the error's text is withheld: it may hold the shop key",
		`malformed HTTP response "%` + strings.Repeat("25", 5) + `41"`:                                                                       "the error's text is withheld: it may hold the shop key",
		`malformed HTTP response "100%"`:                                                                                                     "the error's text is withheld: it may hold the shop key",
		`dial tcp 203.0.113.7:443: connect: connection refused`:                                                                              `dial tcp 203.0.113.7:443: connect: connection refused`,
	} {
		err := keyFree(errors.New(text), key)
		if got := err.Error(); got != want {
			t.Errorf("keyFree(%q) = %q, want %q", text, got, want)
		}
	}
	cause := errors.New("cause")
	if err := keyFree(cause, key); !errors.Is(err, cause) {
		t.Errorf("errors.Is(keyFree(cause), cause) = false, want true")
	}
}

// The fuzz targets embed a random key in a URL or an error text, in each
// form a shop could write it (as it is, in another case, %-encoded once
// or twice, all of it or some bytes, as its Basic credential), between
// random text, and look for it in what redactURL and keyFree return.

// keyForms is how many forms embedded writes.
const keyForms = 13

// embedded writes key in the form form%keyForms picks; form/keyForms
// picks the bytes that form 12 encodes (and '%' always: left as it is
// before two hex digits, it would read as another escape).
func embedded(key string, form uint16) string {
	switch form % keyForms {
	case 0:
		return key
	case 1:
		return strings.ToLower(key)
	case 2:
		return strings.ToUpper(key)
	case 3:
		return percentEncoded(key)
	case 4:
		return strings.ToLower(percentEncoded(key))
	case 5:
		return strings.ReplaceAll(percentEncoded(key), "%", "%25")
	case 6:
		return basicCredential(key)
	case 7:
		return "Basic " + basicCredential(key)
	case 8, 9, 10, 11:
		return quotedForms(key)[form%keyForms-8]
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		if form/keyForms&(1<<(i%7)) != 0 || key[i] == '%' {
			fmt.Fprintf(&b, "%%%02X", key[i])
		} else {
			b.WriteByte(key[i])
		}
	}
	return b.String()
}

// quotedForms are the key as Go quotes it without the quotes (net/http
// and net/url quote a header line or a Location that does not parse), and
// that quoted again (a JSON log line, an error quoting an error), each
// with strconv.Quote and strconv.QuoteToASCII (%+q).
func quotedForms(key string) [4]string {
	unquoted := func(q string) string { return q[1 : len(q)-1] }
	once, onceASCII := unquoted(strconv.Quote(key)), unquoted(strconv.QuoteToASCII(key))
	return [4]string{once, unquoted(strconv.Quote(once)), onceASCII, unquoted(strconv.QuoteToASCII(onceASCII))}
}

// urlPlaces are where a URL can hold the key: E is replaced by the key
// between the fuzzer's before and after.
var urlPlaces = []string{
	"https://shop.example/api/E/categories",
	"https://E.shop.example/api/categories",
	"https://shop.example/api/categories?url=E",
	"https://shop.example/api/categories?output_format=JSON&display=[id,E]&limit=0,10",
	"https://shop.example/api/categories?x=E",
	"https://shop.example/api/categories?E=1",
	"https://E@shop.example/api/",
	"https://shop.example/api/categories#E",
	"https://shop.example/E",
	"E",
}

// usableKey returns the fuzzer's key as the service would take it, and
// false for a key the checks cannot look for: empty, shorter than 8 bytes
// (found in any text), holding NUL, or REDACTED itself.
func usableKey(raw string) (string, bool) {
	key := strings.TrimSpace(raw)
	return key, len(key) >= 8 && len(key) <= 256 && utf8.ValidString(key) && !strings.ContainsRune(key, 0) &&
		!strings.Contains(strings.ToLower(key), "redacted")
}

// leak returns the form in which text still holds key, or "": as it is
// in any case, %-encoded once or twice, as its Basic credential, or any of
// them once the text is %-decoded up to three times (leniently: a stray
// '%' does not stop the decoding). REDACTED, which a check could read as
// part of a key, is taken out first.
func leak(text, key string) string {
	text = strings.ReplaceAll(text, redacted, "\x00")
	forms := map[string]string{
		"as it is": key, "%-encoded": percentEncoded(key), "%-encoded twice": strings.ReplaceAll(percentEncoded(key), "%", "%25"),
		"as its Basic credential": basicCredential(key),
	}
	for i, form := range quotedForms(key) {
		forms[fmt.Sprintf("as Go quotes it (form %d)", 8+i)] = form
	}
	for round := range 4 {
		lower := strings.ToLower(text)
		for name, form := range forms {
			if strings.Contains(lower, strings.ToLower(form)) {
				return fmt.Sprintf("%s (after %d %%-decodings)", name, round)
			}
		}
		text = lenientUnescape(text)
	}
	return ""
}

// lenientUnescape decodes each %XX of s and keeps any other '%'.
func lenientUnescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(n))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

var redactSeeds = []struct {
	key    string
	form   uint16
	place  uint8
	before string
	after  string
}{
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 0, 0, "", ""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 1, 1, "", ""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 3, 2, "", ""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 6, 3, "", ""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 7, 9, "malformed HTTP status code \"", "\""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 4, 4, "", ""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 2, 5, "ws%5Fkey", ""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 0, 6, "", ":x"},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 0, 7, "", ""},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 12 + 13*0x55, 8, "x", "y"},
	{"ABCDEFGHIJKLMNOP/QRSTUVWXYZ123456", 0, 0, "", ""},
	{"ABCDEFGHIJKLMNOP/QRSTUVWXYZ123456", 3, 0, "", ""},
	{"ab%41cd%42ef", 1, 0, "", ""},
	{"0123456789abcdef0123456789abcdef", 0, 9, "100%", ""},
	// Leaked before HoldsKey decoded leniently: a '%' without two hex
	// digits (%zz, or a bare % at the end) stopped url.PathUnescape, and
	// the key encoded beside it was not looked for.
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 5, 0, "", "/%25zz"},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 5, 2, "", "%25"},
	{"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456", 3, 9, "%zz", ""},
	// Leaked before a kept parameter's value was looked at as written
	// too: QueryUnescape reads '+' as a space.
	{"abc+def+ghi+jkl", 2, 2, "", ""},
	{"ab~~~cd~~~ef", 6, 2, "", ""}, // its Basic credential holds '+'
	// A key holding what Go escapes when it quotes ('"', '\\', a character
	// that is not printable), in a text quoted once or twice, with %q or %+q.
	{`ABCDEFGHIJ"KLMNOP\QRSTUVWXYZ`, 8, 9, "malformed MIME header line: \"X-Echo: ", "\""},
	{"ABCDEFGHIJ\u2028KLMNOPQRSTUVWXYZ", 9, 9, `msg="shop call failed \"`, `\""`},
	{"ABCDEFGHIJ\u00a0KLMNOPQRSTUVWXYZ", 10, 9, "", ""},
	{"ABCDEFGHIJÉ\"KLMNOPQRSTUVWXYZ", 11, 9, "", ""},
	{"ABCDEFGHIJÉKLMNOPQRSTUVWXYZ", 10, 9, "", ""}, // printable: %q keeps it, %+q does not
}

func FuzzRedactURL(f *testing.F) {
	for _, s := range redactSeeds {
		f.Add(s.key, s.form, s.place, s.before, s.after)
	}
	f.Fuzz(func(t *testing.T, rawKey string, form uint16, place uint8, before, after string) {
		key, ok := usableKey(rawKey)
		if !ok {
			return
		}
		template := urlPlaces[int(place)%len(urlPlaces)]
		if leak(strings.Replace(template, "E", before+after, 1), key) != "" {
			return // the key is in the text around it already
		}
		raw := strings.Replace(template, "E", before+embedded(key, form)+after, 1)
		if got := redactURL(raw, key); leak(got, key) != "" {
			t.Fatalf("redactURL(%q, %q) = %q, which holds the key %s", raw, key, got, leak(got, key))
		}
	})
}

func FuzzKeyFree(f *testing.F) {
	for _, s := range redactSeeds {
		f.Add(s.key, s.form, s.place, s.before, s.after)
	}
	f.Fuzz(func(t *testing.T, rawKey string, form uint16, place uint8, before, after string) {
		key, ok := usableKey(rawKey)
		if !ok || strings.Contains(withheld, strings.ToLower(key)) {
			return
		}
		template := urlPlaces[int(place)%len(urlPlaces)]
		if leak(strings.Replace(template, "E", before+after, 1)+before+after, key) != "" {
			return
		}
		text := before + embedded(key, form) + after
		cause := errors.New("transport: " + text)
		err := keyFree(&url.Error{Op: "Get", URL: strings.Replace(template, "E", text, 1), Err: cause}, key)
		if leak(err.Error(), key) != "" {
			t.Fatalf("keyFree(%q, %q) = %q, which holds the key %s", text, key, err, leak(err.Error(), key))
		}
		if !errors.Is(err, cause) {
			t.Fatalf("keyFree(%q) lost its cause from the chain", text)
		}
	})
}

// joinsEscape reports whether a '%' at the end of before makes an escape
// with the first characters of e ("%0" and "0%30…" read "%00%30…"): the
// text then says something else than e, for PHP and browsers too.
func joinsEscape(before, e string) bool {
	hex := func(s string, i int) bool {
		return i < len(s) && strings.IndexByte("0123456789abcdefABCDEF", s[i]) >= 0
	}
	n := len(before)
	return n >= 1 && before[n-1] == '%' && hex(e, 0) && hex(e, 1) ||
		n >= 2 && before[n-2] == '%' && hex(before, n-1) && hex(e, 0)
}

// withheld is the text keyFree gives an error that may hold the key.
const withheld = "the error's text is withheld: it may hold the shop key"

// FuzzHoldsKey: a decoded text holds the key when any form of it is in the
// text, whatever surrounds it.
func FuzzHoldsKey(f *testing.F) {
	for _, s := range redactSeeds {
		f.Add(s.key, s.form, s.before, s.after)
	}
	f.Fuzz(func(t *testing.T, rawKey string, form uint16, before, after string) {
		key, ok := usableKey(rawKey)
		if !ok || joinsEscape(before, embedded(key, form)) {
			return
		}
		if text := before + embedded(key, form) + after; !HoldsKey(text, key) {
			t.Fatalf("HoldsKey(%q, %q) = false, want true", text, key)
		}
	})
}

// TestShopVersion: PSWS-Version goes into the answer and a log line only
// when it reads as a version, and never when it holds the key.
func TestShopVersion(t *testing.T) {
	const key = "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"
	for v, want := range map[string]string{
		"8.2.1":                          "8.2.1",
		"1.7.8.10":                       "1.7.8.10",
		"9.0.0-beta.1":                   "9.0.0-beta.1",
		"1.6.1.24":                       "1.6.1.24",
		"1.7.8.11":                       "1.7.8.11",
		"8.1.7":                          "8.1.7",
		"9.0.0":                          "9.0.0",
		"9.0.0-beta":                     "9.0.0-beta",
		"8.2.0-rc.1+build.5":             "8.2.0-rc.1+build.5",
		"8." + strings.Repeat("1", 29):   "8." + strings.Repeat("1", 29),
		"v8.2.1":                         "",
		"PrestaShop8":                    "",
		"8.2.1_x":                        "",
		"8.2.1/":                         "",
		"8.2.1é":                         "",
		"":                               "",
		"8.2.1 <b>Notice</b>":            "",
		"PrestaShop 8":                   "",
		"8." + strings.Repeat("1", 30):   "",
		"8." + strings.ToLower(key[:20]): "", // part of the key, in another case
		"8.2.1-" + key[10:16]:            "", // six of its characters in a row
		"8.2.1-" + key[10:15]:            "8.2.1-" + key[10:15],
	} {
		if got := shopVersion(v, key); got != want {
			t.Errorf("shopVersion(%q) = %q, want %q", v, got, want)
		}
	}
	const short = "SHORTKEY"
	if got := shopVersion("8."+strings.ToLower(short), short); got != "" {
		t.Errorf("shopVersion kept a version holding the key: %q", got)
	}
}

// TestBounded: a short text is kept whole; a long one keeps its two ends,
// cut at a character's start, and says how much was left out.
func TestBounded(t *testing.T) {
	if s := strings.Repeat("a", 2*errorTextEnds); bounded(s) != s {
		t.Error("a text of 2 KiB was cut")
	}
	// Odd lengths at both ends, so that each cut falls inside a "я".
	long := "Get \"https://shop.example/api/language\": " + strings.Repeat("я", 40<<10) + " the end."
	got := bounded(long)
	if len(got) > 2*errorTextEnds+64 || !utf8.ValidString(got) {
		t.Errorf("bounded: %d bytes, valid UTF-8 %v; want at most %d, valid", len(got), utf8.ValidString(got), 2*errorTextEnds+64)
	}
	for _, want := range []string{`Get "https://shop.example/api/language": `, " the end.", "bytes left out"} {
		if !strings.Contains(got, want) {
			t.Errorf("bounded text lacks %q", want)
		}
	}
}

// TestClassifiedByTheErrorsOwnText: Go's words that classify an error are
// matched at the start of the error of the chain that wraps no other, not
// in keyFree's copy, which leaves out the middle of a long text (after a
// URL of 3 KiB, where a redirect can take the request, the words are
// there) and withholds one with a '%' that does not decode (the shop's
// bytes quoted). (A URL, which a redirect chooses, cannot hold them:
// url.Error writes its spaces %20.)
func TestClassifiedByTheErrorsOwnText(t *testing.T) {
	const key = "ABCDEFGHIJKLMNOPQRSTUVWXYZ123456"
	long := "https://shop.example/" + strings.Repeat("x", 3<<10) + "/api/languages"
	broken := func(err error) error { return fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", err) }
	for cause, want := range map[error]Kind{
		errors.New("net/http: server response headers exceeded 65536 bytes; aborted"):   KindTooLarge,
		errors.New("tls: server selected unsupported protocol version 302"):             KindTLS,
		broken(fmt.Errorf("malformed HTTP status code %q", "100%")):                     KindBadResponse,
		broken(fmt.Errorf("malformed HTTP response %q", strings.Repeat("\xff", 4<<10))): KindBadResponse,
	} {
		err := keyFree(&url.Error{Op: "Get", URL: long, Err: cause}, key)
		if got := transportError(context.Background(), "languages", err).Kind; got != want {
			t.Errorf("%.80s...: kind %v, want %v", cause, got, want)
		}
	}
}
