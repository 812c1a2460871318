package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/testenv"
)

// saleResult is the data of a confirm or cancel answer (spec 2.4).
type saleResult struct {
	ItemID           string  `json:"item_id"`
	Status           string  `json:"status"`
	StockQuantity    int     `json:"stock_quantity"`
	PlatformID       string  `json:"platform_id"`
	ExternalOrderID  string  `json:"external_order_id"`
	ConfirmedAt      *string `json:"confirmed_at"`
	CanceledAt       *string `json:"canceled_at"`
	IdempotentReplay bool    `json:"idempotent_replay"`
}

// exportedItem is what an export consumer reads of an item.
type exportedItem struct {
	ID            string    `json:"id"`
	Status        string    `json:"status"`
	StockQuantity int       `json:"stock_quantity"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// The sale rows of spec 3 and the rules of 4.4 to 4.7, and the bindings of
// spec 5, through the whole stack: what the services' own tests hold with a
// signed identity made by the test, held here with API keys through the
// gateway, and every sale's effect read back through the export routes as a
// consumer reads it, not from the database. Owner A has two read keys (two
// export consumers) and two platforms' write keys; owner B has a read and a
// write key and an item of its own.
func TestSaleStatesThroughTheStack(t *testing.T) {
	pool := testenv.Postgres(t)
	fx := newFixture(t, pool) // owner A, platform e2e-market
	otherPlatform := "e2e-other"
	if _, err := pool.Exec(context.Background(), "INSERT INTO platforms (id) VALUES ($1)", otherPlatform); err != nil {
		t.Fatal(err)
	}
	secondReader := addKey(t, pool, fx.owner, nil, "export:read")
	otherWriter := addKey(t, pool, fx.owner, &otherPlatform, "sales:write")
	ownerB := addOwner(t, pool, "e2e-b")
	importItems(t, pool, ownerB, []string{"b-only"})
	readerB := addKey(t, pool, ownerB, nil, "export:read")
	writerB := addKey(t, pool, ownerB, ptr("e2e-market"), "sales:write")
	s := startStack(t, dsnOf(t, pool), testenv.RedisURL(t))

	item := itemOfStatus(t, s, fx, "active")
	itemURL := s.baseURL + "/export/items/" + url.PathEscape(item)
	readers := []string{fx.readKey, secondReader}

	// Spec 4.4: 404 for an item not owned, the same answer as for one that
	// does not exist (spec 1: never another owner's data): status, body and
	// headers, of a GET, a HEAD and each sale, the sale's retry under its
	// Idempotency-Key included (a refusal binds the key).
	t.Run("not owned is not found", func(t *testing.T) {
		for _, c := range []struct {
			method, key, theirs, suffix, body string
		}{
			{"GET", readerB, item, "", ""},
			{"GET", fx.readKey, "b-only", "", ""},
			{"HEAD", readerB, item, "", ""},
			{"HEAD", fx.readKey, "b-only", "", ""},
			{"POST", writerB, item, "/sales/confirm", order("b-1")},
			{"POST", writerB, item, "/sales/cancel", order("b-1")},
			{"POST", fx.writeKey, "b-only", "/sales/confirm", order("a-1")},
			{"POST", fx.writeKey, "b-only", "/sales/cancel", order("a-1")},
		} {
			var answers [2][]notFound
			for i, id := range []string{"no-such-item", c.theirs} {
				target := s.baseURL + "/export/items/" + url.PathEscape(id) + c.suffix
				tries := 1
				if c.method == "POST" {
					tries = 2
				}
				for range tries {
					answers[i] = append(answers[i], answerOf(t, c.method, target, c.key, c.body, id+c.suffix))
				}
			}
			if answers[0][0].status != 404 {
				t.Errorf("%s %s of a missing item = %d, want 404", c.method, c.suffix, answers[0][0].status)
			}
			if diff := cmp.Diff(answers[0], answers[1], cmp.AllowUnexported(notFound{})); diff != "" {
				t.Errorf("%s %s%s: another owner's item answers otherwise than a missing one (-missing +theirs):\n%s",
					c.method, c.theirs, c.suffix, diff)
			}
		}
		wantExported(t, s, itemURL, readers, "active", 1, time.Time{})
	})
	before := exported(t, itemURL, fx.readKey)

	// Spec 3 row 1, 4.5: the sale takes the item out of every export at
	// once, with the platform of the key (spec 5: never the request's).
	forged := map[string]string{"Idempotency-Key": "a-confirm", "X-Identity-Platform": otherPlatform, "X-Identity-Owner": ownerB}
	confirmed := wantSale(t, "POST", itemURL+"/sales/confirm", fx.writeKey, order("a-1"), forged)
	want := saleResult{ItemID: item, Status: "inactive", StockQuantity: 0, PlatformID: "e2e-market", ExternalOrderID: "a-1",
		ConfirmedAt: confirmed.ConfirmedAt}
	if diff := cmp.Diff(want, confirmed); diff != "" || confirmed.ConfirmedAt == nil {
		t.Errorf("confirm (-want +got):\n%s", diff)
	}
	sold := wantExported(t, s, itemURL, readers, "inactive", 0, before.UpdatedAt)

	// Spec 4.7 rule 2, row 2: the identical retry replays.
	replay := wantSale(t, "POST", itemURL+"/sales/confirm", fx.writeKey, order("a-1"), key("a-confirm"))
	want.IdempotentReplay = true
	if diff := cmp.Diff(want, replay); diff != "" {
		t.Errorf("confirm retried (-want +got):\n%s", diff)
	}
	// Row 3, 4.5's 409: sold is sold, for any platform and order;
	// 4.6: only the platform and order that confirmed can cancel; 4.7
	// rule 3 and 4.6: the confirm's key is not the cancel's.
	for _, c := range []struct {
		name, op, key, idempotencyKey, body, code string
	}{
		{"another platform's confirm", "confirm", otherWriter, "o-confirm", order("o-1"), "item_already_sold"},
		{"another order's confirm", "confirm", fx.writeKey, "a-confirm-2", order("a-2"), "item_already_sold"},
		{"the confirm's key for another order", "confirm", fx.writeKey, "a-confirm", order("a-2"), "idempotency_conflict"},
		{"another platform's cancel", "cancel", otherWriter, "o-cancel", order("a-1"), "sale_not_cancelable"},
		{"another order's cancel", "cancel", fx.writeKey, "a-cancel-2", order("a-2"), "sale_not_cancelable"},
		{"a cancel with the confirm's key", "cancel", fx.writeKey, "a-confirm", order("a-1"), "idempotency_conflict"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, "POST", itemURL+"/sales/"+c.op, c.key, c.idempotencyKey, c.body, 409, c.code)
		})
	}
	if got := wantExported(t, s, itemURL, readers, "inactive", 0, time.Time{}); !got.UpdatedAt.Equal(sold.UpdatedAt) {
		t.Errorf("updated_at after the refused calls = %v, want unchanged %v", got.UpdatedAt, sold.UpdatedAt)
	}

	// Rows 4 and 5: the platform and order that confirmed restore the
	// item, for every consumer; the identical retry replays.
	canceled := wantSale(t, "POST", itemURL+"/sales/cancel", fx.writeKey, order("a-1"), key("a-cancel"))
	want = saleResult{ItemID: item, Status: "active", StockQuantity: 1, PlatformID: "e2e-market", ExternalOrderID: "a-1",
		ConfirmedAt: confirmed.ConfirmedAt, CanceledAt: canceled.CanceledAt}
	if diff := cmp.Diff(want, canceled); diff != "" || canceled.CanceledAt == nil {
		t.Errorf("cancel (-want +got):\n%s", diff)
	}
	wantExported(t, s, itemURL, readers, "active", 1, sold.UpdatedAt)
	replay = wantSale(t, "POST", itemURL+"/sales/cancel", fx.writeKey, order("a-1"), key("a-cancel"))
	want.IdempotentReplay = true
	if diff := cmp.Diff(want, replay); diff != "" {
		t.Errorf("cancel retried (-want +got):\n%s", diff)
	}
	// Row 6: no sale to cancel.
	wantError(t, "POST", itemURL+"/sales/cancel", fx.writeKey, "a-cancel-3", order("a-1"), 409, "sale_not_cancelable")
	// The item is for sale again, to another platform.
	again := wantSale(t, "POST", itemURL+"/sales/confirm", otherWriter, order("o-2"), key("o-confirm-2"))
	if again.PlatformID != otherPlatform || again.IdempotentReplay {
		t.Errorf("confirm by %s after the cancel = %+v, want executed for it", otherPlatform, again)
	}
	wantExported(t, s, itemURL, readers, "inactive", 0, time.Time{})
}

// notFound is an answer as far as it may differ between an item that does
// not exist and one of another owner: all of it but what differs between
// any two calls (request id, date, rate-limit count).
type notFound struct {
	status int
	body   string
	header http.Header
}

// answerOf sends a request (the sale routes' with an Idempotency-Key made
// of idempotencyKey) and returns its answer without what varies per call.
func answerOf(t *testing.T, method, target, apiKey, body, idempotencyKey string) notFound {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", apiKey)
	if method == "POST" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-"+strings.ReplaceAll(idempotencyKey, "/", "-"))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	requestID := resp.Header.Get("X-Request-Id")
	for _, varies := range []string{"X-Request-Id", "Date", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
		resp.Header.Del(varies)
	}
	return notFound{resp.StatusCode, strings.ReplaceAll(string(raw), requestID, "REQUEST_ID"), resp.Header}
}

// order is a SaleWriteRequest body.
func order(id string) string { return `{"external_order_id":"` + id + `"}` }

// key is an Idempotency-Key header.
func key(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

// addOwner stores a new owner named name and returns its id.
func addOwner(t *testing.T, pool *pgxpool.Pool, name string) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), "INSERT INTO owners (name) VALUES ($1) RETURNING id::text", name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// wantSale sends a sale call that must succeed and returns its data.
func wantSale(t *testing.T, method, target, apiKey, body string, headers map[string]string) saleResult {
	t.Helper()
	status, env, _ := call(t, method, target, apiKey, body, headers)
	var got saleResult
	if status != 200 || json.Unmarshal(env.Data, &got) != nil {
		t.Fatalf("%s %s = %d %+v %s, want 200 with a sale", method, target, status, env.Error, env.Data)
	}
	return got
}

// wantError sends a call that must be refused with status and code, and
// returns the answer.
func wantError(t *testing.T, method, target, apiKey, idempotencyKey, body string, status int, code string) envelope.Parsed {
	t.Helper()
	var headers map[string]string
	if idempotencyKey != "" {
		headers = key(idempotencyKey)
	}
	got, env, _ := call(t, method, target, apiKey, body, headers)
	if got != status || env.Error == nil || env.Error.Code != code {
		t.Errorf("%s %s = %d %+v, want %d %s", method, target, got, env.Error, status, code)
	}
	return env
}

// exported is the item as the item route shows it to apiKey.
func exported(t *testing.T, itemURL, apiKey string) exportedItem {
	t.Helper()
	status, env, _ := call(t, "GET", itemURL, apiKey, "", nil)
	var got exportedItem
	if status != 200 || json.Unmarshal(env.Data, &got) != nil {
		t.Fatalf("GET %s = %d %+v, want 200 with an item", itemURL, status, env.Error)
	}
	return got
}

// wantExported checks that every consumer (one read key each) sees the item
// with status and stock, both by its own route and in the incremental list
// page after since (when not zero: the change moved updated_at past it),
// and returns what the first saw.
func wantExported(t *testing.T, s *stack, itemURL string, readers []string, status string, stock int, since time.Time) exportedItem {
	t.Helper()
	var first exportedItem
	for i, reader := range readers {
		got := exported(t, itemURL, reader)
		if got.Status != status || got.StockQuantity != stock || (!since.IsZero() && !got.UpdatedAt.After(since)) {
			t.Errorf("consumer %d: item = %+v, want %s with stock %d, updated after %v", i+1, got, status, stock, since)
		}
		if i == 0 {
			first = got
		}
		if since.IsZero() {
			continue
		}
		page := s.baseURL + "/export/items?limit=100&updated_after=" + url.QueryEscape(since.Format(time.RFC3339Nano))
		code, env, _ := call(t, "GET", page, reader, "", nil)
		var items []exportedItem
		if code != 200 || json.Unmarshal(env.Data, &items) != nil {
			t.Fatalf("GET %s = %d %+v", page, code, env.Error)
		}
		if !slices.ContainsFunc(items, func(i exportedItem) bool {
			return i.ID == got.ID && i.Status == got.Status && i.StockQuantity == got.StockQuantity && i.UpdatedAt.Equal(got.UpdatedAt)
		}) {
			t.Errorf("consumer %d: the page of changes after %v = %+v, want it to hold %+v", i+1, since, items, got)
		}
	}
	return first
}
