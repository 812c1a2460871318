package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/identity"
)

// TestBadRequestsWriteNothing sends every kind of bad request for an item
// that could be sold, and checks the answer and that nothing was written.
func TestBadRequestsWriteNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	before := f.item(t, f.owner, "coin-1")
	w := f.writer("market-a")
	good := `{"external_order_id":"order-1"}`
	noPlatform := w
	noPlatform.PlatformID = ""
	readOnly := w
	readOnly.Scopes = []string{identity.ScopeExportRead}
	anonymous := identity.Identity{RequestID: "req-anon"}
	// A platform's own key pasted in the wrong place: stored as sent, it
	// would sit in plain text in idempotency_records or sales.
	pastedKey, _, err := apikey.Generate([]string{identity.ScopeSalesWrite})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		c          call
		wantStatus int
		wantCode   string
		wantInMsg  string // the message names the field
	}{
		{"a query parameter", call{key: "k", body: good, query: "dry_run=1"}, 400, "invalid_parameter", "query"},
		{"a bare query name", call{key: "k", body: good, query: "x"}, 400, "invalid_parameter", "query"},
		{"no key header", call{body: good}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"empty key", call{body: good, header: http.Header{"Idempotency-Key": {""}}}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"key of 129 characters", call{key: strings.Repeat("k", 129), body: good}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"key not ASCII", call{key: "clé-1", body: good}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"key of 128 Cyrillic letters", call{key: strings.Repeat("я", 128), body: good}, 400, "invalid_idempotency_key", "printable ASCII"},
		{"key with a tab", call{key: "a\tb", body: good}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"two keys", call{body: good, header: http.Header{"Idempotency-Key": {"k1", "k2"}}}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"key holding an API key", call{key: "retry-" + pastedKey, body: good}, 400, "invalid_idempotency_key", "holds an API key"},
		{"order id holding an API key", call{key: "k", body: `{"external_order_id":"` + pastedKey + `"}`}, 400, "invalid_body", "holds an API key"},
		// Its checksum cut off or mistyped, or a typo in its body, a key
		// is no key, but its secret is whole: the checksum is recomputed,
		// a typo found by it. Stored, it would be recovered from the table.
		{"key holding an API key without its checksum", call{key: pastedKey[:len(pastedKey)-6], body: good}, 400, "invalid_idempotency_key", "holds an API key (cxr_, cxw_ or cxa_ and 43 letters or digits)"},
		{"key holding an API key, checksum mistyped", call{key: mistyped(pastedKey, len(pastedKey)-1), body: good}, 400, "invalid_idempotency_key", "holds an API key"},
		{"order id holding an API key without its checksum", call{key: "k", body: `{"external_order_id":"order ` + pastedKey[:len(pastedKey)-6] + `"}`}, 400, "invalid_body", "holds an API key"},
		{"order id holding an API key, a typo in its body", call{key: "k", body: `{"external_order_id":"` + mistyped(pastedKey, 10) + `"}`}, 400, "invalid_body", "holds an API key"},
		// Its tag left out, a key is its whole secret all the same.
		{"key holding an API key without its tag", call{key: "retry-" + pastedKey[4:], body: good}, 400, "invalid_idempotency_key", "holds an API key"},
		{"order id holding an API key without its tag", call{key: "k", body: `{"external_order_id":"` + pastedKey[4:] + `"}`}, 400, "invalid_body", "holds an API key"},
		{"no content type", call{key: "k", body: good, contentType: "-"}, 400, "invalid_content_type", "Content-Type"},
		{"text content type", call{key: "k", body: good, contentType: "text/plain"}, 400, "invalid_content_type", "Content-Type"},
		{"form content type", call{key: "k", body: good, contentType: "application/x-www-form-urlencoded"}, 400, "invalid_content_type", "Content-Type"},
		{"latin1 charset", call{key: "k", body: good, contentType: "application/json; charset=latin1"}, 400, "invalid_content_type", "UTF-8"},
		{"empty body", call{key: "k", body: ""}, 400, "invalid_body", "JSON object"},
		{"not JSON", call{key: "k", body: "external_order_id=1"}, 400, "invalid_body", "JSON"},
		{"array", call{key: "k", body: `[{"external_order_id":"o"}]`}, 400, "invalid_body", "JSON object"},
		{"string", call{key: "k", body: `"o"`}, 400, "invalid_body", "JSON object"},
		{"null", call{key: "k", body: `null`}, 400, "invalid_body", "JSON object"},
		{"truncated", call{key: "k", body: `{"external_order_id":"o"`}, 400, "invalid_body", "JSON"},
		{"trailing object", call{key: "k", body: good + `{}`}, 400, "invalid_body", "after the JSON object"},
		{"trailing garbage", call{key: "k", body: good + ` x`}, 400, "invalid_body", "after the JSON object"},
		{"invalid UTF-8", call{key: "k", body: "{\"external_order_id\":\"o\xff\"}"}, 400, "invalid_body", "UTF-8"},
		{"duplicate property", call{key: "k", body: `{"external_order_id":"o","external_order_id":"p"}`}, 400, "invalid_body", "external_order_id"},
		{"unknown property", call{key: "k", body: `{"external_order_id":"o","platform_id":"market-b"}`}, 400, "invalid_body", "platform_id"},
		{"missing order id", call{key: "k", body: `{"quantity":1}`}, 400, "invalid_body", "external_order_id"},
		{"empty object", call{key: "k", body: `{}`}, 400, "invalid_body", "external_order_id"},
		{"order id number", call{key: "k", body: `{"external_order_id":12}`}, 400, "invalid_body", "external_order_id"},
		{"order id null", call{key: "k", body: `{"external_order_id":null}`}, 400, "invalid_body", "external_order_id"},
		{"order id object", call{key: "k", body: `{"external_order_id":{"id":"o"}}`}, 400, "invalid_body", "external_order_id"},
		{"order id empty", call{key: "k", body: `{"external_order_id":""}`}, 400, "invalid_body", "external_order_id"},
		{"order id of 129 characters", call{key: "k", body: `{"external_order_id":"` + strings.Repeat("é", 129) + `"}`}, 400, "invalid_body", "external_order_id"},
		{"order id with NUL", call{key: "k", body: `{"external_order_id":"a\u0000b"}`}, 400, "invalid_body", "external_order_id"},
		// encoding/json reads each of these as U+FFFD, so all would name
		// the same order: the acceptance test confirmed order "\ud800"
		// and canceled it as "\udfff" (rows run for confirm and cancel).
		{"order id lone high surrogate", call{key: "k", body: `{"external_order_id":"\ud800"}`}, 400, "invalid_body", "surrogate"},
		{"order id lone low surrogate", call{key: "k", body: `{"external_order_id":"\udfff"}`}, 400, "invalid_body", "surrogate"},
		{"order id reversed pair", call{key: "k", body: `{"external_order_id":"\ude00\ud83d"}`}, 400, "invalid_body", "surrogate"},
		{"order id high surrogate then letter", call{key: "k", body: `{"external_order_id":"o\ud83dx"}`}, 400, "invalid_body", "surrogate"},
		{"name with lone surrogate", call{key: "k", body: `{"external_order_id":"o","\udfff":1}`}, 400, "invalid_body", "surrogate"},
		{"order id of 129 emoji", call{key: "k", body: `{"external_order_id":"` + strings.Repeat(`\ud83d\ude00`, 129) + `"}`}, 400, "invalid_body", "external_order_id"},
		{"duplicate quantity", call{key: "k", body: `{"external_order_id":"o","quantity":1,"quantity":1}`}, 400, "invalid_body", `"quantity" appears twice`},
		{"invalid UTF-8 in a name", call{key: "k", body: "{\"external_order_id\":\"o\",\"q\xff\":1}"}, 400, "invalid_body", "UTF-8"},
		{"quantity 2", call{key: "k", body: `{"external_order_id":"o","quantity":2}`}, 400, "invalid_body", "quantity"},
		{"quantity 0", call{key: "k", body: `{"external_order_id":"o","quantity":0}`}, 400, "invalid_body", "quantity"},
		{"quantity -1", call{key: "k", body: `{"external_order_id":"o","quantity":-1}`}, 400, "invalid_body", "quantity"},
		{"quantity 1.01", call{key: "k", body: `{"external_order_id":"o","quantity":1.01}`}, 400, "invalid_body", "quantity"},
		{"quantity 1e1", call{key: "k", body: `{"external_order_id":"o","quantity":1e1}`}, 400, "invalid_body", "quantity"},
		{"quantity 1 and a bit", call{key: "k", body: `{"external_order_id":"o","quantity":1.0000000000000000001}`}, 400, "invalid_body", "quantity"},
		{"quantity of a huge exponent", call{key: "k", body: `{"external_order_id":"o","quantity":1e999999999}`}, 400, "invalid_body", "quantity"},
		{"quantity 1 spelt long", call{key: "k", body: `{"external_order_id":"o","quantity":0.` + strings.Repeat("0", 9999) + `1e10000}`}, 400, "invalid_body", "quantity"},
		{"quantity 0x1", call{key: "k", body: `{"external_order_id":"o","quantity":0x1}`}, 400, "invalid_body", "JSON"},
		{"quantity 1.5", call{key: "k", body: `{"external_order_id":"o","quantity":1.5}`}, 400, "invalid_body", "quantity"},
		{"quantity string", call{key: "k", body: `{"external_order_id":"o","quantity":"1"}`}, 400, "invalid_body", "quantity"},
		{"quantity null", call{key: "k", body: `{"external_order_id":"o","quantity":null}`}, 400, "invalid_body", "quantity"},
		{"quantity true", call{key: "k", body: `{"external_order_id":"o","quantity":true}`}, 400, "invalid_body", "quantity"},
		{"body too large", call{key: "k", body: `{"external_order_id":"o","x":"` + strings.Repeat("x", 20000) + `"}`}, 413, "payload_too_large", "bytes"},
		{"anonymous", call{id: anonymous, key: "k", body: good}, 401, "unauthenticated", "API key"},
		{"key without sales:write", call{id: readOnly, key: "k", body: good}, 403, "forbidden", "sales:write"},
		{"key without platform", call{id: noPlatform, key: "k", body: good}, 403, "forbidden", "platform"},
	}
	for _, op := range []string{"confirm", "cancel"} {
		for _, tt := range tests {
			t.Run(op+"/"+tt.name, func(t *testing.T) {
				c := tt.c
				c.op, c.item = op, "coin-1"
				if c.id.RequestID == "" {
					c.id = w
				}
				rec, env := f.do(t, c)
				if rec.Code != tt.wantStatus || errorCode(env) != tt.wantCode {
					t.Fatalf("POST %s %q = %d %q, want %d %q", op, c.body, rec.Code, errorCode(env), tt.wantStatus, tt.wantCode)
				}
				if !strings.Contains(env.Error.Message, tt.wantInMsg) {
					t.Errorf("error.message = %q, want it to mention %q", env.Error.Message, tt.wantInMsg)
				}
				if env.Meta.RequestID != c.id.RequestID {
					t.Errorf("meta.request_id = %q, want the gateway's %q", env.Meta.RequestID, c.id.RequestID)
				}
			})
		}
	}
	if got := f.item(t, f.owner, "coin-1"); got != before {
		t.Errorf("item after bad requests = %+v, want unchanged %+v", got, before)
	}
	if n := f.count(t, "SELECT count(*) FROM sales") + f.count(t, "SELECT count(*) FROM idempotency_records"); n != 0 {
		t.Errorf("rows in sales and idempotency_records = %d, want 0", n)
	}
}

// TestLimitsAreInclusive: a 128-character key and order id are accepted.
func TestLimitsAreInclusive(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	body := `{"external_order_id":"` + strings.Repeat("é", 128) + `","quantity":1}`
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: strings.Repeat("~", 128), body: body,
		contentType: "application/json; charset=UTF-8"})
	if rec.Code != 200 {
		t.Fatalf("confirm with 128-character key and order id = %d %s, want 200", rec.Code, rec.Body)
	}
	if got := result(t, env)["external_order_id"]; got != strings.Repeat("é", 128) {
		t.Errorf("external_order_id = %v, want the 128 characters sent", got)
	}
}

// TestUTF8CharsetLabelsAreAccepted: a Content-Type whose charset names
// UTF-8 by any of its labels (WHATWG Encoding Standard), "utf8" among them,
// is read, and the label is no part of the request: the retry under another
// spelling replays the sale.
func TestUTF8CharsetLabelsAreAccepted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	w := f.writer("market-a")
	body := `{"external_order_id":"order-1"}`
	for i, charset := range []string{"utf8", "UTF8", "unicode-1-1-utf-8", "x-unicode20utf8", "utf-8"} {
		rec, env := f.do(t, call{id: w, op: "confirm", item: "coin-1", key: "confirm-1", body: body,
			contentType: "application/json; charset=" + charset})
		if rec.Code != 200 {
			t.Fatalf("confirm with charset=%s = %d %s, want 200", charset, rec.Code, rec.Body)
		}
		if replay := result(t, env)["idempotent_replay"]; replay != (i > 0) {
			t.Errorf("confirm with charset=%s: idempotent_replay = %v, want %v", charset, replay, i > 0)
		}
	}
}

// TestOrderIDIsTheTextSent: an order id is the Unicode text sent, however
// it is escaped. U+FFFD sent literally or as \ufffd is the same order, and
// an emoji, literal or a surrogate pair, is one character of the 128.
func TestOrderIDIsTheTextSent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.writer("market-a")
	tests := []struct {
		name, sent, want string
	}{
		{"escaped U+FFFD", `\ufffd`, "\uFFFD"},
		{"literal U+FFFD", "\uFFFD", "\uFFFD"},
		{"128 escaped emoji", strings.Repeat(`\ud83d\ude00`, 128), strings.Repeat("😀", 128)},
		{"128 literal emoji", strings.Repeat("😀", 128), strings.Repeat("😀", 128)},
		// Shaped like a key but no key (its checksum fails): an order id
		// like any other, refused only when it holds a whole key.
		{"starts like an API key", "cxw_ORDER000000000000000000000000000001", "cxw_ORDER000000000000000000000000000001"},
		// A tag no key holds (upper-case, with a dash), then a hash: the
		// order numbers of a platform called CXR, refused every one when
		// any spelling of a tag was read as a key's.
		{"a tag no key holds, then 64 hex digits", "CXR-" + strings.Repeat("0123456789ABCDEF", 4), "CXR-" + strings.Repeat("0123456789ABCDEF", 4)},
	}
	for i, tt := range tests {
		item := fmt.Sprintf("coin-%d", i)
		f.addItem(t, f.owner, item, true)
		rec, env := f.do(t, call{id: w, op: "confirm", item: item, key: "confirm-" + item, body: `{"external_order_id":"` + tt.sent + `"}`})
		if rec.Code != 200 {
			t.Errorf("confirm %s = %d %s, want 200", tt.name, rec.Code, rec.Body)
			continue
		}
		if got := result(t, env)["external_order_id"]; got != tt.want {
			t.Errorf("confirm %s: external_order_id = %+q, want %+q", tt.name, got, tt.want)
		}
	}
	// The order confirmed as \ufffd is canceled by its literal spelling.
	rec, env := f.do(t, call{id: w, op: "cancel", item: "coin-0", key: "cancel-coin-0", body: `{"external_order_id":"\uFFFD"}`})
	if rec.Code != 200 || result(t, env)["external_order_id"] != "\uFFFD" {
		t.Errorf("cancel of the \\ufffd order by literal U+FFFD = %d %s, want 200", rec.Code, rec.Body)
	}
}

func TestUnusableItemIDsAreNotFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, item := range []string{strings.Repeat("i", 129), "%00", "%FF"} {
		rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: item, key: "k", body: `{"external_order_id":"o"}`})
		if rec.Code != 404 || errorCode(env) != "not_found" {
			t.Errorf("confirm item %q = %d %q, want 404 not_found", item, rec.Code, errorCode(env))
		}
	}
}

// A property named with an API key (pasted into the body by mistake) is
// refused without the answer quoting the key.
func TestUnknownPropertyHoldingAKeyIsNotQuoted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	secret, _, err := apikey.Generate([]string{identity.ScopeSalesWrite})
	if err != nil {
		t.Fatal(err)
	}
	rec, env := f.do(t, call{id: f.writer("market-a"), op: "confirm", item: "coin-1", key: "k",
		body: `{"external_order_id":"o","` + secret + `":1}`})
	if rec.Code != 400 || errorCode(env) != "invalid_body" {
		t.Fatalf("confirm with a key as a property name = %d %q, want 400 invalid_body", rec.Code, errorCode(env))
	}
	if strings.Contains(rec.Body.String(), secret) || !strings.Contains(env.Error.Message, "[holds an API key]") {
		t.Errorf("answer %s quotes the key, or does not say it held one", rec.Body.String())
	}
}

// quantity is the number 1 however it is written (1, 1.0, 1e0, 100e-2),
// and every spelling is the same request as the one without it: a retry
// with another spelling replays.
func TestQuantityOneInAnySpelling(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.addItem(t, f.owner, "coin-1", true)
	w := f.writer("market-a")
	first := `{"external_order_id":"o-1"}`
	if rec, env := f.do(t, call{id: w, op: "confirm", item: "coin-1", key: "q", body: first}); rec.Code != 200 {
		t.Fatalf("confirm without quantity = %d %+v", rec.Code, env.Error)
	}
	for _, q := range []string{"1", "1.0", "1e0", "100e-2", "1.000"} {
		body := `{"external_order_id":"o-1","quantity":` + q + `}`
		rec, env := f.do(t, call{id: w, op: "confirm", item: "coin-1", key: "q", body: body})
		if rec.Code != 200 || result(t, env)["idempotent_replay"] != true {
			t.Errorf("confirm with quantity %s under the same key = %d %s, want 200 replayed", q, rec.Code, rec.Body)
		}
	}
}

// mistyped is key with its character at i replaced by another of the
// keys' alphabet.
func mistyped(key string, i int) string {
	c := byte('A')
	if key[i] == c {
		c = 'B'
	}
	return key[:i] + string(c) + key[i+1:]
}
