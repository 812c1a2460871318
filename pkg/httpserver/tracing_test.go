package httpserver

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
)

func TestSpanPathHoldsNoKey(t *testing.T) {
	key, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/v1/export/items/"+key, nil)
	for _, a := range requestAttrs(r) {
		if a.Key == "url.path" && a.Value.AsString() != "/v1/export/items/[key]" {
			t.Errorf("url.path = %q, want the key redacted", a.Value.AsString())
		}
		if strings.Contains(a.Value.String(), key) {
			t.Errorf("attribute %s holds the key", a.Key)
		}
	}
}
