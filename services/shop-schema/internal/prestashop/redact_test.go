package prestashop

import (
	"errors"
	"fmt"
	"strings"
	"testing"
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
