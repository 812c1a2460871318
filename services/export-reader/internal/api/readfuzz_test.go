package api_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
)

// FuzzReadRequests sends the list route (an empty item) or the item route
// a raw query from the fuzzer, and the item route an item id from it,
// through the service on PostgreSQL, signed as the gateway signs them, a
// whole API key wherever "$KEY" stands; a target the gateway would not
// forward (a space, a control byte, a '#', a broken %-escape in the path)
// is skipped. Every answer is the
// envelope (do checks it and its request id), never a 5xx; a refusal has
// a code and a message holding neither the key nor a control character.
// The seeds are TestListParameters' and TestItem's.
func FuzzReadRequests(f *testing.F) {
	for _, q := range []string{"", "lang=ENG&lang2=x", "limit=101", "limit=%2B5", "cursor=%FF%FE", "cursor=a;b",
		"updated_after=2000-01-01T00:00:00%2B24:00", "updated_after=2026-11-29T19:51%2B01:00%5BEurope/Paris%5D",
		"status=sold", "%zz=1", "$KEY=1", "api_key=$KEY", "lang=$KEY", "limit=5&&&status=active", "l%61ng=RUS&lang=ENG"} {
		f.Add("", q)
	}
	for _, item := range []string{"a", "b", "nope", "%FF", "a%00b", "a%2Fb", strings.Repeat("x", 129), "$KEY", "%E2%80%AE"} {
		f.Add(item, "")
		f.Add(item, "lang=UKR")
	}
	f.Add("a", "lang=eng")
	f.Add("a", "limit=1")
	e := newEnv(f)
	owner := e.owner(f)
	e.importLines(f, owner, itemLine("a", "active", "A"), itemLine("b", "inactive", "B"))
	key, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, item, query string) {
		item, query = strings.ReplaceAll(item, "$KEY", key), strings.ReplaceAll(query, "$KEY", key)
		path := "/v1/export/items"
		if item != "" {
			path += "/" + item
		}
		target := path
		if query != "" {
			target += "?" + query
		}
		if _, err := url.PathUnescape(path); err != nil ||
			strings.ContainsFunc(target, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '#' }) ||
			strings.Contains(item, "/") {
			t.Skip() // the gateway forwards no such target (checkPath, FuzzCheckPath), nor another route's
		}
		// do asks for a URL it can parse; the target is sent as is.
		r := e.do(t, "/v1/export/items", func(r *http.Request) {
			r.URL.Opaque, r.URL.RawQuery = path, query
			e.sign(owner)(r)
		})
		if r.status >= 500 {
			t.Fatalf("GET %q = %d %s", target, r.status, r.body)
		}
		if r.status < 400 {
			return
		}
		if r.env.Error == nil || r.env.Error.Code == "" || r.env.Error.Message == "" {
			t.Fatalf("GET %q = %d %s, want an error with a code and a message", target, r.status, r.body)
		}
		if msg := r.env.Error.Message; strings.Contains(msg, key) || strings.ContainsFunc(msg, unicode.IsControl) {
			t.Fatalf("GET %q = %d: the message holds the key or a control character: %q", target, r.status, msg)
		}
	})
}
