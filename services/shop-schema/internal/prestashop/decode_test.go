package prestashop

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDecodeScalars(t *testing.T) {
	ints := []struct {
		in   string
		want Int
		ok   bool
	}{
		{`12`, 12, true}, {`"12"`, 12, true}, {`"0"`, 0, true}, {`0`, 0, true}, {`-1`, -1, true},
		{`""`, 0, true}, {`null`, 0, true}, {`" 7 "`, 7, true}, {`"x"`, 0, false}, {`1.5`, 0, false}, {`[]`, 0, false},
	}
	for _, tt := range ints {
		var got Int
		err := json.Unmarshal([]byte(tt.in), &got)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("Int.UnmarshalJSON(%s) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
	bools := []struct {
		in   string
		want Bool
	}{
		{`"1"`, true}, {`1`, true}, {`true`, true}, {`"0"`, false}, {`0`, false}, {`false`, false}, {`""`, false}, {`null`, false},
	}
	for _, tt := range bools {
		var got Bool
		if err := json.Unmarshal([]byte(tt.in), &got); err != nil || got != tt.want {
			t.Errorf("Bool.UnmarshalJSON(%s) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestDecodeText(t *testing.T) {
	tests := []struct {
		in   string
		want Text
	}{
		{`"Home"`, Text{Plain: "Home", IsPlain: true}},
		{`[{"id":"1","value":"Home"},{"id":2,"value":"Главная"}]`, Text{ByLang: []LangValue{{1, "Home"}, {2, "Главная"}}}},
		{`[]`, Text{ByLang: []LangValue{}}},
		{`null`, Text{}},
	}
	for _, tt := range tests {
		var got Text
		if err := json.Unmarshal([]byte(tt.in), &got); err != nil {
			t.Errorf("Text.UnmarshalJSON(%s) = %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("Text.UnmarshalJSON(%s) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestDecodeList(t *testing.T) {
	tests := []struct {
		name, body string
		want       []Feature
		wantErr    bool
	}{
		{"empty list is a bare array", `[]`, nil, false},
		{"BOM and spaces", "\xef\xbb\xbf \n[]", nil, false},
		{"strings", `{"product_features":[{"id":1,"position":"0","name":"Metal"}]}`,
			[]Feature{{ID: 1, Name: Text{Plain: "Metal", IsPlain: true}}}, false},
		{"numbers", `{"product_features":[{"id":1,"position":3,"name":[{"id":1,"value":"Metal"}]}]}`,
			[]Feature{{ID: 1, Position: 3, Name: Text{ByLang: []LangValue{{1, "Metal"}}}}}, false},
		{"other wrapper", `{"categories":[{"id":1}]}`, nil, true},
		{"errors body", `{"errors":[{"code":22,"message":"x"}]}`, nil, true},
		{"non-empty bare array", `["categories"]`, nil, true},
		{"not JSON", `<html>`, nil, true},
	}
	for _, tt := range tests {
		got, err := decodeList[Feature]([]byte(tt.body), "product_features", budgetOf(1<<20))
		if (err != nil) != tt.wantErr {
			t.Errorf("decodeList(%s) error = %v, want error %v", tt.name, err, tt.wantErr)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("decodeList(%s) (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestStatusError(t *testing.T) {
	const (
		notReceived = "did not receive the key"
		rejected    = "rejected the key"
		// The permission refused, and every other one the key needs: the
		// shop names only the first it refuses.
		noGet = "no GET permission on this resource (the key needs GET on categories, product_features and product_feature_values, and on languages"
	)
	tests := []struct {
		status int
		body   string
		want   Kind
		reason string // a part of the reason, if it matters
	}{
		{401, `401 Unauthorized`, KindUnauthorized, notReceived},
		{401, `<html><body>Authorization Required</body></html>`, KindUnauthorized, notReceived},
		// Which of the key's faults, in words the merchant acts on.
		{401, `{"errors":[{"code":20,"message":"a"},{"code":21,"message":"b"}]}`, KindUnauthorized, rejected + ": it is unknown to the shop, or disabled"},
		{401, `{"errors":[{"code":18,"message":"a"}]}`, KindUnauthorized, rejected + ": PrestaShop keys are 32 characters"},
		{401, `{"errors":[{"code":21,"message":"a"}]}`, KindUnauthorized, rejected + ": it has no permission at all (the key needs GET on categories"},
		{401, `{"errors":[{"code":99,"message":"a"}]}`, KindUnauthorized, rejected},
		{401, `{"errors":[{"code":26,"message":"a"}]}`, KindUnauthorized, noGet},
		// The same errors in XML: the shop read the key all the same.
		{401, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<prestashop xmlns:xlink=\"http://www.w3.org/1999/xlink\">\n<errors>\n<error>\n<code><![CDATA[20]]></code>\n<message><![CDATA[Authentification key is not active]]></message>\n</error>\n<error>\n<code><![CDATA[21]]></code>\n<message><![CDATA[No permission for this authentication key]]></message>\n</error>\n</errors>\n</prestashop>", KindUnauthorized, rejected},
		{401, `<prestashop><errors><error><code><![CDATA[26]]></code><message><![CDATA[Resource of type "categories" is not allowed]]></message></error></errors></prestashop>`, KindUnauthorized, noGet},
		// Other permissions on the resource, not GET (PrestaShop's
		// checkHTTPMethod): the key's to fix, as code 26.
		{405, `{"errors":[{"code":25,"message":"Method GET is not allowed for the resource categories with this authentication key"}]}`, KindUnauthorized, noGet},
		{403, `{"errors":[{"code":132,"message":"a"}]}`, KindForbidden, "not enabled for this shop"},
		// Not PrestaShop's: a firewall's page, or a bare 403 of the server.
		{403, `<html><head><title>403 Forbidden</title></head><body>Access denied</body></html>`, KindForbidden, "before the PrestaShop webservice read it"},
		{403, ``, KindForbidden, "before the PrestaShop webservice read it"},
		{503, `{"errors":[{"code":22,"message":"a"}]}`, KindDisabled, "enable it in the back office"},
		{503, `<prestashop><errors><error><code><![CDATA[22]]></code></error></errors></prestashop>`, KindDisabled, ""},
		{503, `Service Unavailable`, KindUnavailable, ""},
		{500, `{"errors":[{"code":2,"message":"[PHP Warning #2]"}]}`, KindUnavailable, ""},
		{404, ``, KindNotFound, ""},
		{400, `{"errors":[{"code":35,"message":"a"}]}`, KindBadResponse, ""},
		{400, `{"errors":[{"code":27,"message":"Resource of type \"api\" does not exists."}]}`, KindNotShopRoot, "without /api"},
		// A limit of the shop's or of something in front of it: passing.
		{429, `slow down`, KindUnavailable, "retry later"},
	}
	for _, tt := range tests {
		got := statusError("categories", tt.status, []byte(tt.body))
		if got.Kind != tt.want || !strings.Contains(got.Reason, tt.reason) {
			t.Errorf("statusError(%d, %q) = kind %d, %q; want kind %d, a reason with %q", tt.status, tt.body, got.Kind, got.Reason, tt.want, tt.reason)
		}
		if got.Error() == "" || containsAny(got.Error(), "PHP Warning", "Unauthorized", "not active") {
			t.Errorf("statusError(%d, %q).Error() = %q, want fixed text only", tt.status, tt.body, got.Error())
		}
	}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// budgetOf returns a call's budget of n bytes.
func budgetOf(n int64) *atomic.Int64 {
	var b atomic.Int64
	b.Store(n)
	return &b
}

// A shop's answer of a few bytes per row or per language value would be
// held as a hundred: decoding charges what the rows hold to the call's
// budget and stops when it is spent, and refuses a multilingual field of
// more values than any shop has languages.
func TestDecodeListChargesWhatTheRowsHold(t *testing.T) {
	const size = 1 << 20
	tests := []struct {
		name, body string
		wantErr    error // nil: any error
	}{
		{"empty rows", `{"categories":[` + strings.Repeat(`{},`, size/3) + `{}]}`, errCallBytesSpent},
		{"null rows", `{"categories":[` + strings.Repeat(`null,`, size/5) + `null]}`, errCallBytesSpent},
		{"values of a name", `{"categories":[{"id":1,"name":[` + strings.Repeat(`{},`, size/3) + `{}]}]}`, nil},
	}
	for _, tt := range tests {
		budget := budgetOf(size)
		rows, err := decodeList[Category]([]byte(tt.body), "categories", budget)
		if err == nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
			t.Errorf("decodeList(%s) = %d rows, %v; want error %v", tt.name, len(rows), err, tt.wantErr)
		}
	}
	body := `{"categories":[{"id":1,"name":[` + strings.Repeat(`{"id":1,"value":"x"},`, maxLangValues-1) + `{}]}]}`
	budget := budgetOf(size)
	rows, err := decodeList[Category]([]byte(body), "categories", budget)
	if err != nil || len(rows) != 1 || len(rows[0].Name.ByLang) != maxLangValues {
		t.Fatalf("decodeList(a name of %d values) = %d rows, %v; want 1 row with all of them", maxLangValues, len(rows), err)
	}
	if charged, held := size-budget.Load(), heldByValue(reflect.ValueOf(rows[0])); charged < held {
		t.Errorf("decodeList(a name of %d values) charged %d bytes, want at least the %d its row holds", maxLangValues, charged, held)
	}
}

// An answer the shop makes large is read within a few times its size,
// whatever its shape: a bare array (only an empty one is a list) and a
// list of errors (only the first maxShopErrors are read) were decoded
// whole, at 50 to 80 times their bytes.
func TestHostileAnswersAreReadWithinMemory(t *testing.T) {
	const n = 1 << 18
	for name, body := range map[string]string{
		"bare array of numbers":  "[" + strings.Repeat("1,", n) + "1]",
		"bare array of objects":  "[" + strings.Repeat("{},", n) + "{}]",
		"errors of JSON":         `{"errors":[` + strings.Repeat(`{"code":20},`, n) + `{}]}`,
		"errors of XML":          "<prestashop><errors>" + strings.Repeat("<error><code>20</code></error>", n) + "</errors></prestashop>",
		"rows beyond the budget": `{"categories":[` + strings.Repeat(`{},`, n) + `{}]}`,
	} {
		before := allocatedBytes()
		rows, err := decodeList[Category]([]byte(body), "categories", budgetOf(1<<16))
		codes := shopErrors([]byte(body))
		used := allocatedBytes() - before
		if limit := 8*uint64(len(body)) + 1<<20; used > limit {
			t.Errorf("%s (%d bytes): decoding allocated %d bytes, want at most %d", name, len(body), used, limit)
		}
		if err == nil || len(rows) != 0 {
			t.Errorf("%s: decodeList = %d rows, %v; want it refused", name, len(rows), err)
		}
		if strings.Contains(name, "errors") && len(codes) != maxShopErrors {
			t.Errorf("%s: shopErrors = %d codes, want the first %d", name, len(codes), maxShopErrors)
		}
	}
}

// answerSeeds are list and error answers of the shapes PrestaShop sends
// (docs §3, §4) and of the table tests, and hostile ones.
var answerSeeds = []string{
	`[]`, "\xef\xbb\xbf \n[]", `["categories"]`, `<html>`, `{}`, `null`, `{"categories":null}`, `{"categories":{}}`,
	`{"product_features":[{"id":1,"position":"0","name":"Metal"}]}`,
	`{"product_features":[{"id":1,"position":3,"name":[{"id":1,"value":"Metal"}]}]}`,
	`{"product_features":[{"id":1,"position":"0","name":[{"id":"1","value":"Composition"},{"id":"2","value":"Состав"},{"id":"3","value":"Склад"}]}]}`,
	`{"categories":[{"id":2,"id_parent":"1","level_depth":"1","nb_products_recursive":"19","active":"1","is_root_category":"1","position":"0","name":[{"id":"1","value":"Home"},{"id":"2","value":"Главная"}],"description":[{"id":"1","value":"<p>x<\/p>"}],"associations":{"categories":[{"id":"3"}]}},{"id":9,"id_parent":"3","nb_products_recursive":-1,"active":"1","name":"Tops"}]}`,
	`{"product_feature_values":[{"id":1,"id_feature":"1","custom":"0","value":[{"id":"1","value":"Polyester"}]},{"id":23,"id_feature":2,"custom":1,"value":"120 x 60 cm"}]}`,
	`{"languages":[{"id":1,"name":"English (English)","iso_code":"en","locale":"en-US","language_code":"en-us","active":"1"},{"id":2,"iso_code":"ru","active":0}]}`,
	`{"categories":[{"id":1}]}`, `{"categories":[{"id":1}],"categories":[{"id":2}]}`, `{"categories":[{"id":"x"}]}`,
	`{"categories":[{"id":1.5}]}`, `{"categories":[{"id":1e300}]}`, `{"categories":[{"id":"9223372036854775808"}]}`,
	`{"categories":[{"id":[1,2]}]}`, `{"categories":[{"name":[[]]}]}`, `{"categories":[{}]}trailing`,
	`{"errors":[{"code":22,"message":"x"}]}`, `{"errors":[{"code":"26","message":"a"},{"code":20}]}`, `401 Unauthorized`,
	"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<prestashop><errors><error><code><![CDATA[20]]></code><message><![CDATA[x]]></message></error><error><code><![CDATA[21]]></code></error></errors></prestashop>",
	`<prestashop><errors><error><code> 26 </code></error></errors></prestashop>`, `<a><a><a>`, `<!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>`,
}

// FuzzDecodeList decodes whatever a shop may answer as each resource and as
// an error body: no panic; allocation within a fixed multiple of the
// answer; every row charged to the budget; no field of more values than
// maxLangValues; and, for an id the shop wrote as a plain integer, that
// integer.
func FuzzDecodeList(f *testing.F) {
	for _, s := range answerSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		const budget = 1 << 16
		var rows [4]any
		var budgets [4]*atomic.Int64
		before := allocatedBytes()
		for i, resource := range []string{"languages", "categories", "product_features", "product_feature_values"} {
			budgets[i] = budgetOf(budget)
			switch i {
			case 0:
				rows[i], _ = decodeList[Language](body, resource, budgets[i])
			case 1:
				rows[i], _ = decodeList[Category](body, resource, budgets[i])
			case 2:
				rows[i], _ = decodeList[Feature](body, resource, budgets[i])
			case 3:
				rows[i], _ = decodeList[FeatureValue](body, resource, budgets[i])
			}
		}
		codes := shopErrors(body)
		// What a row holds is charged to its budget; the rest is the
		// decoder's passing work, a few times the answer.
		if used, limit := allocatedBytes()-before, 16*uint64(len(body))+4*budget+1<<20; used > limit {
			t.Fatalf("decoding %d bytes allocated %d bytes, want at most %d", len(body), used, limit)
		}
		for i, r := range rows {
			v := reflect.ValueOf(r)
			if charged, held := budget-budgets[i].Load(), heldByValue(v); charged < held {
				t.Fatalf("decodeList(%q) as %T holds %d bytes, but charged %d", body, r, held, charged)
			}
			for j := range v.Len() {
				if why := wrongRow(v.Index(j)); why != "" {
					t.Fatalf("decodeList(%q) as %T: row %d %s", body, r, j, why)
				}
			}
		}
		_ = codes
	})
}

// wrongRow says what is wrong with a decoded row, or "".
func wrongRow(row reflect.Value) string {
	for i := range row.NumField() {
		if text, ok := row.Field(i).Interface().(Text); ok && len(text.ByLang) > maxLangValues {
			return fmt.Sprintf("has a field of %d values", len(text.ByLang))
		}
	}
	return ""
}

// heldByValue is what v holds in memory: its own size and, behind it,
// strings and slices (to their capacity), computed from the types alone.
func heldByValue(v reflect.Value) int64 {
	switch v.Kind() {
	case reflect.Slice:
		n := int64(v.Cap()) * int64(v.Type().Elem().Size())
		for i := range v.Len() {
			n += heldByValue(v.Index(i)) - int64(v.Type().Elem().Size())
		}
		return n
	case reflect.String:
		return int64(v.Type().Size()) + int64(v.Len())
	case reflect.Struct:
		n := int64(v.Type().Size())
		for i := range v.NumField() {
			n += heldByValue(v.Field(i)) - int64(v.Field(i).Type().Size())
		}
		return n
	}
	return int64(v.Type().Size())
}

// allocatedBytes is what the process has allocated so far.
func allocatedBytes() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// FuzzScalars: an Int the decoder accepts is the integer the shop wrote,
// exactly (a number, a numeric string, "", null or a boolean), never one
// rounded on the way; Bool and String take what Int takes, and Text never
// fails where String succeeds.
func FuzzScalars(f *testing.F) {
	for _, s := range []string{`12`, `"12"`, `"0"`, `0`, `-1`, `""`, `null`, `" 7 "`, `"x"`, `1.5`, `[]`, `1.0`, `1e3`,
		`"1"`, `1`, `true`, `false`, `"Home"`, `"9223372036854775807"`, `1e300`, `-0`, `{}`,
		`9007199254740993`, `1e999999`, `0.5e1`, `"1e3"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var n Int
		if err := json.Unmarshal(b, &n); err == nil {
			if want, ok := exactInteger(b); !ok || n != want {
				t.Fatalf("Int.UnmarshalJSON(%s) = %d, want %d (an integer: %v)", b, n, want, ok)
			}
			var p Bool
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatalf("Bool.UnmarshalJSON(%s) = %v, but Int reads it", b, err)
			}
		}
		var s String
		if err := json.Unmarshal(b, &s); err == nil {
			var text Text
			if err := json.Unmarshal(b, &text); err != nil || !text.IsPlain && !bytes.Equal(bytes.TrimSpace(b), []byte("null")) || text.Plain != string(s) {
				t.Fatalf("Text.UnmarshalJSON(%s) = %+v, %v, want the plain text %q", b, text, err, s)
			}
		}
	})
}

// exactInteger is the integer a JSON value denotes for an Int: a number
// without a fractional part, a string of a decimal integer (spaces
// around), 0 for "" and null, 0 or 1 for a boolean. ok is false for
// anything else, or an integer outside int64.
func exactInteger(b []byte) (Int, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, false
	}
	switch x := v.(type) {
	case nil:
		return 0, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case string:
		s := strings.TrimSpace(x)
		if s == "" {
			return 0, true
		}
		i, err := strconv.ParseInt(s, 10, 64)
		return Int(i), err == nil
	case json.Number:
		if len(x) > 400 { // big.Rat writes out an exponent's digits
			return 0, false
		}
		r, ok := new(big.Rat).SetString(string(x))
		if !ok || !r.IsInt() || !r.Num().IsInt64() {
			return 0, false
		}
		return Int(r.Num().Int64()), true
	}
	return 0, false
}

// TestNotJSONSaysWhatTheAnswerIs: PHP's messages with html_errors on and
// off, the webservice's XML and a page are each named; anything else is
// "not JSON".
func TestNotJSONSaysWhatTheAnswerIs(t *testing.T) {
	const php, xml, page, other = "display_errors", "answered XML", "HTML page", "is not JSON"
	for body, want := range map[string]string{
		"<br />\n<b>Warning</b>:  Undefined array key 1 in <b>/var/www/webservice/dispatcher.php</b> on line <b>59</b><br />\n{}": php,
		"\n<br />\n<b>Fatal error</b>:  Allowed memory size exhausted":                                                            php,
		"Deprecated: Return type of X::count() should be compatible":                                                              php,
		"PHP Notice:  Undefined index: url in /var/www/x.php":                                                                     php,
		// E_RECOVERABLE_ERROR, as PHP 7 and 8 name it, and PHP 5 (PrestaShop 1.7 ran on 5.6).
		"<br />\n<b>Recoverable fatal error</b>:  Object of class X could not be converted to string":                                                       php,
		"Catchable fatal error: Argument 1 passed to X::y() must be an instance of Z":                                                                       php,
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<prestashop xmlns:xlink=\"http://www.w3.org/1999/xlink\">\n<categories>\n</categories>\n</prestashop>": xml,
		"<prestashop><categories></categories></prestashop>":                                                                                                xml,
		"\xef\xbb\xbf<!DOCTYPE html><html><body>Maintenance</body></html>":                                                                                  page,
		"<html><head><title>503 Service Unavailable</title></head></html>":                                                                                  page,
		"Service temporarily unavailable":                                                                                                                   other,
		"Warnings: none":                                                                                                                                    other,
	} {
		if got := notJSON([]byte(body)); !strings.Contains(got, want) {
			t.Errorf("notJSON(%q) = %q, want it to say %q", body, got, want)
		}
	}
}
