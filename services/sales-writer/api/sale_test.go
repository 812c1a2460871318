package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/postgres"
	"github.com/coinexport/export/pkg/testenv"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

const order1 = `{"external_order_id":"order-1"}`

// confirm sells coin-1 of f.owner to market-a as order-1 and checks the 200.
func confirmed(t *testing.T, f *fixture, key string) map[string]any {
	t.Helper()
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: key, body: order1})
	if rec.Code != 200 {
		t.Fatalf("confirm = %d %s, want 200", rec.Code, rec.Body)
	}
	return result(t, env)
}

func parseTime(t *testing.T, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("timestamp %v: %v", v, err)
	}
	return at
}

// State table, row 1: active → confirm → inactive, stock 0, confirmed_at.
func TestConfirmSellsActiveItem(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	before := f.item(t, f.owner, "coin-1")

	got := confirmed(t, f, "confirm-1")
	confirmedAt := parseTime(t, got["confirmed_at"])
	delete(got, "confirmed_at")
	want := map[string]any{"item_id": "coin-1", "status": "inactive", "stock_quantity": 0.0,
		"platform_id": "market-a", "external_order_id": "order-1", "idempotent_replay": false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("confirm result mismatch (-want +got):\n%s", diff)
	}
	after := f.item(t, f.owner, "coin-1")
	if after.Status != "inactive" || !after.Sold || !after.UpdatedAt.After(before.UpdatedAt) {
		t.Errorf("item after confirm = %+v, want inactive, sold, updated_at after %v", after, before.UpdatedAt)
	}
	if !confirmedAt.Equal(after.UpdatedAt) {
		t.Errorf("confirmed_at = %v, want the item's updated_at %v", confirmedAt, after.UpdatedAt)
	}
	var platform, order string
	var at time.Time
	var canceled *time.Time
	err := f.db.QueryRow(context.Background(), "SELECT platform_id, external_order_id, confirmed_at, canceled_at FROM sales WHERE item_id = 'coin-1'").
		Scan(&platform, &order, &at, &canceled)
	if err != nil || platform != "market-a" || order != "order-1" || !at.Equal(confirmedAt) || canceled != nil {
		t.Errorf("sale row = %q %q %v %v, %v; want market-a order-1 %v <nil>", platform, order, at, canceled, err, confirmedAt)
	}
}

// State table, row 2: the identical retry replays, whatever happened since.
func TestConfirmRetryReplays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	first := confirmed(t, f, "confirm-1")
	stateAfterFirst := f.item(t, f.owner, "coin-1")

	rotated := f.writer("market-a")
	rotated.KeyID = "rotated-key"
	retries := []struct {
		name string
		c    call
	}{
		{"same request", call{id: f.writer("market-a"), body: order1}},
		{"quantity 1 spelled out", call{id: f.writer("market-a"), body: `{"quantity":1,"external_order_id":"order-1"}`}},
		{"rotated key of the same platform", call{id: rotated, body: " {\n\"external_order_id\" : \"order-1\"} \n"}},
	}
	want := map[string]any{}
	for k, v := range first {
		want[k] = v
	}
	want["idempotent_replay"] = true
	for _, tt := range retries {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.c
			c.op, c.item, c.key = "confirm", "coin-1", "confirm-1"
			rec, env := f.do(t, c)
			if rec.Code != 200 {
				t.Fatalf("retry = %d %s, want 200", rec.Code, rec.Body)
			}
			if diff := cmp.Diff(want, result(t, env)); diff != "" {
				t.Errorf("retry result mismatch (-want +got):\n%s", diff)
			}
		})
	}
	if got := f.item(t, f.owner, "coin-1"); got != stateAfterFirst {
		t.Errorf("item after retries = %+v, want unchanged %+v", got, stateAfterFirst)
	}

	// The sale is canceled, so the item could be sold again: the first key
	// still only replays its own answer.
	cancel(t, f, "market-a", "cancel-1", order1, 200)
	restored := f.item(t, f.owner, "coin-1")
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "confirm-1", body: order1})
	if rec.Code != 200 {
		t.Fatalf("retry after cancel = %d %s, want 200", rec.Code, rec.Body)
	}
	if diff := cmp.Diff(want, result(t, env)); diff != "" {
		t.Errorf("retry after cancel mismatch (-want +got):\n%s", diff)
	}
	if got := f.item(t, f.owner, "coin-1"); got != restored {
		t.Errorf("item after the retry = %+v, want still restored %+v", got, restored)
	}
	rec, _ = f.do(t, call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-1", body: `{"external_order_id":"b"}`})
	if rec.Code != 200 {
		t.Fatalf("confirm by market-b after cancel = %d %s, want 200", rec.Code, rec.Body)
	}
	rec, env = f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "confirm-1", body: order1})
	if rec.Code != 200 {
		t.Fatalf("late retry = %d %s, want 200", rec.Code, rec.Body)
	}
	if diff := cmp.Diff(want, result(t, env)); diff != "" {
		t.Errorf("late retry result mismatch (-want +got):\n%s", diff)
	}
	if n := f.count(t, "SELECT count(*) FROM sales"); n != 2 {
		t.Errorf("sales = %d, want 2 (market-a's, canceled, and market-b's)", n)
	}
}

// State table, row 3: a sold item cannot be confirmed by another request.
func TestConfirmSoldItemConflicts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	confirmed(t, f, "confirm-1")
	sold := f.item(t, f.owner, "coin-1")
	// Only the platform whose order holds the sale is told so (a confirm
	// it sent again under a new key); the others learn only that it is sold.
	const own = "to this platform under this external_order_id"
	others := []struct {
		call
		toldOwn bool
	}{
		{call{id: f.writer("market-a"), key: "confirm-2", body: order1}, true},
		{call{id: f.writer("market-a"), key: "confirm-3", body: `{"external_order_id":"order-2"}`}, false},
		{call{id: f.writer("market-b"), key: "confirm-1", body: order1}, false}, // same key, other platform: its own scope
		{call{id: f.writer("market-b"), key: "confirm-4", body: order1}, false},
	}
	for _, o := range others {
		c := o.call
		c.op, c.item = "confirm", "coin-1"
		rec, env := f.do(t, c)
		if rec.Code != 409 || errorCode(env) != "item_already_sold" {
			t.Errorf("confirm by %s with key %s = %d %q, want 409 item_already_sold", c.id.PlatformID, c.key, rec.Code, errorCode(env))
		}
		if msg := env.Error.Message; strings.Contains(msg, own) != o.toldOwn {
			t.Errorf("confirm by %s with key %s: message %q, want it to say the sale is its own: %v", c.id.PlatformID, c.key, msg, o.toldOwn)
		}
	}
	if got := f.item(t, f.owner, "coin-1"); got != sold {
		t.Errorf("item = %+v, want unchanged %+v", got, sold)
	}
	if n := f.count(t, "SELECT count(*) FROM idempotency_records"); n != 1 {
		t.Errorf("idempotency records = %d, want 1: only 200 answers are stored", n)
	}
}

// The partial unique index answers even if the sold flag is wrong: an open
// sale blocks a confirm of an item marked unsold.
func TestOpenSaleIndexIsLastLineOfDefence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	f.exec(t, `INSERT INTO sales (owner_id, item_id, platform_id, external_order_id, confirmed_at)
		VALUES ($1, 'coin-1', 'market-b', 'b-1', now())`, f.owner)
	before := f.item(t, f.owner, "coin-1")
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k1", body: order1})
	if rec.Code != 409 || errorCode(env) != "item_already_sold" {
		t.Fatalf("confirm with an open sale = %d %q, want 409 item_already_sold", rec.Code, errorCode(env))
	}
	if got := f.item(t, f.owner, "coin-1"); got != before {
		t.Errorf("item = %+v, want unchanged %+v", got, before)
	}
	if n := f.count(t, "SELECT count(*) FROM idempotency_records"); n != 0 {
		t.Errorf("idempotency records = %d, want 0", n)
	}
}

// An item its owner deactivated cannot be sold.
func TestConfirmUnlistedItemIsNotAvailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", false)
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k1", body: order1})
	if rec.Code != 409 || errorCode(env) != "item_not_available" {
		t.Fatalf("confirm of an unlisted item = %d %q, want 409 item_not_available", rec.Code, errorCode(env))
	}
	// The key keeps its refusal (TestALateCopyOfARefusedCallDoesNotRun):
	// once the owner lists the item, the same request is refused again
	// under k1, and sells under a new key.
	f.exec(t, "UPDATE export_items SET listed_active = true WHERE id = 'coin-1'")
	rec, env = f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k1", body: order1})
	if rec.Code != 409 || errorCode(env) != "item_not_available" {
		t.Fatalf("the same confirm under k1 once listed = %d %q, want the 409 item_not_available replayed", rec.Code, errorCode(env))
	}
	confirmed(t, f, "k2")
	if n := f.count(t, "SELECT count(*) FROM sales"); n != 1 {
		t.Errorf("sales = %d, want 1", n)
	}
}

func TestOtherOwnersItemIsNotFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	other := f.addOwner(t, "other owner")
	f.addItem(t, other, "coin-1", true)
	for _, op := range []string{"confirm", "cancel"} {
		for _, item := range []string{"coin-1", "no-such-coin"} {
			rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: item, key: op + item, body: order1})
			if rec.Code != 404 || errorCode(env) != "not_found" {
				t.Errorf("%s %s = %d %q, want 404 not_found", op, item, rec.Code, errorCode(env))
			}
		}
	}
	if got := f.item(t, other, "coin-1"); got.Sold {
		t.Errorf("other owner's item = %+v, want unsold", got)
	}
	if n := f.count(t, "SELECT count(*) FROM sales") + f.count(t, "SELECT count(*) FROM idempotency_records"); n != 0 {
		t.Errorf("rows written = %d, want 0", n)
	}
}

// Idempotency keys belong to an owner and a platform (spec 4.7, README's
// "Keys"): two owners selling through one platform may pick the same key,
// for the same item id and order, and neither replays, conflicts with or
// is bound by the other's call. Replaying the other owner's record would
// tell one tenant the other's sale (its confirmed_at) and sell nothing.
func TestIdempotencyKeysOfTwoOwnersAreApart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	other := f.addOwner(t, "other owner")
	for _, owner := range []string{f.owner, other} {
		f.addItem(t, owner, "coin-1", true)
		f.addItem(t, owner, "coin-2", true)
	}
	ofOther := f.writer("market-a")
	ofOther.OwnerID, ofOther.KeyID = other, "key-of-the-other-owner"
	steps := []struct {
		name       string
		c          call
		wantStatus int
		wantCode   string // "" for a sale executed, not replayed
	}{
		{"owner's confirm", call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "shared", body: order1}, 200, ""},
		{"other owner's, the same key and request", call{id: ofOther, op: "confirm", item: "coin-1", key: "shared", body: order1}, 200, ""},
		{"owner's refused call binds its key", call{id: f.writer("market-a"), op: "confirm", item: "nope", key: "bound", body: order1}, 404, "not_found"},
		{"other owner's, that key for a sale", call{id: ofOther, op: "confirm", item: "coin-2", key: "bound", body: order1}, 200, ""},
		{"other owner's cancel", call{id: ofOther, op: "cancel", item: "coin-1", key: "shared-cancel", body: order1}, 200, ""},
		{"owner's, that cancel's key", call{id: f.writer("market-a"), op: "confirm", item: "coin-2", key: "shared-cancel", body: order1}, 200, ""},
	}
	confirmedAt := map[string]any{}
	for _, s := range steps {
		rec, env := f.do(t, s.c)
		executed := rec.Code == 200 && result(t, env)["idempotent_replay"] == false
		if rec.Code != s.wantStatus || errorCode(env) != s.wantCode || (s.wantStatus == 200 && !executed) {
			t.Errorf("%s: %s %s with %s = %d %q %s, want %d %q", s.name, s.c.op, s.c.item, s.c.key, rec.Code, errorCode(env), rec.Body, s.wantStatus, s.wantCode)
		}
		if s.c.key == "shared" && rec.Code == 200 {
			confirmedAt[s.c.id.OwnerID] = result(t, env)["confirmed_at"]
		}
	}
	// Each owner's retry replays its own sale, the other's cancel notwithstanding.
	for _, id := range []identity.Identity{f.writer("market-a"), ofOther} {
		rec, env := f.do(t, call{id: id, op: "confirm", item: "coin-1", key: "shared", body: order1})
		if rec.Code != 200 || result(t, env)["idempotent_replay"] != true || result(t, env)["confirmed_at"] != confirmedAt[id.OwnerID] {
			t.Errorf("retry of %s's confirm = %d %s, want its own sale replayed (confirmed_at %v)", id.KeyID, rec.Code, rec.Body, confirmedAt[id.OwnerID])
		}
	}
	for _, want := range []struct {
		owner, item string
		sold        bool
	}{{f.owner, "coin-1", true}, {f.owner, "coin-2", true}, {other, "coin-1", false}, {other, "coin-2", true}} {
		if got := f.item(t, want.owner, want.item); got.Sold != want.sold {
			t.Errorf("item %s of owner %s = %+v, want sold %v", want.item, want.owner, got, want.sold)
		}
	}
}

// A signed identity whose platform is not in the database sells nothing:
// the confirm statement changes nothing, so no idempotency record is stored
// either, and the answer is 404. It has no sale to cancel: 409, as for any
// platform without one (spec 3).
func TestUnknownPlatformSellsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	before := f.item(t, f.owner, "coin-1")
	rec, env := f.do(t, call{id: f.writer("no-such-market"), op: "confirm", item: "coin-1", key: "k1", body: order1})
	if rec.Code != 404 || errorCode(env) != "not_found" {
		t.Fatalf("confirm by an unknown platform = %d %q, want 404 not_found", rec.Code, errorCode(env))
	}
	rec, env = f.do(t, call{id: f.writer("no-such-market"), op: "cancel", item: "coin-1", key: "k2", body: order1})
	if rec.Code != 409 || errorCode(env) != "sale_not_cancelable" {
		t.Fatalf("cancel by an unknown platform = %d %q, want 409 sale_not_cancelable", rec.Code, errorCode(env))
	}
	if got := f.item(t, f.owner, "coin-1"); got != before {
		t.Errorf("item = %+v, want unchanged %+v", got, before)
	}
	if n := f.count(t, "SELECT count(*) FROM sales") + f.count(t, "SELECT count(*) FROM idempotency_records"); n != 0 {
		t.Errorf("rows written = %d, want 0", n)
	}
}

// cancel calls cancel for coin-1 and checks the status.
func cancel(t *testing.T, f *fixture, platform, key, body string, wantStatus int) (map[string]any, envelope.Parsed) {
	t.Helper()
	rec, env := f.do(t, call{id: f.writer(platform), op: "cancel", item: "coin-1", key: key, body: body})
	if rec.Code != wantStatus {
		t.Fatalf("cancel by %s = %d %s, want %d", platform, rec.Code, rec.Body, wantStatus)
	}
	if wantStatus != 200 {
		return nil, env
	}
	return result(t, env), env
}

// State table, rows 4 and 5: the confirming platform and order cancel; the
// identical retry replays.
func TestCancelRestoresItem(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	first := confirmed(t, f, "confirm-1")
	sold := f.item(t, f.owner, "coin-1")

	got, _ := cancel(t, f, "market-a", "cancel-1", order1, 200)
	canceledAt := parseTime(t, got["canceled_at"])
	delete(got, "canceled_at")
	want := map[string]any{"item_id": "coin-1", "status": "active", "stock_quantity": 1.0, "platform_id": "market-a",
		"external_order_id": "order-1", "confirmed_at": first["confirmed_at"], "idempotent_replay": false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cancel result mismatch (-want +got):\n%s", diff)
	}
	restored := f.item(t, f.owner, "coin-1")
	if restored.Status != "active" || restored.Sold || !restored.UpdatedAt.After(sold.UpdatedAt) {
		t.Errorf("item after cancel = %+v, want active, not sold, updated_at after %v", restored, sold.UpdatedAt)
	}
	if canceledAt.Before(parseTime(t, first["confirmed_at"])) || canceledAt.After(restored.UpdatedAt) {
		t.Errorf("canceled_at = %v, want between confirmed_at %v and updated_at %v", canceledAt, first["confirmed_at"], restored.UpdatedAt)
	}

	replay, _ := cancel(t, f, "market-a", "cancel-1", `{"external_order_id":"order-1","quantity":1}`, 200)
	want["canceled_at"], want["idempotent_replay"] = canceledAt.UTC().Format("2006-01-02T15:04:05.000000Z"), true
	if diff := cmp.Diff(want, replay); diff != "" {
		t.Errorf("cancel replay mismatch (-want +got):\n%s", diff)
	}
	if got := f.item(t, f.owner, "coin-1"); got != restored {
		t.Errorf("item after the replay = %+v, want unchanged %+v", got, restored)
	}
	// The item can be sold again.
	rec, _ := f.do(t, call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-1", body: `{"external_order_id":"b-1"}`})
	if rec.Code != 200 {
		t.Errorf("confirm after cancel = %d %s, want 200", rec.Code, rec.Body)
	}
}

// A cancel of a sale whose item the owner has since unlisted (spec 3: a
// change of status by the owner is "not shown") closes the sale and frees
// the item, but does not list it again: the result and the export say
// inactive, stock 0, rather than the "active, stock 1" of a restored item
// (sales-writer README, "Decisions where the spec is silent").
func TestCancelOfAnUnlistedItemLeavesItInactive(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	confirmed(t, f, "confirm-1")
	f.exec(t, "UPDATE export_items SET listed_active = false WHERE id = 'coin-1'")
	got, _ := cancel(t, f, "market-a", "cancel-1", order1, 200)
	if got["status"] != "inactive" || got["stock_quantity"] != 0.0 || got["canceled_at"] == nil {
		t.Errorf("cancel of an unlisted item = %v, want inactive, stock 0, canceled_at set", got)
	}
	if st := f.item(t, f.owner, "coin-1"); st.Status != "inactive" || st.Sold {
		t.Errorf("item after the cancel = %+v, want inactive and not sold", st)
	}
	if n := f.count(t, "SELECT count(*) FROM sales WHERE canceled_at IS NULL"); n != 0 {
		t.Errorf("open sales = %d, want 0", n)
	}
}

// State table, row 6: only the platform and order that confirmed can cancel.
func TestCancelRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		sell     bool   // confirm as market-a / order-1 first
		cancelBy string // platform
		body     string
	}{
		{"no sale", false, "market-a", order1},
		{"another platform", true, "market-b", order1},
		{"another order", true, "market-a", `{"external_order_id":"order-2"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.addItem(t, f.owner, "coin-1", true)
			if tt.sell {
				confirmed(t, f, "confirm-1")
			}
			before := f.item(t, f.owner, "coin-1")
			_, env := cancel(t, f, tt.cancelBy, "cancel-1", tt.body, 409)
			if errorCode(env) != "sale_not_cancelable" {
				t.Errorf("error.code = %q, want sale_not_cancelable", errorCode(env))
			}
			if got := f.item(t, f.owner, "coin-1"); got != before {
				t.Errorf("item = %+v, want unchanged %+v", got, before)
			}
		})
	}
	t.Run("already canceled", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.addItem(t, f.owner, "coin-1", true)
		confirmed(t, f, "confirm-1")
		cancel(t, f, "market-a", "cancel-1", order1, 200)
		_, env := cancel(t, f, "market-a", "cancel-2", order1, 409)
		if errorCode(env) != "sale_not_cancelable" {
			t.Errorf("error.code = %q, want sale_not_cancelable", errorCode(env))
		}
	})
}

// Spec 4.7 rule 3: a key reused for a different request is a conflict.
func TestIdempotencyKeyReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	f.addItem(t, f.owner, "coin-2", true)
	confirmed(t, f, "key-1")
	tests := []struct {
		name string
		c    call
	}{
		{"other order", call{op: "confirm", item: "coin-1", body: `{"external_order_id":"order-2"}`}},
		{"other item", call{op: "confirm", item: "coin-2", body: order1}},
		{"cancel with the confirm key", call{op: "cancel", item: "coin-1", body: order1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.c
			c.id, c.key = f.writer("market-a"), "key-1"
			rec, env := f.do(t, c)
			if rec.Code != 409 || errorCode(env) != "idempotency_conflict" {
				t.Errorf("%s %s with a used key = %d %q, want 409 idempotency_conflict", c.op, c.item, rec.Code, errorCode(env))
			}
		})
	}
	if st := f.item(t, f.owner, "coin-2"); st.Sold {
		t.Errorf("coin-2 = %+v, want unsold", st)
	}
	if st := f.item(t, f.owner, "coin-1"); !st.Sold {
		t.Errorf("coin-1 = %+v, want still sold", st)
	}
}

// A record past its retention no longer binds its key.
func TestExpiredKeyCanBeReused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	f.addItem(t, f.owner, "coin-2", true)
	confirmed(t, f, "key-1")
	f.exec(t, "UPDATE idempotency_records SET expires_at = now() - interval '1 second'")
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-2", key: "key-1", body: order1})
	if rec.Code != 200 || result(t, env)["idempotent_replay"] != false {
		t.Fatalf("confirm with an expired key = %d %s, want 200 executed", rec.Code, rec.Body)
	}
	var expires time.Time
	if err := f.db.QueryRow(context.Background(), "SELECT expires_at FROM idempotency_records").Scan(&expires); err != nil {
		t.Fatal(err)
	}
	if until := time.Until(expires); until < 23*time.Hour || until > 25*time.Hour {
		t.Errorf("new record expires in %v, want about 24h", until)
	}
}

// A key replays for IDEMPOTENCY_RETENTION and no longer: just before its
// record expires the identical retry is its replay; just after, the call
// is judged anew, as if sent with a new key. What a platform retrying past
// the retention then meets (README, sales guide, step 4): a confirm whose
// sale is still open is refused 409 item_already_sold naming its own order,
// a cancel already applied 409 sale_not_cancelable (or, once the order has
// bought the item again under a new key, cancels that sale), and a confirm
// whose sale was canceled since sells the item again.
func TestARetryPastTheRetentionIsJudgedAnew(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	f.addItem(t, f.owner, "coin-2", true)
	confirmed(t, f, "confirm-1")
	cancel(t, f, "market-a", "cancel-1", order1, 200)
	rec, _ := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-2", key: "confirm-2", body: order1})
	if rec.Code != 200 {
		t.Fatalf("confirm coin-2 = %d %s, want 200", rec.Code, rec.Body)
	}
	// coin-3: sold, canceled, then sold again to the same order.
	f.addItem(t, f.owner, "coin-3", true)
	for _, c := range []call{
		{op: "confirm", item: "coin-3", key: "confirm-3", body: order1},
		{op: "cancel", item: "coin-3", key: "cancel-3", body: order1},
		{op: "confirm", item: "coin-3", key: "confirm-3-again", body: order1},
	} {
		c.id = f.writer("market-a")
		if rec, _ := f.do(t, c); rec.Code != 200 {
			t.Fatalf("%s coin-3 with %s = %d %s, want 200", c.op, c.key, rec.Code, rec.Body)
		}
	}
	type step struct {
		name       string
		c          call
		wantStatus int
		wantCode   string // "" for a 200
		wantReplay bool
	}
	retries := []step{
		{"confirm of a sale canceled since", call{op: "confirm", item: "coin-1", key: "confirm-1", body: order1}, 200, "", true},
		{"confirm of an open sale", call{op: "confirm", item: "coin-2", key: "confirm-2", body: order1}, 200, "", true},
		{"cancel applied", call{op: "cancel", item: "coin-1", key: "cancel-1", body: order1}, 200, "", true},
	}
	check := func(s step) envelope.Parsed {
		t.Helper()
		c := s.c
		c.id = f.writer("market-a")
		rec, env := f.do(t, c)
		if rec.Code != s.wantStatus || errorCode(env) != s.wantCode {
			t.Fatalf("%s = %d %q %s, want %d %q", s.name, rec.Code, errorCode(env), rec.Body, s.wantStatus, s.wantCode)
		}
		if rec.Code == 200 && result(t, env)["idempotent_replay"] != s.wantReplay {
			t.Errorf("%s: idempotent_replay = %v, want %v", s.name, result(t, env)["idempotent_replay"], s.wantReplay)
		}
		return env
	}

	// Just before: every record has a minute left, and replays.
	f.exec(t, "UPDATE idempotency_records SET expires_at = now() + interval '1 minute'")
	for _, s := range retries {
		check(s)
	}
	if st := f.item(t, f.owner, "coin-1"); st.Sold {
		t.Fatalf("coin-1 = %+v after replays, want unsold", st)
	}

	// Just after: the records' time has passed (expires_at is exclusive).
	f.exec(t, "UPDATE idempotency_records SET expires_at = now()")
	env := check(step{"confirm of an open sale, past the retention", retries[1].c, 409, "item_already_sold", false})
	if !strings.Contains(env.Error.Message, "to this platform under this external_order_id") {
		t.Errorf("late confirm of an open sale: message %q, want it to name the platform's own order", env.Error.Message)
	}
	check(step{"cancel applied, past the retention, while coin-1 is unsold", retries[2].c, 409, "sale_not_cancelable", false})
	check(step{"confirm of a sale canceled since, past the retention", retries[0].c, 200, "", false})
	if st := f.item(t, f.owner, "coin-1"); !st.Sold {
		t.Errorf("coin-1 = %+v after its confirm was retried past the retention, want sold again", st)
	}
	if n := f.count(t, "SELECT count(*) FROM sales WHERE item_id = 'coin-1'"); n != 2 {
		t.Errorf("%d sales of coin-1, want 2: the canceled one and the late retry's", n)
	}
	// And a cancel applied, whose order has confirmed the item again since,
	// cancels that second sale.
	check(step{"cancel applied, past the retention, once the order bought coin-3 again",
		call{op: "cancel", item: "coin-3", key: "cancel-3", body: order1}, 200, "", false})
	if st := f.item(t, f.owner, "coin-3"); st.Sold {
		t.Errorf("coin-3 = %+v after its cancel was retried past the retention, want its second sale canceled", st)
	}
}

// Spec 4.7 rule 3 holds after a refusal too: a refused request's key is
// bound to it and to its refusal, so its identical retry is answered the
// refusal again (even once the cause is gone: a new key tries again), and a
// different request with the key is a conflict that changes nothing.
func TestKeyOfARefusedRequestStaysBound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	f.addItem(t, f.owner, "coin-2", true)
	confirmed(t, f, "key-1") // coin-1 sold by market-a, order-1
	steps := []struct {
		name       string
		c          call
		wantStatus int
		wantCode   string // "" for a sale executed, not replayed
	}{
		{"sold item", call{op: "confirm", item: "coin-1", key: "key-2", body: order1}, 409, "item_already_sold"},
		{"its key, another item", call{op: "confirm", item: "coin-2", key: "key-2", body: order1}, 409, "idempotency_conflict"},
		{"its key, the same request", call{op: "confirm", item: "coin-1", key: "key-2", body: order1}, 409, "item_already_sold"},
		{"unknown item", call{op: "confirm", item: "nope", key: "key-3", body: order1}, 404, "not_found"},
		{"its key, an item that exists", call{op: "confirm", item: "coin-2", key: "key-3", body: order1}, 409, "idempotency_conflict"},
		{"no sale to cancel", call{op: "cancel", item: "coin-2", key: "key-4", body: order1}, 409, "sale_not_cancelable"},
		{"its key, a confirm", call{op: "confirm", item: "coin-2", key: "key-4", body: order1}, 409, "idempotency_conflict"},
		{"the sale canceled", call{op: "cancel", item: "coin-1", key: "key-5", body: order1}, 200, ""},
		{"key-2's request again, now sellable", call{op: "confirm", item: "coin-1", key: "key-2", body: order1}, 409, "item_already_sold"},
		{"key-2's request with a new key", call{op: "confirm", item: "coin-1", key: "key-6", body: order1}, 200, ""},
	}
	for _, s := range steps {
		c := s.c
		c.id = f.writer("market-a")
		rec, env := f.do(t, c)
		executed := rec.Code == 200 && result(t, env)["idempotent_replay"] == false
		if rec.Code != s.wantStatus || errorCode(env) != s.wantCode || (s.wantStatus == 200 && !executed) {
			t.Errorf("%s: %s %s with %s = %d %q %s, want %d %q", s.name, c.op, c.item, c.key, rec.Code, errorCode(env), rec.Body, s.wantStatus, s.wantCode)
		}
	}
	if st := f.item(t, f.owner, "coin-2"); st.Sold {
		t.Errorf("coin-2 = %+v, want unsold: no conflicting request may sell it", st)
	}
	// A binding past its retention no longer holds the key.
	f.exec(t, "UPDATE idempotency_refusals SET expires_at = now() - interval '1 second'")
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-2", key: "key-3", body: order1})
	if rec.Code != 200 {
		t.Errorf("confirm coin-2 with key-3 after its binding expired = %d %q, want 200", rec.Code, errorCode(env))
	}
}

// A copy of a call the platform gave up on (a timed-out attempt, held in the
// network or in a queue) can arrive after the platform's retry of the call
// was refused. It must get that refusal, not run: a fault-injection drill
// through the gateway saw such a late confirm sell an item, the other
// platform's sale having been canceled in between, to an order its platform
// had been told was not sold; and a late cancel would restore an item its
// platform still counts as sold, for another platform to sell again.
func TestALateCopyOfARefusedCallDoesNotRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	orderB := `{"external_order_id":"b"}`
	steps := []struct {
		name       string
		c          call
		wantStatus int
		wantCode   string
	}{
		{"market-a sells", call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "a-confirm", body: order1}, 200, ""},
		{"market-b's retry refused", call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-confirm", body: orderB}, 409, "item_already_sold"},
		{"market-a cancels", call{id: f.writer("market-a"), op: "cancel", item: "coin-1", key: "a-cancel", body: order1}, 200, ""},
		{"market-b's late copy", call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-confirm", body: orderB}, 409, "item_already_sold"},
		{"market-b's cancel before its confirm", call{id: f.writer("market-b"), op: "cancel", item: "coin-1", key: "b-cancel", body: orderB}, 409, "sale_not_cancelable"},
		{"market-b sells, new key", call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-confirm-2", body: orderB}, 200, ""},
		{"market-b's late cancel copy", call{id: f.writer("market-b"), op: "cancel", item: "coin-1", key: "b-cancel", body: orderB}, 409, "sale_not_cancelable"},
	}
	for _, s := range steps {
		rec, env := f.do(t, s.c)
		if rec.Code != s.wantStatus || errorCode(env) != s.wantCode {
			t.Fatalf("%s = %d %q %s, want %d %q", s.name, rec.Code, errorCode(env), rec.Body, s.wantStatus, s.wantCode)
		}
		message := ""
		if env.Error != nil {
			message = env.Error.Message
		}
		if late := strings.Contains(s.name, "late"); late != strings.Contains(message, "new key") {
			t.Errorf("%s: message %q; saying it is the key's earlier answer (a new key tries again) = %v, want %v",
				s.name, message, !late, late)
		}
	}
	if st := f.item(t, f.owner, "coin-1"); !st.Sold {
		t.Errorf("coin-1 = %+v, want sold to market-b's order b, which no late copy undid", st)
	}
	if n := f.count(t, "SELECT count(*) FROM sales WHERE platform_id = 'market-b' AND canceled_at IS NULL"); n != 1 {
		t.Errorf("%d open sales of market-b, want 1", n)
	}
}

// A call whose caller hung up (the gateway past its timeout) is not this
// service's failure: 499, not 500, in the log, the metrics and the span, and
// a retry with the key tells whether it was applied.
func TestAbandonedCallIsNotAFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	gone, hangUp := context.WithCancel(context.Background())
	hangUp()
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1, ctx: gone})
	if rec.Code != 499 || errorCode(env) != "client_closed_request" {
		t.Errorf("confirm whose caller hung up = %d %q, want 499 client_closed_request", rec.Code, errorCode(env))
	}
	confirmed(t, f, "key-1") // not applied here: the retry executes it
}

// A call the shutdown's drain cut off is the writer's doing: 503
// unavailable, saying how to retry, not the 499 of a caller that left
// (what it says was applied: TestCutOffOrAbandonedCallSaysWhatWasApplied).
func TestCutOffCallIsUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	cutOff, cut := context.WithCancelCause(context.Background())
	cut(httpserver.ErrCutOff)
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1, ctx: cutOff})
	if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" || !strings.Contains(env.Error.Message, "same Idempotency-Key") {
		t.Errorf("confirm cut off by the drain = %d %q %s, want 503 unavailable advising the same Idempotency-Key", rec.Code, errorCode(env), rec.Body)
	}
}

// A sale while PostgreSQL is out of reach is 503 unavailable, and says how
// to retry safely: not the 500 of a bug.
func TestStoreOutageIsUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	down := newHandler(t, testenv.Pool(t, "postgres://postgres@"+testenv.RefusingAddr(t)+"/postgres?connect_timeout=2"), defaultRetention)
	for _, op := range []string{"confirm", "cancel"} {
		rec, env := serve(t, down, f.signer, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
		if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
			!strings.Contains(env.Error.Message, "same Idempotency-Key") {
			t.Errorf("%s with PostgreSQL down = %d %q %q, want 503 unavailable naming the retry", op, rec.Code, errorCode(env), env.Error.Message)
		}
		if got := rec.Header().Get("Retry-After"); got != "1" {
			t.Errorf("%s with PostgreSQL down: Retry-After = %q, want 1", op, got)
		}
	}
}

// A sale that fails for a reason nobody foresaw (here a table gone: the
// statement fails in PostgreSQL, which is up) is the 500 of spec 7, whose
// client action is to retry with backoff and report the request id; like
// every 5xx of the writer it says how to retry a sale safely, with the same
// Idempotency-Key (what it says was applied, here nothing:
// TestSaleRefusedByAnErrorOfTheDatabaseSaysNothingWasApplied). It said
// only "internal error". The retry sells the item once the cause is put
// right.
func TestUnforeseenFailureSaysHowToRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	f.exec(t, "ALTER TABLE sales RENAME TO sales_away")
	for _, op := range []string{"confirm", "cancel"} {
		rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
		if rec.Code != http.StatusInternalServerError || errorCode(env) != "internal_error" ||
			!strings.Contains(env.Error.Message, "same Idempotency-Key") || !strings.Contains(env.Error.Message, "request_id") {
			t.Errorf("%s failing unforeseen = %d %q %q, want 500 internal_error naming the retry and the request id", op, rec.Code, errorCode(env), env.Error.Message)
		}
	}
	f.exec(t, "ALTER TABLE sales_away RENAME TO sales")
	confirmed(t, f, "key-confirm")
}

// A panic in a sale call (a bug) is answered, by the server's recovery,
// with a 500 that says what the writer's 500s say, and what is known of
// the sale: nothing was applied when the panic came before the call was
// given a connection (here a writer that is nil), so no statement of it
// can have reached PostgreSQL; else the sale may have been applied (here
// a writer that panics once the sale is done, as a panic encoding the
// answer would). Its line and span record it too (sale_applied no, maybe),
// as for every 5xx of the writer's. Every panic said "may" before.
func TestPanicSaysWhatWasApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	for _, tc := range []struct {
		name    string
		writer  Writer
		message string
		note    string
		sold    bool
	}{
		{"before any statement", (*sales.Writer)(nil), internalErrorNothingApplied, `"sale_applied":"no"`, false},
		{"after the sale", panicsAfterTheSale{sales.NewWriter(f.db, defaultRetention)}, InternalErrorMessage, `"sale_applied":"maybe"`, true},
	} {
		var logs testenv.Output
		f.handler = newServerOf(t, tc.writer, &logs, 10*time.Second).Handler()
		rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "key-1", body: order1})
		if rec.Code != http.StatusInternalServerError || errorCode(env) != "internal_error" || env.Error.Message != tc.message {
			t.Errorf("confirm that panics %s = %d %q %q, want 500 internal_error %q", tc.name, rec.Code, errorCode(env), env.Error.Message, tc.message)
		}
		if !strings.Contains(logs.String(), tc.note) {
			t.Errorf("the access line of a confirm that panics %s does not record %s:\n%s", tc.name, tc.note, logs.String())
		}
		if got := f.item(t, f.owner, "coin-1").Sold; got != tc.sold {
			t.Errorf("after the confirm that panics %s: sold = %v, want %v", tc.name, got, tc.sold)
		}
	}
}

// panicsAfterTheSale is the real writer, panicking once a call is done.
type panicsAfterTheSale struct{ *sales.Writer }

func (w panicsAfterTheSale) Execute(ctx context.Context, req sales.Request) (sales.Result, error) {
	_, _ = w.Writer.Execute(ctx, req)
	panic("after the sale")
}

// A sale on a read-only database (a failover sent the writer to a standby,
// or the primary is fenced with default_transaction_read_only: SQLSTATE
// 25006) is 503 unavailable with Retry-After, not 500, applies nothing and
// says so (PostgreSQL's ERROR rolled the call back; it said nothing of it):
// the same call with the same key sells the item once the writer reaches
// the primary again.
func TestReadOnlyStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	readOnly := newHandler(t, testenv.Pool(t, f.url+" default_transaction_read_only=on"), defaultRetention)
	for _, op := range []string{"confirm", "cancel"} {
		rec, env := serve(t, readOnly, f.signer, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
		if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
			!strings.Contains(env.Error.Message, "same Idempotency-Key") || !strings.Contains(env.Error.Message, "nothing was applied") {
			t.Errorf("%s on a read-only database = %d %q %s, want 503 unavailable saying nothing was applied and naming the retry", op, rec.Code, errorCode(env), rec.Body)
		}
		if got := rec.Header().Get("Retry-After"); got != "1" {
			t.Errorf("%s on a read-only database: Retry-After = %q, want 1", op, got)
		}
	}
	confirmed(t, f, "key-confirm")
}

// A call traced by its request id names its item, its Idempotency-Key
// (on any 400 after the key's own: the query's, the Content-Type's, the
// body's), its order, and
// whether its 200 was a replay; an API key pasted into any of them is
// not recorded.
func TestAccessLinesNameTheCall(t *testing.T) {
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	var logs testenv.Output
	f.handler = newLoggedHandler(t, f.db, defaultRetention, &logs)
	apiKey, _, err := apikey.Generate([]string{identity.ScopeSalesWrite})
	if err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		call call
		want string
	}{
		{call{op: "confirm", item: "coin-1", key: "k-1", body: order1},
			`"item_id":"coin-1","idempotency_key":"k-1","external_order_id":"order-1"}`},
		{call{op: "confirm", item: "coin-1", key: "k-1", body: order1},
			`"item_id":"coin-1","idempotency_key":"k-1","external_order_id":"order-1","idempotent_replay":true}`},
		{call{op: "confirm", item: "nope", key: "k-404", body: order1},
			`"error_code":"not_found","owner_id":"` + f.owner + `","item_id":"nope","idempotency_key":"k-404","external_order_id":"order-1"}`},
		{call{op: "confirm", item: "coin-1", key: "k-400", body: `{"external_order_id":""}`},
			`"error_code":"invalid_body","owner_id":"` + f.owner + `","item_id":"coin-1","idempotency_key":"k-400"}`},
		{call{op: "confirm", item: "coin-1", key: "k-query", query: "dry_run=1", body: order1},
			`"error_code":"invalid_parameter","owner_id":"` + f.owner + `","item_id":"coin-1","idempotency_key":"k-query"}`},
		{call{op: "confirm", item: "coin-1", key: "k-type", contentType: "text/plain", body: order1},
			`"error_code":"invalid_content_type","owner_id":"` + f.owner + `","item_id":"coin-1","idempotency_key":"k-type"}`},
		{call{op: "confirm", item: "coin-1", key: apiKey, body: `{"external_order_id":"` + apiKey + `"}`},
			`"error_code":"invalid_idempotency_key","owner_id":"` + f.owner + `","item_id":"coin-1","idempotency_key":"[holds an API key]"}`},
		{call{op: "confirm", item: "coin-1", key: "k-pasted", body: `{"external_order_id":"` + apiKey + `"}`},
			`"error_code":"invalid_body","owner_id":"` + f.owner + `","item_id":"coin-1","idempotency_key":"k-pasted"}`},
		{call{op: "confirm", item: "coin-1", key: "k-masked", body: `{"external_order_id":"cxw_ORDER000000000000000000000000000001"}`},
			`"item_id":"coin-1","idempotency_key":"k-masked","external_order_id":"[holds an API key]"}`},
	}
	for _, c := range calls {
		c.call.id = f.writer("market-a")
		f.do(t, c.call)
		// This logger adds no request id: the call's line is the last one.
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		line := lines[len(lines)-1]
		if !strings.HasSuffix(line, c.want) {
			t.Errorf("access line of %s %s with key %.8s… = %s\nwant it to end with %s", c.call.op, c.call.item, c.call.key, line, c.want)
		}
	}
	if strings.Contains(logs.String(), apiKey) {
		t.Errorf("the log holds the API key:\n%s", logs.String())
	}
}

// A sale that waits in the database past SALES_WRITER_QUERY_TIMEOUT (its
// item locked by a long transaction) is answered 503 with the advice to
// retry under the same key, not held until the gateway gives up; once
// the lock is gone the retry sells it, once.
func TestSaleLockedPastTheQueryTimeoutIsA503(t *testing.T) {
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	var logs testenv.Output
	ctx := context.Background()
	const timeout = 300 * time.Millisecond
	timed, err := postgres.Open(ctx, f.url, postgres.StatementTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer timed.Close()
	f.handler = newTimedHandler(t, timed, defaultRetention, &logs, timeout)
	tx := lockItem(t, f, "coin-1")
	sale := call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k-locked", body: order1}
	rec, env := f.do(t, sale)
	if rec.Code != 503 || env.Error == nil || env.Error.Code != "unavailable" ||
		!strings.Contains(env.Error.Message, "retry with backoff and the same Idempotency-Key") || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("confirm of a locked item = %d %+v (Retry-After %q), want 503 unavailable with the advice to retry under the key",
			rec.Code, env.Error, rec.Header().Get("Retry-After"))
	}
	// PostgreSQL itself cancelled the statement (57014), which rolls it
	// back; a client-side deadline alone leaves the server waiting. So
	// the answer says nothing was applied (the retry below executing, not
	// replaying, shows it), where it said the sale may have been.
	if !strings.Contains(logs.String(), "SALES_WRITER_QUERY_TIMEOUT") || !strings.Contains(logs.String(), "57014") {
		t.Errorf("no log line names the timeout and PostgreSQL's cancel (57014):\n%s", logs.String())
	}
	if !strings.Contains(env.Error.Message, "nothing was applied") {
		t.Errorf("confirm rolled back by PostgreSQL's statement_timeout says %q, want it to say nothing was applied", env.Error.Message)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, env := f.do(t, sale); rec.Code != 200 || result(t, env)["idempotent_replay"] != false {
		t.Fatalf("retry once the lock is gone = %d %+v, want 200, executed now", rec.Code, env.Error)
	}
	var sales int
	if err := f.db.QueryRow(ctx, "SELECT count(*) FROM sales WHERE item_id = 'coin-1'").Scan(&sales); err != nil || sales != 1 {
		t.Errorf("sales of coin-1 = %d, %v; want 1", sales, err)
	}
}

// sales_writer_outcomes_total counts each decision once: a platform that
// retries a refused call with its key is answered the refusal again, and
// an ops panel of refusals by code must not count each retry as one more
// refusal. Such replays are counted apart (replayed_refusal), as a
// replayed 200 is (replayed).
func TestReplayedRefusalsAreCountedApart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	srv := newServer(t, f.db, defaultRetention, io.Discard, 10*time.Second)
	f.handler = srv.Handler()
	orderB := `{"external_order_id":"b"}`
	for _, s := range []struct {
		c          call
		wantStatus int
	}{
		{call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "a-confirm", body: order1}, 200},
		{call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "a-confirm", body: order1}, 200},
		{call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-confirm", body: orderB}, 409},
		{call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-confirm", body: orderB}, 409},
		{call{id: f.writer("market-b"), op: "confirm", item: "coin-1", key: "b-confirm", body: orderB}, 409},
		{call{id: f.writer("market-b"), op: "cancel", item: "coin-1", key: "b-cancel", body: orderB}, 409},
		{call{id: f.writer("market-b"), op: "cancel", item: "coin-1", key: "b-cancel", body: orderB}, 409},
		{call{id: f.writer("market-b"), op: "confirm", item: "nope", key: "b-nope", body: orderB}, 404},
		{call{id: f.writer("market-b"), op: "confirm", item: "nope", key: "b-nope", body: orderB}, 404},
	} {
		if rec, env := f.do(t, s.c); rec.Code != s.wantStatus {
			t.Fatalf("%s %s with %s = %d %q, want %d", s.c.op, s.c.item, s.c.key, rec.Code, errorCode(env), s.wantStatus)
		}
	}
	want := map[string]float64{
		"confirm executed":           1,
		"confirm replayed":           1,
		"confirm item_already_sold":  1,
		"confirm not_found":          1,
		"confirm replayed_refusal":   3,
		"cancel sale_not_cancelable": 1,
		"cancel replayed_refusal":    1,
	}
	if diff := cmp.Diff(want, outcomeCounts(t, srv)); diff != "" {
		t.Errorf("sales_writer_outcomes_total by operation and outcome (-want +got):\n%s", diff)
	}
}

// outcomeCounts reads sales_writer_outcomes_total from srv's registry, by
// "operation outcome".
func outcomeCounts(t *testing.T, srv *httpserver.Server) map[string]float64 {
	t.Helper()
	families, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sales_writer_outcomes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["operation"]+" "+labels["outcome"]] = m.GetCounter().GetValue()
		}
	}
	return got
}

// A sale whose every run PostgreSQL rolls back as a deadlock (40P01; a
// serialization failure, 40001, likewise) is 503 unavailable and binds
// nothing: the database did not do the work, and the item may be sellable.
// Before, the third such run was taken for a lost race and answered 409
// item_already_sold, which the key then kept for IDEMPOTENCY_RETENTION,
// so that the platform's retry was refused again once the deadlocks had
// passed. A trigger stands in for the other transaction of each deadlock.
func TestRepeatedDeadlocksAreUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	f.exec(t, `CREATE FUNCTION deadlock() RETURNS trigger LANGUAGE plpgsql AS
		$$BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END$$`)
	f.exec(t, `CREATE TRIGGER deadlock BEFORE UPDATE ON export_items FOR EACH ROW EXECUTE FUNCTION deadlock()`)
	sale := call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k-deadlock", body: order1}
	rec, env := f.do(t, sale)
	if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
		!strings.Contains(env.Error.Message, "same Idempotency-Key") || !strings.Contains(env.Error.Message, "nothing was applied") {
		t.Errorf("confirm deadlocked on every run = %d %q %s, want 503 unavailable saying nothing was applied and naming the retry", rec.Code, errorCode(env), rec.Body)
	}
	if n := f.count(t, "SELECT count(*) FROM idempotency_refusals"); n != 0 {
		t.Errorf("refusals bound = %d, want 0: nothing refused the call", n)
	}
	f.exec(t, "DROP TRIGGER deadlock ON export_items")
	if rec, env := f.do(t, sale); rec.Code != 200 || result(t, env)["idempotent_replay"] != false {
		t.Errorf("retry with the key once the deadlocks passed = %d %s, want 200, executed now", rec.Code, rec.Body)
	}
}

// A sale statement that an operator cancels (pg_cancel_backend: SQLSTATE
// 57014, as a statement_timeout's) long before SALES_WRITER_QUERY_TIMEOUT
// is logged as PostgreSQL's refusal, `sale store unavailable`, and answered
// 503: before, it was logged as the query timeout running out, which sent
// on-call to look for a long lock or an overloaded database.
func TestAnOperatorsCancelIsNotCalledATimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	var logs testenv.Output
	f.handler = newLoggedHandler(t, f.db, defaultRetention, &logs) // a 10 s query timeout
	lockItem(t, f, "coin-1")
	answered := make(chan string, 1)
	go func() {
		rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k-canceled", body: order1})
		message := ""
		if env.Error != nil {
			message = env.Error.Message
		}
		answered <- fmt.Sprintf("%d %s: %s", rec.Code, errorCode(env), message)
	}()
	cancelWaitingSale(t, f)
	// The cancel rolled the statement back: nothing was applied.
	if got := <-answered; !strings.HasPrefix(got, "503 unavailable: ") || !strings.Contains(got, "nothing was applied") {
		t.Errorf("confirm cancelled by an operator = %s, want 503 unavailable saying nothing was applied", got)
	}
	if !strings.Contains(logs.String(), `"msg":"sale store unavailable"`) || strings.Contains(logs.String(), "timed out") {
		t.Errorf("the log of an operator's cancel, want `sale store unavailable` and no timeout:\n%s", logs.String())
	}
}

// cancelWaitingSale cancels, as an operator would, the statement of f's
// database that waits for a lock, once there is one.
func cancelWaitingSale(t *testing.T, f *fixture) {
	t.Helper()
	for range 1000 {
		var canceled bool
		err := f.db.QueryRow(context.Background(), `SELECT coalesce(bool_or(pg_cancel_backend(pid)), false) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&canceled)
		if err != nil {
			t.Fatal(err)
		}
		if canceled {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no statement waited for a lock in 10 s")
}

// lockItem holds the row lock of f.owner's item in a transaction of its
// own, as an operator's SELECT … FOR UPDATE would, until the test rolls it
// back or ends.
func lockItem(t *testing.T, f *fixture, item string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "SELECT FROM export_items WHERE owner_id = $1 AND id = $2 FOR UPDATE", f.owner, item); err != nil {
		t.Fatal(err)
	}
	return tx
}

// A database renamed (or dropped) under a running writer refuses each new
// connection, SQLSTATE 3D000: a sale is 503 unavailable with Retry-After,
// not the 500 of a bug, applies nothing, and its log line says what the
// operator must do; once the database is back, the same call with the
// same key sells the item, with no restart.
func TestDatabaseRenamedUnderTheWriterIsUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	var logs testenv.Output
	f.handler = newLoggedHandler(t, f.db, defaultRetention, &logs)
	restore := testenv.RenameDatabase(t, f.url)
	f.db.Reset() // its sessions were ended: the next call connects anew
	for _, op := range []string{"confirm", "cancel"} {
		rec, env := f.do(t, call{id: f.writer("market-a"), op: op, item: "coin-1", key: "key-" + op, body: order1})
		if rec.Code != http.StatusServiceUnavailable || errorCode(env) != "unavailable" ||
			!strings.Contains(env.Error.Message, "same Idempotency-Key") {
			t.Errorf("%s with the database renamed = %d %q %s, want 503 unavailable naming the retry", op, rec.Code, errorCode(env), rec.Body)
		}
		if got := rec.Header().Get("Retry-After"); got != "1" {
			t.Errorf("%s with the database renamed: Retry-After = %q, want 1", op, got)
		}
	}
	if !strings.Contains(logs.String(), `"msg":"sale store unavailable"`) || !strings.Contains(logs.String(), "3D000") ||
		!strings.Contains(logs.String(), `"cause":"DATABASE_URL's database does not exist`) {
		t.Errorf("the log does not name the refusal, its SQLSTATE and what to do:\n%s", logs.String())
	}
	restore()
	f.db.Reset()
	confirmed(t, f, "key-confirm")
}

// A sale's result is one owner's: no cache between the platform and the
// gateway may keep it, nor answer another caller with it. Every 200 of
// both routes, a replay's too, says so, as export-reader's pages do.
func TestASaleResultIsNotCached(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	for _, c := range []struct{ name, op, key string }{
		{"confirm", "confirm", "confirm-1"},
		{"confirm replayed", "confirm", "confirm-1"},
		{"cancel", "cancel", "cancel-1"},
		{"cancel replayed", "cancel", "cancel-1"},
	} {
		rec, _ := f.do(t, call{id: f.writer("market-a"), op: c.op, item: "coin-1", key: c.key, body: order1})
		if rec.Code != http.StatusOK {
			t.Fatalf("%s = %d %s, want 200", c.name, rec.Code, rec.Body)
		}
		if got := rec.Header().Get("Cache-Control"); got != envelope.PrivateCacheControl {
			t.Errorf("%s: Cache-Control = %q, want %q", c.name, got, envelope.PrivateCacheControl)
		}
	}
}
