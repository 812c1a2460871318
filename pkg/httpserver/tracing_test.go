package httpserver

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
)

// A path decoded from %FF is not UTF-8, which OTLP cannot encode (the
// whole export batch would be dropped): the span records U+FFFD instead.
func TestSpanPathIsUTF8(t *testing.T) {
	r := httptest.NewRequest("GET", "/v1/export/items/coin%FF%FE", nil)
	for _, a := range requestAttrs(r) {
		if a.Key == "url.path" && a.Value.AsString() != "/v1/export/items/coin\uFFFD" {
			t.Errorf("url.path = %q, want the bytes that are not UTF-8 as U+FFFD", a.Value.AsString())
		}
	}
}

func TestSpanPathHoldsNoKey(t *testing.T) {
	key, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		t.Fatal(err)
	}
	mistyped := key[:20] + string(key[20]^1) + key[21:] // its checksum fails
	for _, k := range []string{key, mistyped, key[:30]} {
		r := httptest.NewRequest("GET", "/v1/export/items/"+k, nil)
		r.Header.Set("User-Agent", "sync/1.0 ("+k+")")
		for _, a := range requestAttrs(r) {
			if a.Key == "url.path" && a.Value.AsString() != "/v1/export/items/[key]" {
				t.Errorf("url.path = %q, want the key redacted", a.Value.AsString())
			}
			if a.Key == "user_agent.original" && a.Value.AsString() != "[holds an API key]" {
				t.Errorf("user_agent.original = %q, want it replaced", a.Value.AsString())
			}
			if strings.Contains(a.Value.String(), k[:20]) {
				t.Errorf("attribute %s holds the key %.8s…", a.Key, k)
			}
		}
	}
}

// A client that writes its shop's ws_key (32 letters and digits) or an API
// key's secret without its tag into its User-Agent sends it on every call,
// to every service: the span records such a User-Agent as a marker, also
// when the run is %-encoded, once or twice; one without such a run is
// kept as sent.
func TestSpanUserAgentHoldsNoSecretLikeRun(t *testing.T) {
	wsKey := "ZQXWSK7J9M2P4R6T8V1N3B5C7D9F2H4K"
	var once, twice strings.Builder
	for i := range len(wsKey) {
		fmt.Fprintf(&once, "%%%02X", wsKey[i])
		fmt.Fprintf(&twice, "%%25%02X", wsKey[i])
	}
	for ua, want := range map[string]string{
		"coin-sync/2.1 (" + wsKey + ")":             "[holds a secret]",
		"coin-sync/2.1 " + strings.ToLower(wsKey):   "[holds a secret]",
		"coin-sync/2.1 " + once.String():            "[holds a secret]",
		"coin-sync/2.1 " + twice.String():           "[holds a secret]",
		"coin-sync/2.1 (" + wsKey[:31] + ")":        "coin-sync/2.1 (" + wsKey[:31] + ")",
		"Mozilla/5.0 (X11; Linux x86_64; rv:128.0)": "Mozilla/5.0 (X11; Linux x86_64; rv:128.0)",
	} {
		r := httptest.NewRequest("GET", "/v1/export/items", nil)
		r.Header.Set("User-Agent", ua)
		for _, a := range requestAttrs(r) {
			if a.Key == "user_agent.original" && a.Value.AsString() != want {
				t.Errorf("user_agent.original of %.40q… = %q, want %q", ua, a.Value.AsString(), want)
			}
		}
	}
}
