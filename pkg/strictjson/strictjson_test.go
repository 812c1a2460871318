package strictjson

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/coinexport/export/pkg/racedetector"
)

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
		{"empty", ``, "the body is empty: send a JSON object", ""},
		{"white space only", " \r\n\t", "the body is empty: send a JSON object", ""},
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
	if racedetector.Enabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	body := []byte(`{"external_order_id":"order-1","quantity":1}`)
	if n := testing.AllocsPerRun(100, func() { _ = CheckObject(body) }); n != 0 {
		t.Errorf("CheckObject allocates %v times per valid body, want 0", n)
	}
}

// FuzzCheckObject compares CheckObject with a reading of its rules built
// on other parsers (encoding/json and a scan for surrogate escapes), and
// checks that each fault it names is one the body has.
func FuzzCheckObject(f *testing.F) {
	for _, s := range []string{
		`{"a":"b","n":1}`, " \n{\"a\":1}\n ", `{"a":"\ud83d\ude00"}`, `{"a":"\ufffd"}`, "{\"a\":\"\uFFFD\"}",
		`{"a":{"x":1},"b":{"x":1}}`, `[1]`, ``, `null`, `{"a":1}{}`, `{"a":1} x`, `{"a":1,"a":1}`,
		`{"a":1,"\u0061":2}`, `{"o":{"x":1,"x":2}}`, "{\"a\":\"\xff\"}", `{"a":"\ud800"}`, `{"a":"\udfff"}`,
		`{"\ud800":1}`, `{"a":"\\ud800"}`, `{"a":"\ude00\ud83d"}`, `{"\ud800":1,"\udfff":2}`, `{"a":1`, `{"a":nope}`,
		"\xEF\xBB\xBF{\"a\":1}", "\xFF\xFE{\x00}\x00", "\xFE\xFF\x00{\x00}", "\xFF\xFE\x00\x00{\x00\x00\x00}\x00\x00\x00",
		"\x00\x00\xFE\xFF\x00\x00\x00{\x00\x00\x00}", "{\x00}\x00", "\x00\x00\x00{\x00\x00\x00}", "{",
		`{"a/b":1,"a/b":2}`, `{"~":1,"~":2}`, `{"a":[{"b":1,"b":1}]}`, `{"external_order_id":"o","quantity":1e999999999}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fault := CheckObject(body)
		want := utf8.Valid(body) && json.Valid(body) && startsObject(body) &&
			!holdsLoneSurrogate(body) && len(repeatedNames(body)) == 0
		switch {
		case fault == nil && !want:
			t.Fatalf("CheckObject(%q) = nil, want a fault", body)
		case fault == nil:
			return
		case want:
			t.Fatalf("CheckObject(%q) = %q, want nil", body, fault.Message)
		}
		if why := untrue(body, fault); why != "" {
			t.Fatalf("CheckObject(%q) = %q (duplicate %q), but %s", body, fault.Message, fault.Duplicate, why)
		}
	})
}

// untrue says why the fault CheckObject named does not hold of body, or "".
func untrue(body []byte, fault *Fault) string {
	if fault.Duplicate != "" && fault.Message != "a property appears twice in the body" {
		return "a name is given for another fault"
	}
	const useUTF8 = "; send the JSON as UTF-8 without a byte order mark (RFC 8259, 8.1)"
	switch fault.Message {
	case "the body must be a JSON object":
		if startsObject(body) {
			return "the body starts with an object"
		}
	case "the body is empty: send a JSON object":
		if len(bytes.TrimLeft(body, " \t\r\n")) > 0 {
			return "it is not"
		}
	case "unexpected data after the JSON object":
		dec := json.NewDecoder(bytes.NewReader(body))
		var first json.RawMessage
		if err := dec.Decode(&first); err != nil || !startsObject(first) {
			return "the body does not start with a JSON object"
		}
		if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) == 0 {
			return "nothing follows it"
		}
	case "a property appears twice in the body":
		if !repeatedNames(body)[fault.Duplicate] {
			return "that name is not repeated in one object"
		}
	case "the body is not valid UTF-8":
		if utf8.Valid(body) {
			return "it is"
		}
	case `a string in the body holds a lone surrogate escape (\ud800 to \udfff not in a pair)`:
		if !holdsLoneSurrogate(body) {
			return "it holds none"
		}
	case "the body is not valid JSON":
		if json.Valid(body) {
			return "encoding/json reads it"
		}
	case "the body starts with a byte order mark" + useUTF8:
		if !bytes.HasPrefix(body, []byte{0xEF, 0xBB, 0xBF}) {
			return "it starts with none"
		}
	case "the body is UTF-32 (it starts with a byte order mark)" + useUTF8:
		if !bytes.HasPrefix(body, []byte{0xFF, 0xFE, 0, 0}) && !bytes.HasPrefix(body, []byte{0, 0, 0xFE, 0xFF}) {
			return "it starts with no UTF-32 mark"
		}
	case "the body is UTF-16 (it starts with a byte order mark)" + useUTF8:
		if !bytes.HasPrefix(body, []byte{0xFE, 0xFF}) && !bytes.HasPrefix(body, []byte{0xFF, 0xFE}) {
			return "it starts with no UTF-16 mark"
		}
	case "the body is UTF-16 or UTF-32 (NUL bytes around its first character)" + useUTF8:
		if len(body) < 2 || body[0] != 0 && body[1] != 0 {
			return "neither of its first two bytes is NUL"
		}
	default:
		return "the message is not one of the package's"
	}
	return ""
}

// repeatedNames returns the names that appear twice in one object, as
// encoding/json's tokenizer reads them, up to the first syntax error.
func repeatedNames(body []byte) map[string]bool {
	repeated := map[string]bool{}
	dec := json.NewDecoder(bytes.NewReader(body))
	type level struct {
		names    map[string]bool
		wantName bool // the next token of this object is a name
	}
	var stack []*level
	for {
		tok, err := dec.Token()
		if err != nil {
			return repeated // io.EOF, or a syntax error
		}
		top := (*level)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if name, ok := tok.(string); ok && top != nil && top.names != nil && top.wantName {
			if top.names[name] {
				repeated[name] = true
			}
			top.names[name], top.wantName = true, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &level{names: map[string]bool{}, wantName: true})
			continue
		case json.Delim('['):
			stack = append(stack, &level{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the object around it wants a name next.
		if len(stack) > 0 && stack[len(stack)-1].names != nil {
			stack[len(stack)-1].wantName = true
		}
	}
}

// holdsLoneSurrogate reports whether a string of body has a \u escape of
// half a surrogate pair without the other half right beside it.
func holdsLoneSurrogate(body []byte) bool {
	inString := false
	pendingHigh := false // the last escape was a high surrogate
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !inString {
			inString = c == '"'
			continue
		}
		if c == '"' || c != '\\' {
			if pendingHigh {
				return true
			}
			inString = c != '"'
			continue
		}
		if i+1 < len(body) && body[i+1] != 'u' {
			if pendingHigh {
				return true
			}
			i++ // an escape of one character
			continue
		}
		if i+5 >= len(body) {
			return pendingHigh
		}
		code, err := strconv.ParseUint(string(body[i+2:i+6]), 16, 16)
		i += 5
		switch {
		case err != nil:
			return pendingHigh
		case code >= 0xD800 && code <= 0xDBFF:
			if pendingHigh {
				return true
			}
			pendingHigh = true
		case code >= 0xDC00 && code <= 0xDFFF:
			if !pendingHigh {
				return true
			}
			pendingHigh = false
		default:
			if pendingHigh {
				return true
			}
		}
	}
	return pendingHigh
}
