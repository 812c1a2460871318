package prestashop

import (
	"encoding/json"
	"strings"
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
		got, err := decodeList[Feature]([]byte(tt.body), "product_features")
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
		noGet       = "no GET permission"
	)
	tests := []struct {
		status int
		body   string
		want   Kind
		reason string // a part of the reason, if it matters
	}{
		{401, `401 Unauthorized`, KindUnauthorized, notReceived},
		{401, `<html><body>Authorization Required</body></html>`, KindUnauthorized, notReceived},
		{401, `{"errors":[{"code":20,"message":"a"},{"code":21,"message":"b"}]}`, KindUnauthorized, rejected},
		{401, `{"errors":[{"code":26,"message":"a"}]}`, KindUnauthorized, noGet},
		// The same errors in XML: the shop read the key all the same.
		{401, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<prestashop xmlns:xlink=\"http://www.w3.org/1999/xlink\">\n<errors>\n<error>\n<code><![CDATA[20]]></code>\n<message><![CDATA[Authentification key is not active]]></message>\n</error>\n<error>\n<code><![CDATA[21]]></code>\n<message><![CDATA[No permission for this authentication key]]></message>\n</error>\n</errors>\n</prestashop>", KindUnauthorized, rejected},
		{401, `<prestashop><errors><error><code><![CDATA[26]]></code><message><![CDATA[Resource of type "categories" is not allowed]]></message></error></errors></prestashop>`, KindUnauthorized, noGet},
		{403, `{"errors":[{"code":132,"message":"a"}]}`, KindForbidden, ""},
		{503, `{"errors":[{"code":22,"message":"a"}]}`, KindDisabled, ""},
		{503, `<prestashop><errors><error><code><![CDATA[22]]></code></error></errors></prestashop>`, KindDisabled, ""},
		{503, `Service Unavailable`, KindUnavailable, ""},
		{500, `{"errors":[{"code":2,"message":"[PHP Warning #2]"}]}`, KindUnavailable, ""},
		{404, ``, KindNotFound, ""},
		{400, `{"errors":[{"code":35,"message":"a"}]}`, KindBadResponse, ""},
		{429, `slow down`, KindBadResponse, ""},
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
