package api_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/export-reader/internal/cursor"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestListParameters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"), itemLine("b", "inactive", "B"))
	tests := []struct {
		query    string
		status   int
		code     string // error.code when status is 400
		wantIDs  []string
		wantText string // a substring of error.message
	}{
		{"", 200, "", []string{"a", "b"}, ""},
		{"?lang=ENG&", 200, "", []string{"a", "b"}, ""},
		{"?lang=ENG&lang2=x", 400, "invalid_parameter", nil, `unknown query parameter "lang2"; this route reads only lang, cursor, limit, updated_after, status`},
		{"?LIMIT=1", 400, "invalid_parameter", nil, `"LIMIT"`},
		{"?updatedAfter=2000-01-01T00:00:00Z", 400, "invalid_parameter", nil, `"updatedAfter"`},
		{"?foo", 400, "invalid_parameter", nil, `"foo"`},
		{"?%zz=1", 400, "invalid_parameter", nil, "name is not valid percent-encoding"},
		{"?cxr_" + strings.Repeat("A", 40) + "=1", 400, "invalid_parameter", nil, "an unknown query parameter;"},
		{"?lang=RUS", 200, "", []string{"a", "b"}, ""},
		{"?lang=UKR", 200, "", []string{"a", "b"}, ""},
		{"?lang=eng", 400, "invalid_lang", nil, "lang"},
		{"?lang=DEU", 400, "invalid_lang", nil, "lang"},
		{"?lang=", 400, "invalid_lang", nil, "lang"},
		{"?lang=ENG&lang=RUS", 400, "invalid_lang", nil, "lang"},
		{"?limit=1", 200, "", []string{"a"}, ""},
		{"?limit=100", 200, "", []string{"a", "b"}, ""},
		{"?limit=01", 200, "", []string{"a"}, ""},
		{"?limit=0001", 200, "", []string{"a"}, ""},
		{"?limit=0000100", 200, "", []string{"a", "b"}, ""},
		{"?limit=0000", 400, "invalid_limit", nil, "limit"},
		{"?limit=0101", 400, "invalid_limit", nil, "limit"},
		{"?limit=0", 400, "invalid_limit", nil, "limit"},
		{"?limit=101", 400, "invalid_limit", nil, "limit"},
		{"?limit=-1", 400, "invalid_limit", nil, "limit"},
		{"?limit=%2B5", 400, "invalid_limit", nil, "limit"},
		{"?limit=1.5", 400, "invalid_limit", nil, "limit"},
		{"?limit=abc", 400, "invalid_limit", nil, "limit"},
		{"?limit=99999999999999999999", 400, "invalid_limit", nil, "limit"},
		{"?limit=%zz", 400, "invalid_limit", nil, "limit"},
		{"?status=active", 200, "", []string{"a"}, ""},
		{"?status=inactive", 200, "", []string{"b"}, ""},
		{"?status=sold", 400, "invalid_status", nil, "status"},
		{"?status=Active", 400, "invalid_status", nil, "status"},
		{"?updated_after=2000-01-01T00:00:00Z", 200, "", []string{"a", "b"}, ""},
		{"?updated_after=2000-01-01T02:00:00.5%2B02:00", 200, "", []string{"a", "b"}, ""},
		{"?updated_after=2000-01-01T02:00:00+02:00", 200, "", []string{"a", "b"}, ""}, // unencoded + arrives as a space
		{"?updated_after=2999-01-01T00:00:00Z", 200, "", []string{}, ""},
		{"?updated_after=2000-01-01t00:00:00z", 200, "", []string{"a", "b"}, ""},
		{"?updated_after=2000-01-01T00:00:00." + strings.Repeat("9", 300) + "Z", 200, "", []string{"a", "b"}, ""},
		{"?updated_after=2000-01-01T00:00:00%2B24:00", 400, "invalid_updated_after", nil, "-23:59 to +23:59"},
		{"?updated_after=2000-01-01T00:00:00%2B05:60", 400, "invalid_updated_after", nil, "-23:59 to +23:59"},
		{"?updated_after=2000-01-01T00:00:00,5Z", 200, "", []string{"a", "b"}, ""},
		// Java's OffsetDateTime and ZonedDateTime.toString() of a whole minute, as a query encoder sends them.
		{"?updated_after=2000-01-01T01:00%2B01:00", 200, "", []string{"a", "b"}, ""},
		{"?updated_after=2000-01-01T01:00%2B01:00%5BEurope%2FParis%5D", 200, "", []string{"a", "b"}, ""},
		{"?updated_after=2999-01-01T00:00Z%5BEtc%2FUTC%5D", 200, "", []string{}, ""},
		{"?updated_after=2000-01-01T00:00Z%5B%21Etc%2FUTC%5D", 400, "invalid_updated_after", nil, "RFC 9557"},
		{"?updated_after=2000-01-01T02:00:00%2B0200", 200, "", []string{"a", "b"}, ""},
		{"?updated_after=2999-01-01T02:00:00+0200", 200, "", []string{}, ""}, // unencoded + arrives as a space
		{"?updated_after=2000-01-01T00:00:00%2B050", 400, "invalid_updated_after", nil, "-23:59 to +23:59"},
		{"?updated_after=2000-01-01T00:00:00Z%20", 400, "invalid_updated_after", nil, "goes on after its time offset"},
		{"?updated_after=2000-01-01T00:00:00.Z", 400, "invalid_updated_after", nil, "2026-10-15T08:30:00.123456Z"},
		{"?updated_after=2026-01-01", 400, "invalid_updated_after", nil, "not a date alone"},
		{"?updated_after=2026-01-01T00:00:00", 400, "invalid_updated_after", nil, "needs a time offset"},
		{"?updated_after=1700000000", 400, "invalid_updated_after", nil, "updated_after"},
		{"?updated_after=", 400, "invalid_updated_after", nil, "updated_after"},
		{"?cursor=", 400, "invalid_cursor", nil, "cursor"},
		{"?cursor=abc", 400, "invalid_cursor", nil, "cursor"},
		{"?cursor=" + strings.Repeat("A", 5000), 400, "invalid_cursor", nil, "cursor"},
		{"?cursor=%FF%FE", 400, "invalid_cursor", nil, "cursor"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			r := e.get(t, owner, "/v1/export/items"+tt.query)
			if r.status != tt.status {
				t.Fatalf("GET %s = %d %s, want %d", tt.query, r.status, r.body, tt.status)
			}
			if tt.status != 200 {
				if r.env.Error == nil || r.env.Error.Code != tt.code || !strings.Contains(r.env.Error.Message, tt.wantText) {
					t.Errorf("GET %s error = %+v, want code %s naming %s", tt.query, r.env.Error, tt.code, tt.wantText)
				}
				return
			}
			ids := []string{}
			for _, it := range r.items(t) {
				ids = append(ids, it["id"].(string))
			}
			if diff := cmp.Diff(tt.wantIDs, ids); diff != "" {
				t.Errorf("GET %s ids (-want +got):\n%s", tt.query, diff)
			}
		})
	}
}

func TestUpdatedAfterIsStrict(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"), itemLine("b", "active", "B"))
	var ua string
	if err := e.pool.QueryRow(context.Background(), `SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
		FROM export_items WHERE id = 'a'`).Scan(&ua); err != nil {
		t.Fatal(err)
	}
	r := e.get(t, owner, "/v1/export/items?updated_after="+url.QueryEscape(ua))
	for _, it := range r.items(t) {
		if it["id"] == "a" || it["updated_at"].(string) <= ua {
			t.Errorf("GET updated_after=%s returned %v updated %v, want only items strictly after", ua, it["id"], it["updated_at"])
		}
	}
}

// updated_after is cut to microseconds, never rounded up, so an item stamped
// one microsecond later than the cut value is not lost.
func TestUpdatedAfterCutNotRounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"))
	if _, err := e.pool.Exec(context.Background(), `UPDATE export_items SET updated_at = '2026-11-21 17:23:37.000002+00'
		WHERE owner_id = $1`, owner); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		after string
		want  int
	}{
		{"2026-11-21T17:23:37.0000019999Z", 1},
		{"2026-11-21T19:23:37.000001999999999999999+02:00", 1},
		{"2026-11-21T17:23:37.000002Z", 0},
		{"2026-11-21T17:23:37.0000020001Z", 0},
	} {
		r := e.get(t, owner, "/v1/export/items?updated_after="+url.QueryEscape(tt.after))
		if got := len(r.items(t)); r.status != 200 || got != tt.want {
			t.Errorf("GET updated_after=%s = %d with %d items, want 200 with %d (item stamped .000002)", tt.after, r.status, got, tt.want)
		}
	}
}

func TestPaginationEachItemOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	owner := e.owner(t)
	other := e.owner(t)
	if _, err := catalog.Seed(ctx, e.pool, owner, 1000, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Seed(ctx, e.pool, other, 50, 4); err != nil {
		t.Fatal(err)
	}
	// Many equal updated_at values, so the id half of the keyset is tested too.
	if _, err := e.pool.Exec(ctx, `UPDATE export_items SET updated_at = date_trunc('second', updated_at) - (ascii(right(id, 1)) % 3) * interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	for _, status := range []string{"", "active"} {
		var want int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM export_items WHERE owner_id = $1 AND ($2 = '' OR status = $2)`, owner, status).Scan(&want); err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		var last string
		pages := 0
		q := url.Values{"limit": {"7"}}
		if status != "" {
			q.Set("status", status)
		}
		for {
			r := e.get(t, owner, "/v1/export/items?"+q.Encode())
			if r.status != 200 {
				t.Fatalf("page %d = %d %s", pages, r.status, r.body)
			}
			pages++
			items := r.items(t)
			for _, it := range items {
				// Ties are ordered by id in the database's collation, so only
				// updated_at is checked here; "each item once" checks the rest.
				key := it["updated_at"].(string)
				if key < last {
					t.Fatalf("page %d: %s after %s, want ascending updated_at", pages, key, last)
				}
				last = key
				seen[it["id"].(string)]++
				if status != "" && it["status"] != status {
					t.Fatalf("item %v has status %v under status=%s", it["id"], it["status"], status)
				}
			}
			if r.env.Meta.NextCursor == nil {
				if !bytes.Contains(r.body, []byte(`"next_cursor":null`)) {
					t.Errorf("last page meta = %s, want next_cursor null", r.body)
				}
				break
			}
			if len(items) != 7 {
				t.Fatalf("page %d has %d items and a next cursor, want 7", pages, len(items))
			}
			// lang and limit may change between pages.
			q.Set("cursor", *r.env.Meta.NextCursor)
			q.Set("lang", []string{"ENG", "RUS", "UKR"}[pages%3])
		}
		if len(seen) != want {
			t.Errorf("status=%q: saw %d distinct items, want %d", status, len(seen), want)
		}
		for id, n := range seen {
			if n != 1 || !strings.HasPrefix(id, "s3-") {
				t.Errorf("status=%q: item %s seen %d times, want once and of this owner", status, id, n)
			}
		}
		if wantPages := (want + 6) / 7; pages != wantPages && !(want%7 == 0 && pages == wantPages) {
			t.Errorf("status=%q: %d pages for %d items, want %d", status, pages, want, wantPages)
		}
	}
}

// Page sizes at their edges: the default is 25 (spec 8), and a last page
// that is exactly full has next_cursor null, with no empty page after it.
func TestPageSizes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	if _, err := catalog.Seed(context.Background(), e.pool, owner, 60, 5); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		limit string // "" for none
		want  []int  // the items on each page
	}{
		{"", []int{25, 25, 10}},
		{"20", []int{20, 20, 20}},
		{"60", []int{60}},
		{"59", []int{59, 1}},
		{"100", []int{60}},
	}
	for _, tt := range tests {
		t.Run("limit="+tt.limit, func(t *testing.T) {
			q := url.Values{}
			if tt.limit != "" {
				q.Set("limit", tt.limit)
			}
			var got []int
			for len(got) <= len(tt.want) { // one page more than wanted ends the loop too
				r := e.get(t, owner, "/v1/export/items?"+q.Encode())
				if r.status != 200 {
					t.Fatalf("page %d = %d %s", len(got)+1, r.status, r.body)
				}
				got = append(got, len(r.items(t)))
				if r.env.Meta.NextCursor == nil {
					break
				}
				q.Set("cursor", *r.env.Meta.NextCursor)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("pages of limit=%q hold %v items, want %v (the last with next_cursor null)", tt.limit, got, tt.want)
			}
		})
	}
}

func TestCursorRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner, other := e.owner(t), e.owner(t)
	var lines []string
	for _, id := range []string{"a", "b", "c", "d"} {
		lines = append(lines, itemLine(id, "active", id))
	}
	e.importLines(t, owner, lines...)
	e.importLines(t, other, lines...)
	const after = "2000-01-01T00:00:00Z"
	first := e.get(t, owner, "/v1/export/items?limit=1&status=active&updated_after="+after)
	if first.env.Meta.NextCursor == nil {
		t.Fatalf("first page %s has no cursor", first.body)
	}
	cur := *first.env.Meta.NextCursor
	raw, _ := base64.RawURLEncoding.DecodeString(strings.ReplaceAll(cur, ".", ""))
	flipped := func(i int) string { // the cursor with one byte changed, its dots kept
		b := bytes.Clone(raw)
		b[i] ^= 0x01
		enc := base64.RawURLEncoding.EncodeToString(b)
		return strings.Map(func(r rune) rune {
			if r == '.' {
				return r
			}
			r, enc = rune(enc[0]), enc[1:]
			return r
		}, cur)
	}
	tests := []struct {
		name, owner, query string
		want               int
	}{
		{"same query", owner, "status=active&updated_after=" + after + "&cursor=" + cur, 200},
		{"same instant, other offset; other lang and limit", owner, "status=active&lang=UKR&limit=3&updated_after=" + url.QueryEscape("2000-01-01T02:00:00+02:00") + "&cursor=" + cur, 200},
		{"same instant, to the minute", owner, "status=active&updated_after=" + url.QueryEscape("2000-01-01T02:00+0200") + "&cursor=" + cur, 200},
		{"flipped version byte", owner, "status=active&updated_after=" + after + "&cursor=" + flipped(0), 400},
		{"flipped timestamp byte", owner, "status=active&updated_after=" + after + "&cursor=" + flipped(5), 400},
		{"flipped id byte", owner, "status=active&updated_after=" + after + "&cursor=" + flipped(10), 400},
		{"flipped mac byte", owner, "status=active&updated_after=" + after + "&cursor=" + flipped(len(raw)-1), 400},
		{"truncated", owner, "status=active&updated_after=" + after + "&cursor=" + cur[:len(cur)-4], 400},
		{"padded base64", owner, "status=active&updated_after=" + after + "&cursor=" + cur + "%3D", 400},
		{"another owner", other, "status=active&updated_after=" + after + "&cursor=" + cur, 400},
		{"status dropped", owner, "updated_after=" + after + "&cursor=" + cur, 400},
		{"status changed", owner, "status=inactive&updated_after=" + after + "&cursor=" + cur, 400},
		{"updated_after dropped", owner, "status=active&cursor=" + cur, 400},
		{"updated_after changed", owner, "status=active&updated_after=2000-01-01T00:00:00.000001Z&cursor=" + cur, 400},
	}
	for _, tt := range tests {
		r := e.get(t, tt.owner, "/v1/export/items?"+tt.query)
		if r.status != tt.want {
			t.Errorf("%s: GET = %d %s, want %d", tt.name, r.status, r.body, tt.want)
			continue
		}
		if tt.want == 400 && (r.env.Error == nil || r.env.Error.Code != "invalid_cursor") {
			t.Errorf("%s: error = %+v, want invalid_cursor", tt.name, r.env.Error)
		}
	}
}

const fullLine = `{"id":"coin-1","coin_id":"K-7","status":"active","price":120.5,"currency":"UAH",` +
	`"category":{"id":"silver","name":"Silver"},"characteristics":{"metal":"silver","year":1780},` +
	`"images":[{"id":"i2","url":"https://img.test/2.jpg","position":2,"type":"reverse"},{"id":"i1","url":"https://img.test/1.jpg","position":1,"type":"obverse"}],` +
	`"texts":{"ENG":{"title":"Thaler","description":"Old thaler"},"RUS":{"title":"Талер"},"UKR":{"title":"Талер","description":"Старий талер"}}}`

func TestItem(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner, other := e.owner(t), e.owner(t)
	e.importLines(t, owner, fullLine, itemLine("bare", "inactive", "Bare"))
	e.importLines(t, other, itemLine("theirs", "active", "Theirs"))
	tests := []struct {
		path string
		want map[string]any // fields to check
	}{
		{"/v1/export/items/coin-1", map[string]any{"title": "Thaler", "description": "Old thaler", "status": "active", "stock_quantity": 1.0,
			"coin_id": "K-7", "price": 120.5, "currency": "UAH", "category": map[string]any{"id": "silver", "name": "Silver"},
			"characteristics": map[string]any{"metal": "silver", "year": 1780.0},
			"images": []any{
				map[string]any{"id": "i1", "url": "https://img.test/1.jpg", "position": 1.0, "type": "obverse"},
				map[string]any{"id": "i2", "url": "https://img.test/2.jpg", "position": 2.0, "type": "reverse"},
			}}},
		// RUS lacks a description: ENG's; UKR has both.
		{"/v1/export/items/coin-1?lang=RUS", map[string]any{"title": "Талер", "description": "Old thaler"}},
		{"/v1/export/items/coin-1?lang=UKR", map[string]any{"title": "Талер", "description": "Старий талер"}},
		// No translation at all: ENG; unknown fields are null or empty, never missing.
		{"/v1/export/items/bare?lang=UKR", map[string]any{"title": "Bare", "description": "", "status": "inactive", "stock_quantity": 0.0,
			"coin_id": nil, "price": nil, "category": nil, "characteristics": map[string]any{}, "images": []any{}}},
	}
	for _, tt := range tests {
		r := e.get(t, owner, tt.path)
		if r.status != 200 {
			t.Fatalf("GET %s = %d %s", tt.path, r.status, r.body)
		}
		var item map[string]any
		if err := json.Unmarshal(r.env.Data, &item); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"id", "coin_id", "status", "title", "description", "price", "currency", "stock_quantity", "category", "characteristics", "images", "updated_at"} {
			if _, ok := item[f]; !ok {
				t.Errorf("GET %s: field %s missing", tt.path, f)
			}
		}
		if ts, err := time.Parse(time.RFC3339Nano, item["updated_at"].(string)); err != nil || !strings.HasSuffix(item["updated_at"].(string), "Z") || len(item["updated_at"].(string)) != 27 {
			t.Errorf("GET %s: updated_at %v (%v), want RFC 3339 UTC with 6 fractional digits", tt.path, item["updated_at"], ts)
		}
		got := map[string]any{}
		for k := range tt.want {
			got[k] = item[k]
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("GET %s (-want +got):\n%s", tt.path, diff)
		}
	}

	// Missing and another owner's item: the same 404 apart from the request id.
	missing := e.get(t, owner, "/v1/export/items/nope")
	theirs := e.get(t, owner, "/v1/export/items/theirs")
	if missing.status != 404 || theirs.status != 404 || missing.env.Error.Code != "not_found" {
		t.Fatalf("missing = %d %s, theirs = %d %s, want 404 not_found", missing.status, missing.body, theirs.status, theirs.body)
	}
	if diff := cmp.Diff(missing.env.Error, theirs.env.Error); diff != "" {
		t.Errorf("404 bodies differ (-missing +theirs):\n%s", diff)
	}
	for _, path := range []string{"/v1/export/items/" + strings.Repeat("x", 200), "/v1/export/items/%FF", "/v1/export/items/a%00b"} {
		if r := e.get(t, owner, path); r.status != 404 {
			t.Errorf("GET %s = %d %s, want 404", path, r.status, r.body)
		}
	}
	if r := e.get(t, owner, "/v1/export/items/coin-1?lang=xx"); r.status != 400 || r.env.Error.Code != "invalid_lang" {
		t.Errorf("GET item lang=xx = %d %s, want 400 invalid_lang", r.status, r.body)
	}
	if r := e.get(t, owner, "/v1/export/items/coin-1?limit=1"); r.status != 400 || r.env.Error.Code != "invalid_parameter" ||
		!strings.Contains(r.env.Error.Message, "reads only lang ") {
		t.Errorf("GET item limit=1 = %d %s, want 400 invalid_parameter naming lang", r.status, r.body)
	}
	// The list of the other owner holds only its own item.
	r := e.get(t, other, "/v1/export/items")
	if items := r.items(t); len(items) != 1 || items[0]["id"] != "theirs" {
		t.Errorf("other owner's list = %s, want only theirs", r.env.Data)
	}
}

func TestAccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	tests := []struct {
		name    string
		prepare func(*http.Request)
		status  int
		code    string
	}{
		{"unsigned", nil, 401, "unauthenticated"},
		{"anonymous", e.sign("", identity.ScopeExportRead), 401, "unauthenticated"},
		{"write key", e.sign(owner, identity.ScopeSalesWrite), 403, "forbidden"},
		{"read key", e.sign(owner), 200, ""},
	}
	for _, tt := range tests {
		for _, path := range []string{"/v1/export/items", "/v1/export/items/x"} {
			r := e.do(t, path, tt.prepare)
			if path == "/v1/export/items/x" && tt.status == 200 {
				tt.status, tt.code = 404, "not_found"
			}
			if r.status != tt.status || (tt.code != "" && r.env.Error.Code != tt.code) {
				t.Errorf("%s: GET %s = %d %s, want %d %s", tt.name, path, r.status, r.body, tt.status, tt.code)
			}
		}
	}
}

// With PostgreSQL out of reach both routes answer 503 unavailable, an
// outage to retry, not the 500 of a bug.
func TestStoreOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.Pool(t, "postgres://postgres@"+testenv.RefusingAddr(t)+"/postgres?connect_timeout=2")
	e := serve(t, pool, signer)
	owner := "00000000-0000-4000-8000-000000000001"
	for _, path := range []string{"/v1/export/items", "/v1/export/items/x"} {
		r := e.get(t, owner, path)
		wantUnavailable(t, r, "GET "+path+" with PostgreSQL down")
	}
}

// A read PostgreSQL answers it cannot do now is 503 unavailable with
// Retry-After, not the 500 of a bug: on a replica (READ_DATABASE_URL) a
// query cancelled by its conflict with the replay of the primary's changes
// (SQLSTATE 40001, seen in the replica drill of the README), here a read
// behind an operator's lock past lock_timeout (55P03), which a test can
// make without a standby. The barrier of a first page is not what gives up
// (that is its own 503, sync barrier gave up): the page's query does.
func TestStoreThatCannotReadNowIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, testenv.PostgresURL(t)+" lock_timeout=50")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := serve(t, pool, signer)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("coin-1", "active", "Coin"))
	tx := testenv.InTransaction(t, pool, "LOCK TABLE export_items IN ACCESS EXCLUSIVE MODE")
	defer tx.Rollback(ctx)
	for _, path := range []string{"/v1/export/items", "/v1/export/items/coin-1"} {
		r := e.get(t, owner, path)
		wantUnavailable(t, r, "GET "+path+" behind a lock past lock_timeout")
	}
	if logs := e.logs.String(); !strings.Contains(logs, "export store unavailable") || !strings.Contains(logs, "55P03") {
		t.Errorf("the log does not name the store's refusal and its SQLSTATE:\n%s", logs)
	}
}

func TestGzip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	owner := e.owner(t)
	if _, err := catalog.Seed(ctx, e.pool, owner, 30, 1); err != nil {
		t.Fatal(err)
	}
	plain := e.get(t, owner, "/v1/export/items?limit=30")
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/export/items?limit=30", nil)
	e.sign(owner)(req)
	req.Header.Set("Accept-Encoding", "br;q=1, gzip;q=0.8")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding = %q, want gzip", resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	// Same page apart from the request id (each request has its own).
	strip := func(b []byte) string { return string(b[:bytes.Index(b, []byte(`"meta"`))]) }
	if strip(body) != strip(plain.body) {
		t.Errorf("gunzipped body differs from the plain one")
	}
	req.Header.Set("Accept-Encoding", "gzip;q=0")
	resp2, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.Header.Get("Content-Encoding") != "" {
		t.Errorf("gzip;q=0: Content-Encoding = %q, want none", resp2.Header.Get("Content-Encoding"))
	}
}

// The import no longer issues an id with a slash (catalog.ValidItemID), but a
// row imported before the rule keeps it; the reader does not refuse such an
// id, and a request that reaches it with %2F sees one segment.
func TestItemIDWithSlash(t *testing.T) {
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("lot-7", "active", "Slashed"))
	if _, err := e.pool.Exec(context.Background(), `UPDATE export_items SET id = 'lot/7',
		doc_eng = replace(doc_eng, '"lot-7"', '"lot/7"'), doc_rus = replace(doc_rus, '"lot-7"', '"lot/7"'),
		doc_ukr = replace(doc_ukr, '"lot-7"', '"lot/7"') WHERE owner_id = $1`, owner); err != nil {
		t.Fatal(err)
	}
	r := e.get(t, owner, "/v1/export/items/lot%2F7")
	if r.status != http.StatusOK || !strings.Contains(string(r.env.Data), `"id":"lot/7"`) {
		t.Fatalf("GET lot%%2F7 = %d %s, want 200 with item lot/7", r.status, r.body)
	}
}

// A HEAD answer has its GET's headers (RFC 9110 9.3.2), compressed or
// not: the same Content-Encoding and the Content-Length of the body the
// GET sends, so that the gateway's client, and any other, knows there is
// no body to wait for.
func TestHeadHasTheHeadersOfItsGet(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	if _, err := catalog.Seed(context.Background(), e.pool, owner, 30, 1); err != nil {
		t.Fatal(err)
	}
	// One request id for the GET and the HEAD: the body holds it, and the
	// length of a compressed body depends on it.
	sign := e.signAs(identity.Identity{OwnerID: owner, KeyID: "k1", Scopes: []string{identity.ScopeExportRead}, RequestID: httpserver.RandomRequestID()})
	for _, encoding := range []string{"gzip", "identity"} {
		answer := func(method string) (*http.Response, []byte) {
			req, _ := http.NewRequest(method, e.srv.URL+"/v1/export/items?limit=30", nil)
			sign(req)
			req.Header.Set("Accept-Encoding", encoding) // set by hand: the client leaves the body as sent
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return resp, body
		}
		get, getBody := answer(http.MethodGet)
		head, headBody := answer(http.MethodHead)
		if get.StatusCode != http.StatusOK || get.ContentLength != int64(len(getBody)) {
			t.Fatalf("Accept-Encoding %q: GET = %d, Content-Length %d for a body of %d bytes", encoding, get.StatusCode, get.ContentLength, len(getBody))
		}
		if head.StatusCode != http.StatusOK || len(headBody) != 0 || head.ContentLength != get.ContentLength ||
			head.Header.Get("Content-Encoding") != get.Header.Get("Content-Encoding") {
			t.Errorf("Accept-Encoding %q: HEAD = %d, Content-Encoding %q, Content-Length %d, %d body bytes; GET had %q, %d",
				encoding, head.StatusCode, head.Header.Get("Content-Encoding"), head.ContentLength, len(headBody),
				get.Header.Get("Content-Encoding"), get.ContentLength)
		}
		if wantGzip := encoding == "gzip"; (get.Header.Get("Content-Encoding") == "gzip") != wantGzip {
			t.Errorf("Accept-Encoding %q: GET's Content-Encoding %q", encoding, get.Header.Get("Content-Encoding"))
		}
	}
}

// A cursor signed with another secret is refused as any bad cursor is, and
// the reader's log says, once per interval, that a signature did not match:
// the one trace of readers holding different CURSOR_SECRETs (an ops probe
// found only INFO access lines). A malformed cursor says nothing of it.
func TestCursorOfAnotherSecretIsWarnedOf(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("a", "active", "A"))
	if r := e.get(t, owner, "/v1/export/items?cursor=abc"); r.status != 400 || strings.Contains(e.logs.String(), "cursor refused") {
		t.Fatalf("malformed cursor = %d, logs %s; want 400 and no signature warning", r.status, e.logs.String())
	}
	other, err := cursor.New(cursorSecret + "-of-another-reader")
	if err != nil {
		t.Fatal(err)
	}
	foreign := other.Encode(cursor.Position{UpdatedAt: time.Now(), ID: "a", Sync: 7}, cursor.Binding{OwnerID: owner})
	for range 2 {
		if r := e.get(t, owner, "/v1/export/items?cursor="+foreign); r.status != 400 || r.env.Error == nil || r.env.Error.Code != "invalid_cursor" {
			t.Fatalf("cursor of another secret = %d %s, want 400 invalid_cursor", r.status, r.body)
		}
	}
	if got := strings.Count(e.logs.String(), `"level":"WARN","msg":"cursor refused: its signature does not match CURSOR_SECRET`); got != 1 {
		t.Errorf("signature warnings = %d, want 1 (the second held back):\n%s", got, e.logs.String())
	}
}

// A GET by id traced by its request id names the item asked for: a 404
// says which one was missing. A key pasted as an id is not recorded.
func TestItemAccessLineNamesTheItem(t *testing.T) {
	e := newEnv(t)
	owner := e.owner(t)
	apiKey, _, err := apikey.Generate([]string{identity.ScopeExportRead})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{
		{"no-such-coin", `"item_id":"no-such-coin"`},
		{"caf%C3%A9", `"item_id":"café"`},
		{apiKey, `"item_id":"[holds an API key]"`},
	} {
		if r := e.get(t, owner, "/v1/export/items/"+tc.id); r.status != 404 {
			t.Fatalf("GET %s = %d, want 404", tc.id, r.status)
		}
		lines := strings.Split(strings.TrimSpace(e.logs.String()), "\n")
		if last := lines[len(lines)-1]; !strings.Contains(last, `"error_code":"not_found"`) || !strings.Contains(last, tc.want) {
			t.Errorf("access line of GET %.12s… = %s, want not_found and %s", tc.id, last, tc.want)
		}
	}
	if strings.Contains(e.logs.String(), apiKey) {
		t.Errorf("the log holds the API key:\n%s", e.logs.String())
	}
}

// Behind PgBouncer (README, "Behind PgBouncer"), PostgreSQL refusing new
// sessions (a password changed; here the role made NOLOGIN, as the test
// clusters trust every login) reaches the reader as PgBouncer's own error,
// SQLSTATE 08P01 ("server login has been failing", "query_wait_timeout"):
// the page is 503 unavailable with Retry-After, its log line naming the
// pooler, as without a pooler, not the 500 of a client's protocol
// violation that 08P01 is when PostgreSQL sends it.
func TestPostgreSQLRefusingThePoolerIsUnavailable(t *testing.T) {
	t.Parallel()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	admin := testenv.Pool(t, url)
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	role := "pooled_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	exec("CREATE ROLE " + role + " LOGIN SUPERUSER")
	endSessions := "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + role + "'"
	t.Cleanup(func() { exec(endSessions); exec("DROP ROLE " + role) })
	pooled := testenv.Pool(t, testenv.PgBouncer(t, url+" user="+role, "session", "query_wait_timeout = 1"))
	e := serve(t, pooled, signer)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("coin-1", "active", "Coin"))
	exec("ALTER ROLE " + role + " NOLOGIN")
	exec(endSessions)
	// The first reads may meet the server connection ended: 503 too.
	for try := 0; !strings.Contains(e.logs.String(), `"cause":"the pooler in front of PostgreSQL`); try++ {
		if try == 10 {
			t.Fatalf("no read met the pooler's refusal (08P01) in 10 tries:\n%s", e.logs.String())
		}
		wantUnavailable(t, e.get(t, owner, "/v1/export/items/coin-1"), "GET with PostgreSQL refusing the pooler's logins")
		if t.Failed() {
			t.Fatalf("its log:\n%s", e.logs.String())
		}
	}
}

// wantUnavailable fails unless r is the 503 unavailable envelope with
// Retry-After: 1; what names the call and its condition.
func wantUnavailable(t *testing.T, r response, what string) {
	t.Helper()
	if r.status != http.StatusServiceUnavailable || r.env.Error == nil || r.env.Error.Code != "unavailable" {
		t.Errorf("%s = %d %s, want 503 unavailable", what, r.status, r.body)
	}
	if got := r.header.Get("Retry-After"); got != "1" {
		t.Errorf("%s: Retry-After = %q, want 1", what, got)
	}
}

// A password changed under a running reader (rotated in PostgreSQL before
// DATABASE_URL) refuses each new connection, SQLSTATE 28P01, on a cluster
// that asks for it: the page is 503 unavailable, its log line says what
// the operator must do, neither the log nor the answer holds a password,
// and once the password is set back the same read passes, with no
// restart.
func TestPasswordChangedUnderTheReaderIsUnavailable(t *testing.T) {
	t.Parallel()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	role := testenv.PasswordCluster(t)
	e := serve(t, testenv.Pool(t, role.DSN), signer)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("coin-1", "active", "Coin"))
	restore := role.ChangePassword(t)
	e.pool.Reset() // its sessions serve on: the next read connects anew
	for _, path := range []string{"/v1/export/items", "/v1/export/items/coin-1"} {
		r := e.get(t, owner, path)
		wantUnavailable(t, r, "GET "+path+" with the password changed")
		if bytes.Contains(r.body, []byte(role.Password)) {
			t.Errorf("GET %s with the password changed: the answer holds the password: %s", path, r.body)
		}
	}
	logs := e.logs.String()
	if !strings.Contains(logs, `"msg":"export store unavailable"`) || !strings.Contains(logs, "28P01") ||
		!strings.Contains(logs, `"cause":"PostgreSQL refused the password of DATABASE_URL's role`) {
		t.Errorf("the log does not name the refusal, its SQLSTATE and what to do:\n%s", logs)
	}
	if strings.Contains(logs, role.Password) {
		t.Errorf("the log holds the password:\n%s", logs)
	}
	restore()
	if r := e.get(t, owner, "/v1/export/items/coin-1"); r.status != http.StatusOK {
		t.Errorf("GET once the password is set back = %d %s, want 200", r.status, r.body)
	}
}

// A database renamed (or dropped) under a running reader refuses each new
// connection, SQLSTATE 3D000: the page is 503 unavailable with
// Retry-After, not the 500 of a bug, its log line says what the operator
// must do, and once the database is back the same read passes, with no
// restart.
func TestDatabaseRenamedUnderTheReaderIsUnavailable(t *testing.T) {
	t.Parallel()
	signer, err := identity.NewSigner(identitySecret)
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.PostgresURL(t)
	e := serve(t, testenv.Pool(t, url), signer)
	owner := e.owner(t)
	e.importLines(t, owner, itemLine("coin-1", "active", "Coin"))
	restore := testenv.RenameDatabase(t, url)
	for _, path := range []string{"/v1/export/items", "/v1/export/items/coin-1"} {
		r := e.get(t, owner, path)
		wantUnavailable(t, r, "GET "+path+" with the database renamed")
	}
	if logs := e.logs.String(); !strings.Contains(logs, `"msg":"export store unavailable"`) || !strings.Contains(logs, "3D000") ||
		!strings.Contains(logs, `"cause":"DATABASE_URL's database does not exist`) {
		t.Errorf("the log does not name the refusal, its SQLSTATE and what to do:\n%s", logs)
	}
	restore()
	if r := e.get(t, owner, "/v1/export/items/coin-1"); r.status != http.StatusOK {
		t.Errorf("GET once the database is back = %d %s, want 200", r.status, r.body)
	}
}
