package jsonw

import (
	"encoding/json"
	"testing"
)

// String's output is valid JSON that decodes to what encoding/json's
// encoding of the same string decodes to (invalid UTF-8 included).
func FuzzString(f *testing.F) {
	for _, s := range []string{"", "plain id-1.2_3", `quote " and back\slash`, "tab\tnew\nline\rcr\x00\x1f",
		"Талер 1 ₴", "line\u2028para\u2029", "bad \xff utf-8 \xe2\x82", "<b>&amp;</b>", "emoji 🪙"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := String([]byte("x"), s)
		if got[0] != 'x' {
			t.Fatalf("String(%q) did not append: %q", s, got)
		}
		var decoded string
		if err := json.Unmarshal(got[1:], &decoded); err != nil {
			t.Fatalf("String(%q) = %s, not a JSON string: %v", s, got[1:], err)
		}
		ref, _ := json.Marshal(s)
		var want string
		_ = json.Unmarshal(ref, &want)
		if decoded != want {
			t.Errorf("String(%q) decodes to %q, want %q", s, decoded, want)
		}
	})
}

func TestStringPlainTextIsCopied(t *testing.T) {
	if got := string(String(nil, "item-42")); got != `"item-42"` {
		t.Errorf(`String("item-42") = %s, want "item-42" quoted`, got)
	}
	if got, want := string(String(nil, "a\"b\\c\u2028")), `"a\"b\\c\u2028"`; got != want {
		t.Errorf("String with escapes = %s, want %s", got, want)
	}
}
