package edge

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/cryptotest"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// FuzzKeyInQuery: a key put anywhere in a query, with any of its
// characters %-escaped (in either case), is found wherever it lands, as
// long as the query, split and decoded as fasthttp does (on '&' and the
// first '=', "%XX" and '+' decoded, a broken escape kept), holds it in a
// name or a value; and keyInQuery finds nothing else but the names
// refused as carrying a key. The reference decoder is written here, apart
// from fasthttp's. An ordinary query (limit, lang, status, updated_after,
// a cursor of the codec's alphabet and length) is never refused.
func FuzzKeyInQuery(f *testing.F) {
	for _, q := range []string{"", "limit=10", "a=1&b=", "x", "cursor=&limit=5", "a=%zz&", "=&=", "a+b=c+d",
		"lang=en#frag", "a=1;b=2", "%", "k=v%2", "?a=b"} {
		for at, mask := range []uint64{0, 1, 1 << 52, 0xffffffffffffffff} {
			f.Add(q, uint64(at), byte(at), mask, mask>>1, uint8(at), strconv.Itoa(at*7), "cursor")
		}
	}
	f.Add("limit=", uint64(1), byte(0), uint64(0), uint64(0), uint8(6), "-1", "")
	f.Add("a=b&", uint64(2), byte(1), uint64(5), uint64(0), uint8(4), "fr", "\x02\x00\x00\x00\x00\x00\x00\x00\x07coin-17")
	app := fiber.New()
	f.Fuzz(func(t *testing.T, q string, seed uint64, tag byte, mask, lower uint64, at uint8, lang, cursor string) {
		if strings.ContainsFunc(q+lang+cursor, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			t.Skip() // no request target of a request line
		}
		cryptotest.SetGlobalRandom(t, seed)
		scopes := [][]string{{identity.ScopeExportRead}, {identity.ScopeSalesWrite},
			{identity.ScopeExportRead, identity.ScopeSalesWrite}}[tag%3]
		key, _, err := apikey.Generate(scopes)
		if err != nil {
			t.Fatal(err)
		}
		var escaped strings.Builder
		for i := range len(key) {
			switch {
			case mask&(1<<(i%64)) == 0:
				escaped.WriteByte(key[i])
			case lower&(1<<(i%64)) != 0:
				fmt.Fprintf(&escaped, "%%%02x", key[i])
			default:
				fmt.Fprintf(&escaped, "%%%02X", key[i])
			}
		}
		i := min(int(at), len(q))
		withKey := q[:i] + escaped.String() + q[i:]
		want, named := referenceQueryHolds(withKey)
		if got := queryHoldsKey(app, withKey); got != (want || named) {
			t.Fatalf("keyInQuery(%q) = %v; it holds %s: %v, a key's name: %v", withKey, got, key, want, named)
		}
		if got, want := queryHoldsKey(app, q), referenceHolds(q); got != want {
			t.Fatalf("keyInQuery(%q) = %v, want %v", q, got, want)
		}

		// An ordinary query; a cursor is base64url, of up to cursor.MaxLen.
		if strings.Trim(lang, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-") != "" {
			lang = "en"
		}
		c := base64.RawURLEncoding.EncodeToString([]byte(cursor))
		ordinary := "limit=" + strconv.Itoa(int(at)) + "&lang=" + lang + "&status=active&updated_after=2025-01-02T03:04:05Z&cursor=" + c
		if len(c) <= 1024 && !apikey.ContainsKey(c) && queryHoldsKey(app, ordinary) {
			t.Fatalf("keyInQuery(%q) = true for an ordinary query", ordinary)
		}
	})
}

// queryHoldsKey runs keyInQuery on a GET of the items with the query.
func queryHoldsKey(app *fiber.App, query string) bool {
	var rctx fasthttp.RequestCtx
	rctx.Request.SetRequestURI("/v1/export/items?" + query)
	c := app.AcquireCtx(&rctx)
	defer app.ReleaseCtx(c)
	return keyInQuery(c)
}

func referenceHolds(query string) bool {
	holds, named := referenceQueryHolds(query)
	return holds || named
}

// referenceQueryHolds reports whether a name or a value of the query, as
// fasthttp splits and decodes it, holds a key, and whether a name is one
// of keyParamNames.
func referenceQueryHolds(query string) (holds, named bool) {
	query, _, _ = strings.Cut(query, "#")
	for part := range strings.SplitSeq(query, "&") {
		name, value, _ := strings.Cut(part, "=")
		name, value = decodeQueryPart(name), decodeQueryPart(value)
		if name == "" && value == "" {
			continue
		}
		holds = holds || apikey.ContainsKey(name) || apikey.ContainsKey(value)
		for _, n := range keyParamNames {
			named = named || strings.EqualFold(name, n)
		}
	}
	return holds, named
}

// decodeQueryPart decodes "%XX" and '+', and keeps a '%' without two hex
// digits after it as it is.
func decodeQueryPart(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '+':
			b.WriteByte(' ')
		case s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			n, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b.WriteByte(byte(n))
			i += 2
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
