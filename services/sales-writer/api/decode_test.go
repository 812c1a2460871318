package api

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/apikey"
	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/httpserver"
	"github.com/coinexport/export/pkg/identity"
	"github.com/coinexport/export/pkg/strictjson"
	"github.com/coinexport/export/services/sales-writer/sales"
	"github.com/google/go-cmp/cmp"
)

// The fuzz targets below hold decode to the contract (spec 2.5, 4.5, 8)
// by comparing it with a plain reading of its rules: what it accepts
// satisfies every rule, what it refuses breaks one, and a refusal is a
// 400 (413 for a body over the cap) with one of the route's codes.

// bodySeeds are the bodies of the table tests (TestBadRequestsWriteNothing,
// TestQuantityOneInAnySpelling, TestOrderIDIsTheTextSent), good and bad.
var bodySeeds = []string{
	`{"external_order_id":"order-1"}`,
	`{"external_order_id":"o-1","quantity":1}`,
	`{"external_order_id":"o-1","quantity":1.0}`,
	`{"external_order_id":"o-1","quantity":1e0}`,
	`{"external_order_id":"o-1","quantity":100e-2}`,
	`{"external_order_id":"o-1","quantity":1.000}`,
	`{"external_order_id":"` + strings.Repeat("é", 128) + `","quantity":1}`,
	`{"external_order_id":"` + strings.Repeat("é", 129) + `"}`,
	`{"external_order_id":"\ufffd"}`,
	`{"external_order_id":"` + strings.Repeat(`\ud83d\ude00`, 128) + `"}`,
	`{"external_order_id":"` + strings.Repeat(`\ud83d\ude00`, 129) + `"}`,
	``, `external_order_id=1`, `[{"external_order_id":"o"}]`, `"o"`, `null`,
	`{"external_order_id":"o"`, `{"external_order_id":"o"}{}`, `{"external_order_id":"o"} x`,
	"{\"external_order_id\":\"o\xff\"}",
	`{"external_order_id":"o","external_order_id":"p"}`,
	`{"external_order_id":"o","platform_id":"market-b"}`,
	`{"quantity":1}`, `{}`,
	`{"external_order_id":12}`, `{"external_order_id":null}`, `{"external_order_id":{"id":"o"}}`,
	`{"external_order_id":""}`, `{"external_order_id":"a\u0000b"}`,
	`{"external_order_id":"\ud800"}`, `{"external_order_id":"\udfff"}`, `{"external_order_id":"\ude00\ud83d"}`,
	`{"external_order_id":"o\ud83dx"}`, `{"external_order_id":"o","\udfff":1}`,
	`{"external_order_id":"o","quantity":1,"quantity":1}`,
	"{\"external_order_id\":\"o\",\"q\xff\":1}",
	`{"external_order_id":"o","quantity":2}`, `{"external_order_id":"o","quantity":0}`,
	`{"external_order_id":"o","quantity":-1}`, `{"external_order_id":"o","quantity":1.01}`,
	`{"external_order_id":"o","quantity":1e1}`, `{"external_order_id":"o","quantity":1.0000000000000000001}`,
	`{"external_order_id":"o","quantity":1e999999999}`, `{"external_order_id":"o","quantity":0x1}`,
	`{"external_order_id":"o","quantity":1.5}`, `{"external_order_id":"o","quantity":"1"}`,
	`{"external_order_id":"o","quantity":null}`, `{"external_order_id":"o","quantity":true}`,
	`{"external_order_id":"o","quantity":0.1e1}`, `{"external_order_id":"o","quantity":-0}`,
	"\xEF\xBB\xBF{\"external_order_id\":\"o\"}",
	// Short, and 10^999999 to big.Rat: 40 ms and 4 MB before isOne
	// bounded the exponent.
	`{"external_order_id":"o","quantity":1e999999}`, `{"external_order_id":"o","quantity":0.1e-99999}`,
	`{"external_order_id":"o","quantity":10e-1}`, `{"external_order_id":"o","quantity":1E+0000}`,
}

func FuzzParseBody(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := allocatedBytes()
		orderID, quantity, err := parseBody(body)
		if used, limit := allocatedBytes()-before, 32*uint64(len(body))+64<<10; used > limit {
			t.Fatalf("parseBody(%q) allocated %d bytes, want at most %d", body, used, limit)
		}
		wantID, why := referenceBody(body)
		switch {
		case err == nil && why != "":
			t.Fatalf("parseBody(%q) = %q, %d, want refused: %s", body, orderID, quantity, why)
		case err == nil && (orderID != wantID || quantity != sales.DefaultQuantity):
			t.Fatalf("parseBody(%q) = %q, %d, want %q, %d", body, orderID, quantity, wantID, sales.DefaultQuantity)
		case err != nil && why == "":
			t.Fatalf("parseBody(%q) = %v, want %q accepted", body, err, wantID)
		case err != nil:
			wantRequestError(t, "parseBody", body, err, http.StatusBadRequest, codeInvalidBody)
		}
	})
}

func FuzzIdempotencyKey(f *testing.F) {
	for _, s := range []string{"k", "", strings.Repeat("k", 128), strings.Repeat("k", 129), "clé-1",
		strings.Repeat("я", 128), "a\tb", "~ !", "\x7f", "k\x00"} {
		f.Add(s, "", uint8(1))
	}
	f.Add("k1", "k2", uint8(2))
	f.Add("", "", uint8(0))
	f.Add("", "", uint8(2))
	f.Fuzz(func(t *testing.T, first, second string, n uint8) {
		values := []string{first, second}[:min(n, 2)]
		got, err := idempotencyKey(values)
		why := referenceKey(values)
		switch {
		case err == nil && why != "":
			t.Fatalf("idempotencyKey(%q) = %q, want refused: %s", values, got, why)
		case err == nil && got != values[0]:
			t.Fatalf("idempotencyKey(%q) = %q, want %q", values, got, values[0])
		case err != nil && why == "":
			t.Fatalf("idempotencyKey(%q) = %v, want accepted", values, err)
		case err != nil:
			wantRequestError(t, "idempotencyKey", values, err, http.StatusBadRequest, codeInvalidKey)
		}
	})
}

// uuidPattern is RFC 9562's text form, any version, either case.
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

func FuzzIsUUID(f *testing.F) {
	for _, s := range []string{"0b4c8e5e-6a47-4c54-9a1e-7f0f3c2d1e00", "0B4C8E5E-6A47-4C54-9A1E-7F0F3C2D1E00",
		"0b4c8e5e6a474c549a1e7f0f3c2d1e00", "0b4c8e5e-6a47-4c54-9a1e-7f0f3c2d1e0", "0b4c8e5e-6a47-4c54-9a1e-7f0f3c2d1e0g",
		"{0b4c8e5e-6a47-4c54-9a1e-7f0f3c2d1e00}", "0b4c8e5e-6a47-4c54-9a1e-7f0f3c2d1e00\n", "", "owner"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := isUUID(s), uuidPattern.MatchString(s); got != want {
			t.Fatalf("isUUID(%q) = %v, want %v", s, got, want)
		}
	})
}

// FuzzDecode sends whole requests through decode, as the route does: the
// Content-Type, the Idempotency-Key and the body are all the client's.
func FuzzDecode(f *testing.F) {
	for _, ct := range []string{"application/json", "application/json; charset=UTF-8", "application/json;charset=utf-8",
		"", "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin1",
		"Application/JSON", "application/json; charset=\"utf-8\"", "application/json; charset", "application/json; x=1", "application/json; charset=utf8",
		"application/json; charset=UNICODE-1-1-UTF-8", "application/json; charset=utf-16"} {
		f.Add(ct, "k", []byte(`{"external_order_id":"order-1"}`))
	}
	for _, s := range bodySeeds {
		f.Add("application/json", "key-1", []byte(s))
	}
	f.Add("application/json", "k", []byte(`{"external_order_id":"o","x":"`+strings.Repeat("x", 20000)+`"}`))
	owner := "0b4c8e5e-6a47-4c54-9a1e-7f0f3c2d1e00"
	id := identity.Identity{OwnerID: owner, PlatformID: "market-a", KeyID: "key-a",
		Scopes: []string{identity.ScopeSalesWrite}, RequestID: "req-fuzz"}
	f.Fuzz(func(t *testing.T, contentType, key string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/export/items/coin-1/sales/confirm", bytes.NewReader(body))
		r.SetPathValue("item_id", "coin-1")
		r.Header["Content-Type"] = []string{contentType}
		r.Header["Idempotency-Key"] = []string{key}
		r = r.WithContext(identity.WithContext(r.Context(), id))
		req, err := decode(httptest.NewRecorder(), r, sales.Confirm)

		var why string
		switch wantID, bodyWhy := referenceBody(body); {
		case !referenceContentType(contentType):
			why = "Content-Type is not application/json in UTF-8"
		case referenceKey([]string{key}) != "":
			why = referenceKey([]string{key})
		case len(body) > maxBodyBytes:
			why = "the body is over the cap"
		case bodyWhy != "":
			why = bodyWhy
		case err == nil:
			want := sales.Request{Operation: sales.Confirm, OwnerID: owner, PlatformID: "market-a", IdempotencyKey: key,
				ItemID: "coin-1", ExternalOrderID: wantID, Quantity: sales.DefaultQuantity}
			if req != want {
				t.Fatalf("decode(%q, %q, %q) = %+v, want %+v", contentType, key, body, req, want)
			}
		}
		switch {
		case err == nil && why != "":
			t.Fatalf("decode(%q, %q, %q) = %+v, want refused: %s", contentType, key, body, req, why)
		case err != nil && why == "":
			t.Fatalf("decode(%q, %q, %q) = %v, want accepted", contentType, key, body, err)
		case err != nil && len(body) > maxBodyBytes && referenceContentType(contentType) && referenceKey([]string{key}) == "":
			wantRequestError(t, "decode", body, err, http.StatusRequestEntityTooLarge, "payload_too_large")
		case err != nil:
			wantRequestError(t, "decode", body, err, http.StatusBadRequest,
				codeInvalidBody, codeInvalidKey, codeInvalidContentType)
		}
	})
}

// allocatedBytes is what the process has allocated so far.
func allocatedBytes() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// wantRequestError fails t unless err, answered as the route answers it
// (writeError), is the status with one of the codes and a message.
func wantRequestError(t *testing.T, fn string, in any, err error, status int, codes ...string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h := &handler{log: slog.New(slog.DiscardHandler)}
	code := h.writeError(rec, httptest.NewRequest(http.MethodPost, "/", nil), err)
	var env envelope.Parsed
	if jsonErr := json.Unmarshal(rec.Body.Bytes(), &env); jsonErr != nil || env.Error == nil {
		t.Fatalf("%s(%q) = %v, answered %s, want an error envelope", fn, in, err, rec.Body)
	}
	if rec.Code != status || !slices.Contains(codes, code) || env.Error.Code != code || env.Error.Message == "" {
		t.Fatalf("%s(%q) = %v, answered %d %q %q, want %d, one of %q, and a message",
			fn, in, err, rec.Code, env.Error.Code, env.Error.Message, status, codes)
	}
}

// referenceBody reads a SaleWriteRequest by spec 2.5 and the service's own
// limits: a strict JSON object (strictjson, fuzzed on its own), only the
// properties external_order_id (a string of 1 to 128 characters without
// NUL, which PostgreSQL text cannot hold) and quantity (the number 1, in a
// spelling of at most maxQuantityLen bytes). It returns the order id, or
// why the body is refused.
func referenceBody(body []byte) (orderID, why string) {
	if strictjson.CheckObject(body) != nil {
		return "", "not one strict JSON object"
	}
	var props map[string]json.RawMessage
	if err := json.Unmarshal(body, &props); err != nil {
		return "", "not a JSON object: " + err.Error()
	}
	for name, value := range props {
		switch name {
		case "external_order_id":
			if len(value) == 0 || value[0] != '"' || json.Unmarshal(value, &orderID) != nil {
				return "", "external_order_id is not a string"
			}
			if n := utf8.RuneCountInString(orderID); n < 1 || n > 128 {
				return "", "external_order_id is not 1 to 128 characters"
			}
			if strings.ContainsRune(orderID, 0) {
				return "", "external_order_id holds NUL"
			}
		case "quantity":
			if len(value) > maxQuantityLen || !numberIsOne(string(value)) {
				return "", "quantity is not 1"
			}
		default:
			return "", "unknown property " + name
		}
	}
	if _, ok := props["external_order_id"]; !ok {
		return "", "external_order_id is missing"
	}
	return orderID, ""
}

// numberIsOne reports whether s is a JSON number equal to 1, by decimal
// arithmetic: its digits without leading and trailing zeros must be "1",
// and the exponent must bring that 1 to the units place.
func numberIsOne(s string) bool {
	if s == "" || s[0] < '0' || s[0] > '9' { // strings, literals and negative numbers
		return false
	}
	mantissa, exponent, _ := strings.Cut(strings.ToLower(s), "e")
	whole, fraction, _ := strings.Cut(mantissa, ".")
	digits := strings.TrimLeft(whole+fraction, "0")
	trimmed := strings.TrimRight(digits, "0")
	if trimmed != "1" {
		return false
	}
	// The value is 1 × 10^(len(digits)-1 - len(fraction) + exponent).
	shift := len(digits) - 1 - len(fraction)
	if exponent == "" {
		return shift == 0
	}
	sign := 1
	switch exponent[0] {
	case '-':
		sign, exponent = -1, exponent[1:]
	case '+':
		exponent = exponent[1:]
	}
	exponent = strings.TrimLeft(exponent, "0")
	if len(exponent) > 6 { // far beyond any shift a short spelling can undo
		return false
	}
	n := 0
	for _, c := range exponent {
		n = n*10 + int(c-'0')
	}
	return shift+sign*n == 0
}

// referenceKey says why Idempotency-Key values are refused (spec 4.5, 8:
// one header of 1 to 128 characters; the service wants printable ASCII),
// or "".
func referenceKey(values []string) string {
	if len(values) != 1 {
		return "not exactly one header"
	}
	if k := values[0]; len(k) < 1 || len(k) > 128 {
		return "not 1 to 128 characters"
	}
	for _, c := range []byte(values[0]) {
		if c < ' ' || c > '~' {
			return "not printable ASCII"
		}
	}
	if apikey.ContainsKeySecret(values[0]) {
		return "holds an API key"
	}
	return ""
}

// referenceContentType reports whether a Content-Type says JSON in UTF-8.
func referenceContentType(value string) bool {
	mediaType, params, err := mime.ParseMediaType(value)
	cs, ok := params["charset"]
	namesUTF8 := slices.ContainsFunc([]string{"utf-8", "utf8", "unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "x-unicode20utf8"},
		func(label string) bool { return strings.EqualFold(cs, label) })
	return err == nil && mediaType == "application/json" && (!ok || namesUTF8)
}

// FuzzCaller: whatever identity headers reach the sales writer (signed for
// an identity of any fields, then one changed, repeated, dropped, or sent
// under a name in another case), the server's check and caller either
// refuse the call or yield exactly the identity that was signed, for this
// request, and only one caller admits (a key with sales:write, bound to a
// platform and to an owner that is a UUID).
func FuzzCaller(f *testing.F) {
	owner := "0b9b3c6e-5f7d-4b0e-9a7e-0c1d2e3f4a5b"
	for i, tt := range []struct{ owner, platform, scopes string }{
		{owner, "market-a", "sales:write"}, {owner, "", "sales:write"}, {owner, "market-a", "export:read"},
		{owner, "market-a", "export:read,sales:write"}, {"", "market-a", "sales:write"}, {"owner-1", "market-a", "sales:write"},
		{strings.ToUpper(owner), "market-a", "sales:write,"}, {owner, "market-a", " sales:write"},
	} {
		f.Add(tt.owner, tt.platform, "key-1", tt.scopes, "req-1", uint8(i), "garbled")
	}
	f.Add(owner, "market-a", "key-1", "sales:write", "req-1", uint8(0xff), "")
	f.Add(owner, "market-a", "key-1", "sales:write", "req-1", uint8(1), "1f0e9d8c-5f7d-4b0e-9a7e-0c1d2e3f4a5b") // admitted
	signer, _ := identity.NewSigner(testSecret)
	var got *identity.Identity
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/export/items/{item_id}/sales/confirm", func(w http.ResponseWriter, r *http.Request) {
		if id, err := caller(r); err == nil {
			got = &id
		}
	})
	server := httpserver.New(httpserver.Config{Service: "sales-writer", Log: slog.New(slog.DiscardHandler), Signer: signer}, mux)
	names := []string{identity.HeaderOwner, identity.HeaderPlatform, identity.HeaderKeyID, identity.HeaderScopes,
		identity.HeaderRequestID, identity.HeaderTime, identity.HeaderSignature, "Idempotency-Key"}
	f.Fuzz(func(t *testing.T, owner, platform, keyID, scopes, requestID string, garble uint8, value string) {
		if strings.ContainsAny(owner+platform+keyID+scopes+requestID+value, "\r\n") {
			t.Skip() // no header value holds one
		}
		r := httptest.NewRequest(http.MethodPost, "/v1/export/items/coin-1/sales/confirm", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", "k-1")
		signed := identity.Identity{OwnerID: owner, PlatformID: platform, KeyID: keyID, RequestID: requestID}
		if scopes != "" {
			signed.Scopes = strings.Split(scopes, ",")
		}
		for _, h := range signer.Sign(signed, identity.RequestOf(r), time.Now()) {
			r.Header.Set(h.Name, h.Value)
		}
		name := names[int(garble>>2)%len(names)]
		switch garble % 4 {
		case 0:
			r.Header.Set(name, value)
		case 1:
			r.Header.Add(name, value) // a second value, after the signed one
		case 2:
			r.Header.Del(name)
		case 3:
			v := r.Header.Get(name)
			r.Header.Del(name)
			r.Header[strings.ToLower(name)] = []string{v}
		}
		got = nil
		server.Handler().ServeHTTP(httptest.NewRecorder(), r)
		if got == nil {
			return
		}
		if diff := cmp.Diff(signed, *got); diff != "" {
			t.Fatalf("caller yields an identity other than the signed one (%s garbled %d with %q) (-signed +got):\n%s",
				name, garble%4, value, diff)
		}
		if !got.HasScope(identity.ScopeSalesWrite) || got.PlatformID == "" || !isUUID(got.OwnerID) {
			t.Fatalf("caller admits %+v", *got)
		}
	})
}
