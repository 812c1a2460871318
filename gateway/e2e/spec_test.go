package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The contract's rules of what a client reads (spec 1, 2.2, 2.3, 3, 4.3),
// checked of what it gets through the gateway from the real services: the
// services' own tests hold each rule of one service alone (SPEC-MAP.md),
// TestOpenAPIDescribesTheStack the shape of each answer; these hold the
// rules no schema can say (order, defaults, filters, languages, stock
// following status and sales) end to end, and the sale routes' limits of
// spec 8 at both ends.
func TestContractRulesThroughTheStack(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool) // 50 seeded items, about 15 % inactive
	importLine(t, pool, fx.owner, thalerLine)
	other := otherOwner(t, pool) // whose items must never show
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))

	t.Run("list", func(t *testing.T) { checkListRules(t, s, fx, other, pool) })
	t.Run("languages", func(t *testing.T) { checkLanguages(t, s, fx) })
	t.Run("sale", func(t *testing.T) { checkSaleReachesEveryConsumer(t, s, fx, pool) })
	t.Run("limits", func(t *testing.T) { checkSaleLimits(t, s, fx) })
}

// thalerLine is an item whose every field is known: translations, a
// category, images given out of their order.
const thalerLine = `{"id":"thaler","coin_id":"K-7","status":"active","price":120.5,"currency":"UAH",` +
	`"category":{"id":"silver"},"characteristics":{"metal":"silver","year":1780},` +
	`"images":[{"id":"i2","url":"https://img.test/2.jpg","position":2,"type":"reverse"},{"id":"i1","url":"https://img.test/1.jpg","position":1,"type":"obverse"}],` +
	`"texts":{"ENG":{"title":"Thaler","description":"Old thaler"},"RUS":{"title":"Талер RUS"},"UKR":{"title":"Талер UKR","description":"Старий талер"}}}`

// otherOwner is a second owner with seeded items and a read key of its own.
func otherOwner(t *testing.T, pool *pgxpool.Pool) fixture {
	t.Helper()
	var owner string
	if err := pool.QueryRow(context.Background(), "INSERT INTO owners (name) VALUES ('e2e-other') RETURNING id::text").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Seed(context.Background(), pool, owner, 20, 2); err != nil {
		t.Fatal(err)
	}
	return fixture{owner: owner, readKey: addKey(t, pool, owner, nil, "export:read")}
}

func importLine(t *testing.T, pool *pgxpool.Pool, owner, line string) {
	t.Helper()
	items, err := catalog.ParseJSONL(strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Import(context.Background(), pool, owner, items); err != nil {
		t.Fatal(err)
	}
}

// exportItem is an item as a client decodes it; fields holds every member
// given, to tell a null from a missing one.
type exportItem struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	Title         string `json:"title"`
	Description   string `json:"description"`
	StockQuantity int    `json:"stock_quantity"`
	UpdatedAt     string `json:"updated_at"`
	Images        []struct {
		ID       string `json:"id"`
		URL      string `json:"url"`
		Position int    `json:"position"`
		Type     string `json:"type"`
	} `json:"images"`
	fields map[string]json.RawMessage
}

// page is one answer of the list route: its status, items and next cursor.
type page struct {
	status int
	code   string
	items  []exportItem
	next   *string
}

func getPage(t *testing.T, s *stack, key, query string) page {
	t.Helper()
	status, env, _ := call(t, "GET", s.baseURL+"/export/items?"+query, key, "", nil)
	p := page{status: status, next: env.Meta.NextCursor}
	if env.Error != nil {
		p.code = env.Error.Code
		return p
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(env.Data, &raw); err != nil {
		t.Fatalf("GET ?%s: data %s is not a list: %v", query, env.Data, err)
	}
	for _, r := range raw {
		var it exportItem
		if err := json.Unmarshal(r, &it); err != nil || json.Unmarshal(r, &it.fields) != nil {
			t.Fatalf("GET ?%s: item %s: %v", query, r, err)
		}
		p.items = append(p.items, it)
	}
	return p
}

// syncAll follows next_cursor from the first page of query, changing lang
// from page to page, and returns every item read.
func syncAll(t *testing.T, s *stack, key string, query url.Values) []exportItem {
	t.Helper()
	var items []exportItem
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatalf("sync %s: over 100 pages", query.Encode())
		}
		p := getPage(t, s, key, query.Encode())
		if p.status != 200 {
			t.Fatalf("sync %s, page %d = %d %s", query.Encode(), pages+1, p.status, p.code)
		}
		items = append(items, p.items...)
		if p.next == nil {
			return items
		}
		query.Set("cursor", *p.next) // unchanged, as spec 4.3 says
		query.Set("lang", catalog.Languages[pages%len(catalog.Languages)])
	}
}

// idsInOrder is the owner's items as the contract orders them, (updated_at,
// id), and filtered by where (a condition on status and updated_at).
func idsInOrder(t *testing.T, pool *pgxpool.Pool, owner, where string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM export_items WHERE owner_id = $1 AND `+where+` ORDER BY updated_at, id`,
		append([]any{owner}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func idsOf(items []exportItem) []string {
	ids := []string{}
	for _, it := range items {
		ids = append(ids, it.ID)
	}
	return ids
}

// checkListRules: a sync reads each of the owner's items once, in (updated_at,
// id) order, and none of another owner's; limit defaults to 25; status and
// updated_after filter; every item has the fields of spec 2.2, stock 1
// exactly when active, and images ordered by position.
func checkListRules(t *testing.T, s *stack, fx, other fixture, pool *pgxpool.Pool) {
	all := idsInOrder(t, pool, fx.owner, "true")
	if len(all) <= 25 {
		t.Fatalf("the fixture has %d items, want over 25 to see the default page size", len(all))
	}
	items := syncAll(t, s, fx.readKey, url.Values{"limit": {"7"}})
	if got := idsOf(items); !slices.Equal(got, all) {
		t.Errorf("a sync by 7 read %d items %v,\nwant the owner's %d in (updated_at, id) order %v", len(got), got, len(all), all)
	}
	theirs := idsInOrder(t, pool, other.owner, "true")
	if got := idsOf(syncAll(t, s, other.readKey, url.Values{})); !slices.Equal(got, theirs) {
		t.Errorf("the other owner's sync read %v, want its own %v", got, theirs)
	}
	for _, it := range items {
		checkItem(t, it)
	}

	first := getPage(t, s, fx.readKey, "")
	if first.status != 200 || len(first.items) != 25 || first.next == nil {
		t.Errorf("GET /export/items = %d with %d items, cursor %v; want 200, the default 25 items and a next cursor", first.status, len(first.items), first.next)
	}
	for _, status := range []string{"active", "inactive"} {
		want := idsInOrder(t, pool, fx.owner, "status = $2", status)
		if got := idsOf(syncAll(t, s, fx.readKey, url.Values{"status": {status}, "limit": {"10"}})); !slices.Equal(got, want) {
			t.Errorf("status=%s read %v, want %v", status, got, want)
		}
	}
	// updated_after is strict: the item stamped at the instant given is left out.
	middle := items[len(items)/2]
	want := idsInOrder(t, pool, fx.owner, "updated_at > $2", mustTime(t, middle.UpdatedAt))
	if got := idsOf(syncAll(t, s, fx.readKey, url.Values{"updated_after": {middle.UpdatedAt}, "limit": {"10"}})); !slices.Equal(got, want) || slices.Contains(got, middle.ID) {
		t.Errorf("updated_after=%s (item %s's updated_at) read %v, want %v", middle.UpdatedAt, middle.ID, got, want)
	}
	for _, bad := range []struct{ query, code string }{
		{"limit=0", "invalid_limit"}, {"limit=101", "invalid_limit"}, {"lang=DEU", "invalid_lang"},
		{"status=sold", "invalid_status"}, {"updated_after=2026-01-01", "invalid_updated_after"}, {"cursor=x", "invalid_cursor"},
	} {
		if p := getPage(t, s, fx.readKey, bad.query); p.status != 400 || p.code != bad.code {
			t.Errorf("GET ?%s = %d %s, want 400 %s", bad.query, p.status, p.code, bad.code)
		}
	}
}

// specFields are the members of spec 2.2, every one always present.
var specFields = []string{"id", "coin_id", "status", "title", "description", "price", "currency", "stock_quantity",
	"category", "characteristics", "images", "updated_at"}

func checkItem(t *testing.T, it exportItem) {
	t.Helper()
	for _, f := range specFields {
		if _, ok := it.fields[f]; !ok {
			t.Errorf("item %s has no %s", it.ID, f)
		}
	}
	if want := map[string]int{"active": 1, "inactive": 0}[it.Status]; it.StockQuantity != want {
		t.Errorf("item %s is %s with stock_quantity %d, want %d", it.ID, it.Status, it.StockQuantity, want)
	}
	for i, img := range it.Images {
		if i > 0 && img.Position <= it.Images[i-1].Position {
			t.Errorf("item %s: image %s at position %d follows position %d, want images ordered by position", it.ID, img.ID, img.Position, it.Images[i-1].Position)
		}
		if !strings.HasPrefix(img.URL, "https://") || !slices.Contains(catalog.ImageTypes, img.Type) {
			t.Errorf("item %s: image %+v, want an https URL and a type of spec 2.3", it.ID, img)
		}
	}
	mustTime(t, it.UpdatedAt)
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("updated_at %q is not an RFC 3339 date-time: %v", s, err)
	}
	return ts
}

// checkLanguages: title and description are those of lang, ENG when lang is
// not given, on the list and the item route alike; a missing translation
// falls back to ENG.
func checkLanguages(t *testing.T, s *stack, fx fixture) {
	for _, tc := range []struct{ lang, title, description string }{
		{"", "Thaler", "Old thaler"},
		{"ENG", "Thaler", "Old thaler"},
		{"RUS", "Талер RUS", "Old thaler"},
		{"UKR", "Талер UKR", "Старий талер"},
	} {
		query := url.Values{"limit": {"100"}}
		if tc.lang != "" {
			query.Set("lang", tc.lang)
		}
		p := getPage(t, s, fx.readKey, query.Encode())
		i := slices.IndexFunc(p.items, func(it exportItem) bool { return it.ID == "thaler" })
		if p.status != 200 || i < 0 {
			t.Fatalf("GET ?%s = %d without the item thaler", query.Encode(), p.status)
		}
		itemQuery := ""
		if tc.lang != "" {
			itemQuery = "?lang=" + tc.lang
		}
		var item exportItem
		status, env, _ := call(t, "GET", s.baseURL+"/export/items/thaler"+itemQuery, fx.readKey, "", nil)
		if status != 200 || json.Unmarshal(env.Data, &item) != nil {
			t.Fatalf("GET thaler, lang %q = %d %s", tc.lang, status, env.Data)
		}
		for route, it := range map[string]exportItem{"list": p.items[i], "item": item} {
			if it.Title != tc.title || it.Description != tc.description {
				t.Errorf("%s route, lang %q: title %q, description %q; want %q, %q", route, tc.lang, it.Title, it.Description, tc.title, tc.description)
			}
			if len(it.Images) != 2 || it.Images[0].ID != "i1" || it.Images[1].ID != "i2" {
				t.Errorf("%s route: images %+v, want i1 then i2 (by position)", route, it.Images)
			}
		}
	}
}

// checkSaleReachesEveryConsumer: a confirmed sale shows the item inactive
// with stock 0, stamped later, to every read key of the owner (the item
// route, an updated_after sync, filtered by status or not, and a sync that
// was under way, ARCHITECTURE "Data"), and its cancel restores it (spec 1, 3).
func checkSaleReachesEveryConsumer(t *testing.T, s *stack, fx fixture, pool *pgxpool.Pool) {
	consumers := []string{fx.readKey, addKey(t, pool, fx.owner, nil, "export:read")}
	id := itemOfStatus(t, s, fx, "active")
	before := readItem(t, s, consumers[0], id)
	// A sync under way: its first page has read the item, still active.
	underway := getPage(t, s, consumers[0], "limit=10")
	if !slices.ContainsFunc(underway.items, func(it exportItem) bool { return it.ID == id }) || underway.next == nil {
		t.Fatalf("the first page of 10 holds %v, cursor %v; want the first active item %s and a next page", idsOf(underway.items), underway.next, id)
	}

	sale := func(op, idempotencyKey string) map[string]any {
		t.Helper()
		status, env, _ := call(t, "POST", s.baseURL+"/export/items/"+id+"/sales/"+op, fx.writeKey,
			`{"external_order_id":"spec-order-1"}`, map[string]string{"Idempotency-Key": idempotencyKey})
		var result map[string]any
		if status != 200 || json.Unmarshal(env.Data, &result) != nil {
			t.Fatalf("%s %s = %d %+v", op, id, status, env.Error)
		}
		return result
	}
	steps := []struct {
		op, status string
		stock      int
		stamp      string // the result's member that is the item's new updated_at, if it is one
	}{
		{"confirm", "inactive", 0, "confirmed_at"},
		{"cancel", "active", 1, ""},
	}
	checkpoint := before.UpdatedAt
	for _, st := range steps {
		result := sale(st.op, "spec-"+st.op+"-1")
		if result["status"] != st.status || result["stock_quantity"] != float64(st.stock) || result["platform_id"] != "e2e-market" ||
			result["external_order_id"] != "spec-order-1" || result["idempotent_replay"] != false {
			t.Errorf("%s result = %v, want %s, stock %d, platform e2e-market, order spec-order-1, not a replay", st.op, result, st.status, st.stock)
		}
		for n, key := range consumers {
			got := readItem(t, s, key, id)
			if got.Status != st.status || got.StockQuantity != st.stock || got.UpdatedAt <= checkpoint {
				t.Errorf("after %s, consumer %d reads %s %s stock %d updated %s; want %s stock %d, updated after %s",
					st.op, n+1, id, got.Status, got.StockQuantity, got.UpdatedAt, st.status, st.stock, checkpoint)
			}
			if st.stamp != "" && result[st.stamp] != got.UpdatedAt {
				t.Errorf("after %s: %s %v, the item's updated_at %s; want them equal", st.op, st.stamp, result[st.stamp], got.UpdatedAt)
			}
			synced := syncAll(t, s, key, url.Values{"updated_after": {checkpoint}, "lang": {"UKR"}})
			i := slices.IndexFunc(synced, func(it exportItem) bool { return it.ID == id })
			if i < 0 || synced[i].Status != st.status || synced[i].StockQuantity != st.stock {
				t.Errorf("after %s, consumer %d's sync from %s read %v, want %s %s with stock %d", st.op, n+1, checkpoint, idsOf(synced), id, st.status, st.stock)
			}
		}
		if st.op == "confirm" { // the sync under way reads the item again, sold: it moved behind the cursor
			rest := syncAll(t, s, consumers[0], url.Values{"limit": {"10"}, "cursor": {*underway.next}})
			i := slices.IndexFunc(rest, func(it exportItem) bool { return it.ID == id })
			if i < 0 || rest[i].Status != "inactive" || rest[i].StockQuantity != 0 {
				t.Errorf("the sync under way read on after the confirm: %v, want %s again, inactive with stock 0", idsOf(rest), id)
			}
		}
		// The status filter reads the exported status, the sale's included.
		for _, filter := range []string{"active", "inactive"} {
			filtered := syncAll(t, s, fx.readKey, url.Values{"updated_after": {checkpoint}, "status": {filter}})
			if listed := slices.ContainsFunc(filtered, func(it exportItem) bool { return it.ID == id }); listed != (filter == st.status) {
				t.Errorf("after %s, status=%s sync from %s lists %s: %v, want %v", st.op, filter, checkpoint, id, listed, filter == st.status)
			}
		}
		checkpoint = readItem(t, s, consumers[0], id).UpdatedAt
	}
}

func readItem(t *testing.T, s *stack, key, id string) exportItem {
	t.Helper()
	status, env, _ := call(t, "GET", s.baseURL+"/export/items/"+url.PathEscape(id), key, "", nil)
	var it exportItem
	if status != 200 || json.Unmarshal(env.Data, &it) != nil {
		t.Fatalf("GET item %s = %d %+v", id, status, env.Error)
	}
	return it
}

// checkSaleLimits: spec 8's bounds of the sale routes are inclusive end to
// end. An Idempotency-Key of 128 characters and an external_order_id of 128
// characters (two bytes each in UTF-8: the bound counts characters) pass
// the gateway, which signs the key into the identity it forwards, and the
// writer, and come back as sent; quantity 1 may be given, and a key of one
// character serves the cancel. 129 of either is refused 400. The writer's
// TestLimitsAreInclusive holds the same bounds without the gateway.
func checkSaleLimits(t *testing.T, s *stack, fx fixture) {
	target := s.baseURL + "/export/items/" + url.PathEscape(itemOfStatus(t, s, fx, "active")) + "/sales/"
	longKey, longOrder := strings.Repeat("k", 128), strings.Repeat("é", 128)
	body := func(order string) string { return `{"external_order_id":"` + order + `","quantity":1}` }

	wantError(t, "POST", target+"confirm", fx.writeKey, longKey+"k", body(longOrder), 400, "invalid_idempotency_key")
	wantError(t, "POST", target+"confirm", fx.writeKey, longKey, body(longOrder+"é"), 400, "invalid_body")
	for _, c := range []struct{ op, idempotencyKey, status string }{
		{"confirm", longKey, "inactive"},
		{"cancel", "c", "active"},
	} {
		for _, replay := range []bool{false, true} {
			got := wantSale(t, "POST", target+c.op, fx.writeKey, body(longOrder), key(c.idempotencyKey))
			if got.ExternalOrderID != longOrder || got.Status != c.status || got.IdempotentReplay != replay {
				t.Errorf("%s with a %d-character Idempotency-Key (replay %v) = %+v, want order %q, %s, idempotent_replay %v",
					c.op, len(c.idempotencyKey), replay, got, longOrder, c.status, replay)
			}
		}
	}
}
