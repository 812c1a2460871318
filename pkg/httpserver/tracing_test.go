package httpserver

import (
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
