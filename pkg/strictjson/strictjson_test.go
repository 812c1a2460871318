package strictjson

import "testing"

func TestCheckObject(t *testing.T) {
	tests := []struct {
		name, body, message, duplicate string
	}{
		{"object", `{"a":"b","n":1}`, "", ""},
		{"white space around", " \n{\"a\":1}\n ", "", ""},
		{"surrogate pair", `{"a":"\ud83d\ude00"}`, "", ""},
		{"replacement character escaped", `{"a":"\ufffd"}`, "", ""},
		{"replacement character literal", "{\"a\":\"\uFFFD\"}", "", ""},
		{"same name in two objects", `{"a":{"x":1},"b":{"x":1}}`, "", ""},
		{"array", `[1]`, "the body must be a JSON object", ""},
		{"empty", ``, "the body must be a JSON object", ""},
		{"null", `null`, "the body must be a JSON object", ""},
		{"trailing object", `{"a":1}{}`, "unexpected data after the JSON object", ""},
		{"trailing garbage", `{"a":1} x`, "unexpected data after the JSON object", ""},
		{"name twice", `{"a":1,"a":1}`, "a property appears twice in the body", "a"},
		{"name twice, once escaped", `{"a":1,"\u0061":2}`, "a property appears twice in the body", "a"},
		{"name twice in a nested object", `{"o":{"x":1,"x":2}}`, "a property appears twice in the body", "x"},
		{"invalid UTF-8", "{\"a\":\"\xff\"}", "the body is not valid UTF-8", ""},
		{"lone high surrogate", `{"a":"\ud800"}`, `a string in the body holds a lone surrogate escape (\ud800 to \udfff not in a pair)`, ""},
		{"lone low surrogate", `{"a":"\udfff"}`, `a string in the body holds a lone surrogate escape (\ud800 to \udfff not in a pair)`, ""},
		{"lone surrogate in a name", `{"\ud800":1}`, `a string in the body holds a lone surrogate escape (\ud800 to \udfff not in a pair)`, ""},
		{"unclosed", `{"a":1`, "the body is not valid JSON", ""},
		{"bare word", `{"a":nope}`, "the body is not valid JSON", ""},
		{"UTF-8 byte order mark", "\xEF\xBB\xBF{\"a\":1}", "the body starts with a byte order mark; send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)", ""},
		{"UTF-16 LE with its mark", "\xFF\xFE{\x00}\x00", "the body is UTF-16 (it starts with a byte order mark); send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)", ""},
		{"UTF-16 BE with its mark", "\xFE\xFF\x00{\x00}", "the body is UTF-16 (it starts with a byte order mark); send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)", ""},
		{"UTF-32 LE with its mark", "\xFF\xFE\x00\x00{\x00\x00\x00}\x00\x00\x00", "the body is UTF-32 (it starts with a byte order mark); send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)", ""},
		{"UTF-32 BE with its mark", "\x00\x00\xFE\xFF\x00\x00\x00{\x00\x00\x00}", "the body is UTF-32 (it starts with a byte order mark); send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)", ""},
		{"UTF-16 LE without a mark", "{\x00}\x00", "the body is UTF-16 or UTF-32 (NUL bytes around its first character); send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)", ""},
		{"UTF-32 BE without a mark", "\x00\x00\x00{\x00\x00\x00}", "the body is UTF-16 or UTF-32 (NUL bytes around its first character); send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)", ""},
		{"one byte", "{", "the body is not valid JSON", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := CheckObject([]byte(tt.body))
			switch {
			case tt.message == "" && f != nil:
				t.Errorf("CheckObject(%q) = %q, want nil", tt.body, f.Message)
			case tt.message != "" && f == nil:
				t.Errorf("CheckObject(%q) = nil, want %q", tt.body, tt.message)
			case f != nil && (f.Message != tt.message || f.Duplicate != tt.duplicate):
				t.Errorf("CheckObject(%q) = %q (duplicate %q), want %q (duplicate %q)",
					tt.body, f.Message, f.Duplicate, tt.message, tt.duplicate)
			}
		})
	}
}

func TestCheckObjectOfAValidBodyDoesNotAllocate(t *testing.T) {
	body := []byte(`{"external_order_id":"order-1","quantity":1}`)
	if n := testing.AllocsPerRun(100, func() { _ = CheckObject(body) }); n != 0 {
		t.Errorf("CheckObject allocates %v times per valid body, want 0", n)
	}
}
