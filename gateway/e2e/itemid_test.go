package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/catalog"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Item ids with characters that mean something in a URL travel as one
// percent-encoded path segment (%3F, %23, %25, %20, UTF-8 bytes): every one
// the import accepts must be readable and sellable through the gateway, and
// come back as the stored id. So must ids holding the characters a path
// segment carries unescaped, which url.PathEscape leaves as they are: "+"
// (a space only in a form-encoded query, never in a path: a layer that
// decoded the path as a query would read "a b"), "&", "=", ":", "@", "$";
// and ";" and ",", which it escapes, and some routers read as parameters
// of the segment once decoded.
func TestItemIDsThatNeedEncodingWorkThroughTheStack(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	ids := []string{
		"what?",
		"q?lang=RUS",
		"#1",
		"tag#frag",
		"100%",
		"a%2Fb",   // a "/" once decoded: a second decoding would split the segment
		"a%3Fb",   // a "?" once decoded
		"coin 17", // space
		"Талер-1780",
		"ünï ?#% mix",
		"a+b",
		"+",
		"a&b=c",
		"x:y@z",
		"$1",
		"a;b=1",
		"a,b",
	}
	importItems(t, pool, fx.owner, ids)
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))

	for i, id := range ids {
		t.Run(id, func(t *testing.T) {
			item := s.baseURL + "/export/items/" + url.PathEscape(id)
			status, got, _ := call(t, "GET", item, fx.readKey, "", nil)
			var data struct{ ID string }
			if status != 200 || json.Unmarshal(got.Data, &data) != nil || data.ID != id {
				t.Errorf("GET %s = %d %+v, data %s; want 200 with id %q", item, status, got.Error, got.Data, id)
			}
			body := fmt.Sprintf(`{"external_order_id":"e2e-order-%d"}`, i)
			for _, op := range []string{"confirm", "cancel"} {
				key := map[string]string{"Idempotency-Key": fmt.Sprintf("e2e-%s-%d", op, i)}
				status, got, _ := call(t, "POST", item+"/sales/"+op, fx.writeKey, body, key)
				var sale struct {
					ItemID string `json:"item_id"`
				}
				if status != 200 || json.Unmarshal(got.Data, &sale) != nil || sale.ItemID != id {
					t.Errorf("POST %s/sales/%s = %d %+v, data %s; want 200 with item_id %q", item, op, status, got.Error, got.Data, id)
				}
			}
		})
	}
}

// importItems imports one active item per id for owner through the import
// format, so each id passes the import's own check (catalog.ValidItemID).
func importItems(t *testing.T, pool *pgxpool.Pool, owner string, ids []string) {
	t.Helper()
	var lines strings.Builder
	for _, id := range ids {
		quoted, _ := json.Marshal(id)
		fmt.Fprintf(&lines, `{"id":%s,"status":"active","currency":"EUR","texts":{"ENG":{"title":"T"}}}`+"\n", quoted)
	}
	items, err := catalog.ParseJSONL(strings.NewReader(lines.String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Import(context.Background(), pool, owner, items); err != nil {
		t.Fatal(err)
	}
}

// A path whose encoded slashes and dots would decode into another route
// reaches the service as sent, so the service answers it as the route the
// gateway authorized names nothing (404), never as the list or another item.
func TestEncodedDotSegmentsStayInTheItemID(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool)
	importItems(t, pool, fx.owner, []string{"coin-a", "coin-b"})
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))
	for _, path := range []string{"/export/items/a%2F..%2F..%2Fitems", "/export/items/x%2F..%2Fcoin-a", "/export/items/..%2F..%2F..%2Fhealthz"} {
		if status, got, _ := call(t, "GET", s.baseURL+path, fx.readKey, "", nil); status != 404 || got.Error == nil {
			t.Errorf("GET %s = %d %.100s, want 404 (the item route the gateway authorized, which names no item)", path, status, got.Data)
		}
	}
	sale := s.baseURL + "/export/items/x%2F..%2Fcoin-b/sales/confirm"
	key := map[string]string{"Idempotency-Key": "e2e-dots"}
	if status, got, _ := call(t, "POST", sale, fx.writeKey, `{"external_order_id":"o-dots"}`, key); status != 404 {
		t.Errorf("POST %s = %d %s, want 404", sale, status, got.Data)
	}
	status, got, _ := call(t, "GET", s.baseURL+"/export/items/coin-b", fx.readKey, "", nil)
	if status != 200 || !strings.Contains(string(got.Data), `"status":"active"`) {
		t.Errorf("coin-b after the confirm of x/../coin-b = %d %s, want it still active", status, got.Data)
	}
}
